"""Serializers of the control plane's records (read-only: only the reconciler writes them)."""

from rest_framework import serializers

from apps.control.models import BackendObject


class BackendObjectSerializer(serializers.ModelSerializer):
    cluster_name = serializers.CharField(source="cluster.name", read_only=True)
    wanted = serializers.BooleanField(read_only=True, help_text="Its task is active on this cluster in this attempt")

    class Meta:
        model = BackendObject
        fields = [
            "id", "cluster", "cluster_name", "task", "task_uid", "attempt", "name", "external_id", "state", "wanted",
            "devices", "replicas", "phase", "message", "lease_until", "submit_attempts", "cancel_requested_at",
            "created_at", "submitted_at", "observed_at", "ended_at",
        ]  # fmt: skip
        read_only_fields = fields
