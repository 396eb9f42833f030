"""Serializers of clusters, nodes, devices and GPU models. Cluster credentials are write-only."""

from __future__ import annotations

import copy

from rest_framework import serializers

from apps.clusters.choices import NodeStatus
from apps.clusters.hostpaths import MAX_PATH_LENGTH
from apps.clusters.models import (
    MAX_HOST_PATH_PREFIXES,
    CapacityReservation,
    Cluster,
    Device,
    GPUModel,
    Node,
    validate_host_path_prefixes,
    validate_namespaces,
)
from apps.core.api.common import ModelCleanMixin, service_errors


class GPUModelSerializer(ModelCleanMixin, serializers.ModelSerializer):
    class Meta:
        model = GPUModel
        fields = [
            "id",
            "name",
            "vendor",
            "aliases",
            "vram_gib",
            "tflops_fp16",
            "tflops_fp32",
            "exchange_rate",
            "memory_bandwidth_gbps",
            "resource_name",
            "visible_devices_env",
            "slurm_gres_type",
            "shareable",
            "enabled",
            "partition",
            "parent_model",
            "time_slice_replicas",
        ]
        # MIG profile and time-slice rows are made by the seed and by device sharing declarations (docs/engine.md).
        read_only_fields = ["partition", "parent_model", "time_slice_replicas"]


class ClusterSerializer(ModelCleanMixin, serializers.ModelSerializer):
    """A cluster. ``credentials`` (e.g. ``{"token": "..."}``) is encrypted on write and never returned."""

    credentials = serializers.JSONField(
        write_only=True, required=False, help_text='Secrets for the backend, e.g. {"token": "..."}; never returned'
    )
    allowed_host_paths = serializers.ListField(
        child=serializers.CharField(max_length=MAX_PATH_LENGTH),
        max_length=MAX_HOST_PATH_PREFIXES,
        required=False,
        validators=[validate_host_path_prefixes],
        help_text="Node directories tasks may mount as host path volumes (that path or below it), e.g. /data",
    )
    webhook_namespaces = serializers.ListField(
        child=serializers.CharField(max_length=63),
        required=False,
        validators=[validate_namespaces],
        help_text="Kubernetes: namespaces whose pods the admission webhook injects the vendor runtime into, "
        "whoever creates them; empty: none",
    )
    has_credentials = serializers.BooleanField(read_only=True)
    is_schedulable = serializers.BooleanField(read_only=True)
    vdc_name = serializers.CharField(source="vdc.name", read_only=True)

    class Meta:
        model = Cluster
        fields = [
            "id",
            "vdc",
            "vdc_name",
            "name",
            "description",
            "cluster_type",
            "endpoint",
            "api_version",
            "credentials",
            "has_credentials",
            "namespace",
            "status",
            "status_message",
            "last_heartbeat",
            "missed_heartbeats",
            "unknown_grace_s",
            "enabled",
            "is_schedulable",
            "priority",
            "weight",
            "cost_weight",
            "labels",
            "max_tasks_per_user",
            "max_total_tasks",
            "allowed_host_paths",
            "checkpoint_root",
            "checkpoint_storage_class",
            "checkpoint_size_gib",
            "webhook_namespaces",
            "project_isolation",
            "isolation_prefix",
            "created_at",
            "updated_at",
        ]
        read_only_fields = [
            "status",
            "status_message",
            "last_heartbeat",
            "missed_heartbeats",
            "enabled",
            "created_at",
            "updated_at",
        ]

    def validate_credentials(self, value):
        if not isinstance(value, dict) or not value:
            raise serializers.ValidationError('Expected an object of secrets, e.g. {"token": "..."}.')
        return value

    def create(self, validated_data: dict) -> Cluster:
        credentials = validated_data.pop("credentials", None)
        cluster = Cluster(**validated_data)
        if credentials is not None:
            cluster.set_credentials(credentials)
        cluster.save()
        return cluster

    def update(self, instance: Cluster, validated_data: dict) -> Cluster:
        credentials = validated_data.pop("credentials", None)
        if credentials is not None:
            instance.set_credentials(credentials)
        return super().update(instance, validated_data)


class ClusterHealthSerializer(serializers.Serializer):
    id = serializers.IntegerField()
    name = serializers.CharField()
    status = serializers.CharField()
    enabled = serializers.BooleanField()
    is_schedulable = serializers.BooleanField()
    missed_heartbeats = serializers.IntegerField()
    last_heartbeat = serializers.DateTimeField(allow_null=True)
    message = serializers.CharField(source="status_message")


