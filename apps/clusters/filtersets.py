"""FilterSets of clusters, nodes, devices and the GPU model catalog (API, pages and tests share them)."""

from __future__ import annotations

import django_filters
from django.utils import timezone

from apps.clusters.models import AgentToken, CapacityReservation, Cluster, Device, GPUModel, Node
from apps.core.filtersets import NAME, NUMBER, TIME, BaseFilterSet, IdFilter, StrictBooleanFilter


class GPUModelFilterSet(BaseFilterSet):
    search_fields = ("name", "resource_name", "slurm_gres_type")

    class Meta(BaseFilterSet.Meta):
        model = GPUModel
        fields = {
            "id": ["exact", "in"],
            "name": NAME,
            "vendor": ["exact", "in"],
            "vram_gib": NUMBER,
            "tflops_fp16": NUMBER,
            "tflops_fp32": NUMBER,
            "exchange_rate": [*NUMBER, "isnull"],
            "memory_bandwidth_gbps": NUMBER,
            "resource_name": ["exact"],
            "visible_devices_env": ["exact"],
            "slurm_gres_type": ["exact"],
            "shareable": ["exact"],
            "enabled": ["exact"],
            "partition": ["exact", "in"],
            "parent_model": ["exact", "in", "isnull"],
            "time_slice_replicas": ["exact"],
        }


class ClusterFilterSet(BaseFilterSet):
    search_fields = ("name", "description", "endpoint", "namespace")

    vdc_name = django_filters.CharFilter(field_name="vdc__name")
    schedulable = StrictBooleanFilter(method="filter_schedulable")

    class Meta(BaseFilterSet.Meta):
        model = Cluster
        fields = {
            "id": ["exact", "in"],
            "vdc": ["exact", "in"],
            "name": NAME,
            "cluster_type": ["exact", "in"],
            "endpoint": ["exact", "icontains"],
            "api_version": ["exact"],
            "namespace": ["exact"],
            "status": ["exact", "in"],
            "last_heartbeat": TIME,
            "missed_heartbeats": NUMBER,
            "unknown_grace_s": NUMBER,
            "enabled": ["exact"],
            "priority": NUMBER,
            "weight": NUMBER,
            "cost_weight": NUMBER,
            "max_tasks_per_user": NUMBER,
            "max_total_tasks": NUMBER,
            "checkpoint_root": ["exact"],
            "checkpoint_storage_class": ["exact"],
            "checkpoint_size_gib": NUMBER,
            "project_isolation": ["exact", "in"],
            "isolation_prefix": ["exact"],
            "created_at": TIME,
            "updated_at": TIME,
        }

    def filter_schedulable(self, queryset, name, value):
        schedulable = Cluster.objects.schedulable().values("pk")
        return queryset.filter(pk__in=schedulable) if value else queryset.exclude(pk__in=schedulable)


class NodeFilterSet(BaseFilterSet):
    search_fields = ("name", "agent_message", "backend_reason")

    vdc = IdFilter(field_name="cluster__vdc")

    class Meta(BaseFilterSet.Meta):
        model = Node
        fields = {
            "id": ["exact", "in"],
            "cluster": ["exact", "in"],
            "name": NAME,
            "cpu": NUMBER,
            "memory_gib": NUMBER,
            "status": ["exact", "in"],
            "backend_state": ["exact", "in"],
            "health_score": NUMBER,
            "last_report": TIME,
        }


class DeviceFilterSet(BaseFilterSet):
    search_fields = ("uuid", "pci_bus_id", "node__name", "gpu_model__name")

    cluster = IdFilter(field_name="node__cluster")
    model = django_filters.CharFilter(field_name="gpu_model__name", lookup_expr="iexact", label="GPU model name")
    vendor = django_filters.ChoiceFilter(
        field_name="gpu_model__vendor", choices=GPUModel._meta.get_field("vendor").choices
    )

    class Meta(BaseFilterSet.Meta):
        model = Device
        fields = {
            "id": ["exact", "in"],
            "node": ["exact", "in"],
            "index": ["exact"],
            "gpu_model": ["exact", "in"],
            "uuid": ["exact"],
            "vram_gib": NUMBER,
            "health_score": NUMBER,
            "numa_node": ["exact"],
            "pci_bus_id": ["exact"],
            "vram_used_gib": NUMBER,
            "utilization": NUMBER,
            "temperature_c": NUMBER,
            "ecc_errors": NUMBER,
            "xid_errors": NUMBER,
            "health_reason": ["exact", "icontains"],
            "reported_name": ["exact", "icontains"],
            "driver_version": ["exact"],
            "runtime_version": ["exact"],
            "memory_bandwidth_gbps": NUMBER,
            "tflops_fp16": NUMBER,
            "tflops_fp32": NUMBER,
            "figures_source": ["exact"],
            "interconnect": ["exact"],
            "missing_since": [*TIME, "isnull"],
            "parent": ["exact", "in", "isnull"],
            "slot": ["exact"],
            "sharing": ["exact", "in"],
            "time_slice_replicas": ["exact"],
        }


class AgentTokenFilterSet(BaseFilterSet):
    """For the admin's and pages' lists; node agent tokens are not exposed through the API."""

    search_fields = ("name", "node_name")

    class Meta(BaseFilterSet.Meta):
        model = AgentToken
        fields = {
            "id": ["exact", "in"],
            "cluster": ["exact", "in"],
            "node_name": NAME,
            "name": NAME,
            "created_at": TIME,
            "last_used": TIME,
            "revoked": ["exact"],
        }


class CapacityReservationFilterSet(BaseFilterSet):
    search_fields = ("name", "reason")

    window = django_filters.ChoiceFilter(
        choices=(("current", "current"), ("upcoming", "upcoming"), ("ended", "ended"), ("active", "not ended")),
        method="filter_window",
        label="current, upcoming, ended, or active (current or upcoming)",
    )
    nodes = IdFilter(field_name="nodes", label="Holds this node (id)")
    projects = IdFilter(field_name="projects", label="May be used by this project (id)")
    maintenance = StrictBooleanFilter(
        field_name="projects", lookup_expr="isnull", distinct=True, label="Nobody may use it"
    )

    class Meta(BaseFilterSet.Meta):
        model = CapacityReservation
        fields = {
            "id": ["exact", "in"],
            "vdc": ["exact", "in"],
            "cluster": ["exact", "in", "isnull"],
            "name": NAME,
            "reason": ["exact", "icontains"],
            "starts_at": TIME,
            "ends_at": TIME,
            "gpu_model": ["exact", "isnull"],
            "cards": NUMBER,
            "gpu": NUMBER,
            "cpu": NUMBER,
            "memory_gib": NUMBER,
            "lead_time": ["exact", "gte", "lte"],
            "preempt_at_start": ["exact"],
            "created_at": TIME,
            "updated_at": TIME,
        }

    def filter_window(self, queryset, name, value):
        return queryset.in_window(value, timezone.now())
