"""Serializer of task queues. Policy and open/closed changes go through the queue services."""

from __future__ import annotations

from rest_framework import serializers

from apps.core.api.common import ModelCleanMixin, service_errors
from apps.queues import services
from apps.queues.models import TaskQueue


class TaskQueueSerializer(ModelCleanMixin, serializers.ModelSerializer):
    vdc_name = serializers.CharField(source="vdc.name", read_only=True)
    rules = serializers.CharField(read_only=True, help_text="The priority class's rules in words")
    waiting_count = serializers.IntegerField(read_only=True, help_text="Tasks waiting in the queue (all projects)")
    active_count = serializers.IntegerField(read_only=True, help_text="Tasks of the queue holding resources")

    class Meta:
        model = TaskQueue
        fields = [
            "id",
            "vdc",
            "vdc_name",
            "name",
            "description",
            "priority_class",
            "rules",
            "policy",
            "guaranteed_gpu",
            "max_gpu",
            "weight",
            "min_window",
            "max_expected_duration",
            "default_wall_time",
            "max_wall_time",
            "reserve_after",
            "min_run_before_reclaim",
            "las_thresholds_gpu_s",
            "backend_flavour",
            "is_open",
            "waiting_count",
            "active_count",
            "created_at",
            "updated_at",
        ]
        read_only_fields = ["created_at", "updated_at"]

    def create(self, validated_data: dict) -> TaskQueue:
        # A queue created without a policy orders its tasks as its VDC's default says.
        validated_data.setdefault("policy", validated_data["vdc"].default_queue_policy)
        return super().create(validated_data)

    def update(self, instance: TaskQueue, validated_data: dict) -> TaskQueue:
        policy = validated_data.pop("policy", None)
        is_open = validated_data.pop("is_open", None)
        instance = super().update(instance, validated_data)
        with service_errors():
            if policy is not None and policy != instance.policy:
                services.set_queue_policy(instance, policy)
            if is_open is not None and is_open != instance.is_open:
                services.set_queue_open(instance, is_open)
        return instance