class MaintenanceSerializer(serializers.Serializer):
    on = serializers.BooleanField(default=True, help_text="true: into maintenance; false: back to healthy")


class NodeSerializer(ModelCleanMixin, serializers.ModelSerializer):
    cluster_name = serializers.CharField(source="cluster.name", read_only=True)
    device_count = serializers.IntegerField(read_only=True)
    effective_status = serializers.ChoiceField(
        choices=NodeStatus.choices,
        read_only=True,
        help_text="What scheduling obeys: the worse of status and backend_state",
    )
    backend_state = serializers.ChoiceField(
        choices=NodeStatus.choices,
        allow_blank=True,
        read_only=True,
        help_text="The node's state as its backend reports it; empty until the backend has said",
    )

    class Meta:
        model = Node
        fields = [
            "id",
            "cluster",
            "cluster_name",
            "name",
            "cpu",
            "memory_gib",
            "labels",
            "status",
            "backend_state",
            "backend_reason",
            "effective_status",
            "health_score",
            "last_report",
            "agent_message",
            "device_count",
        ]
        read_only_fields = ["backend_state", "backend_reason"]


class DeviceSerializer(ModelCleanMixin, serializers.ModelSerializer):
    node_name = serializers.CharField(source="node.name", read_only=True)
    cluster = serializers.IntegerField(source="node.cluster_id", read_only=True)
    gpu_model_name = serializers.CharField(source="gpu_model.name", read_only=True)
    vendor = serializers.CharField(source="gpu_model.vendor", read_only=True)

    class Meta:
        model = Device
        fields = [
            "id",
            "node",
            "node_name",
            "cluster",
            "index",
            "gpu_model",
            "gpu_model_name",
            "vendor",
            "uuid",
            "vram_gib",
            "health_score",
            "numa_node",
            "pci_bus_id",
            "links",
            "vram_used_gib",
            "utilization",
            "temperature_c",
            "ecc_errors",
            "xid_errors",
            "health_reason",
            "reported_name",
            "driver_version",
            "runtime_version",
            "memory_bandwidth_gbps",
            "tflops_fp16",
            "tflops_fp32",
            "figures_source",
            "interconnect",
            "parent",
            "slot",
            "sharing",
            "time_slice_replicas",
        ]
        # The fingerprint and its verdict come from the node agent's reports only.
        read_only_fields = [
            "health_reason",
            "reported_name",
            "driver_version",
            "runtime_version",
            "memory_bandwidth_gbps",
            "tflops_fp16",
            "tflops_fp32",
            "figures_source",
            "interconnect",
        ]


class CapacityReservationSerializer(ModelCleanMixin, serializers.ModelSerializer):
    """A capacity reservation: a window in which the scheduler leaves capacity free (docs/admin.md)."""

    vdc_name = serializers.CharField(source="vdc.name", read_only=True)
    cluster_name = serializers.CharField(source="cluster.name", read_only=True, allow_null=True)
    gpu_model_name = serializers.CharField(source="gpu_model.name", read_only=True, allow_null=True)
    holds = serializers.CharField(source="held_summary", read_only=True, help_text="What is held, in words")
    maintenance = serializers.BooleanField(
        source="is_maintenance", read_only=True, help_text="True when no project may use it"
    )

    class Meta:
        model = CapacityReservation
        fields = [
            "id",
            "vdc",
            "vdc_name",
            "cluster",
            "cluster_name",
            "name",
            "reason",
            "starts_at",
            "ends_at",
            "nodes",
            "gpu_model",
            "gpu_model_name",
            "cards",
            "gpu",
            "cpu",
            "memory_gib",
            "projects",
            "maintenance",
            "holds",
            "lead_time",
            "preempt_at_start",
            "created_at",
            "updated_at",
        ]
        read_only_fields = ["created_at", "updated_at"]

    def validate(self, attrs: dict) -> dict:
        attrs = super().validate(attrs)
        candidate = copy.copy(self.instance) if self.instance is not None else CapacityReservation()
        for name, value in attrs.items():
            if name not in ("nodes", "projects"):
                setattr(candidate, name, value)
        if "nodes" in attrs:
            nodes = attrs["nodes"]
        else:
            nodes = list(self.instance.nodes.all()) if self.instance is not None else []
        with service_errors():
            candidate.clean_nodes(nodes)
        return attrs
