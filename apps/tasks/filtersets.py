"""FilterSets of tasks and their events (API, pages and tests share them)."""

from __future__ import annotations

import django_filters

from apps.core.filtersets import NAME, NUMBER, TIME, BaseFilterSet, BoundedDateTimeFilter, StrictBooleanFilter
from apps.queues.choices import PriorityClass
from apps.tasks.choices import ACTIVE, WAITING
from apps.tasks.models import (
    IdempotentRequest,
    ServiceLoadSample,
    Sweep,
    Task,
    TaskEvent,
    TaskTemplate,
    TaskUsageSample,
)


class TaskFilterSet(BaseFilterSet):
    search_fields = ("name", "image", "external_id")

    priority_class = django_filters.ChoiceFilter(field_name="queue__priority_class", choices=PriorityClass.choices)
    queue_name = django_filters.CharFilter(field_name="queue__name")
    project_name = django_filters.CharFilter(field_name="project__name")
    vdc_name = django_filters.CharFilter(field_name="vdc__name")
    cluster_name = django_filters.CharFilter(field_name="cluster__name")
    owner_username = django_filters.CharFilter(field_name="owner__username")
    submitted_after = BoundedDateTimeFilter(field_name="submitted_at", lookup_expr="gte")
    submitted_before = BoundedDateTimeFilter(field_name="submitted_at", lookup_expr="lt")
    waiting = StrictBooleanFilter(method="filter_waiting", label="Waiting for the scheduler")
    active = StrictBooleanFilter(method="filter_active", label="Holding resources on a cluster")

    class Meta(BaseFilterSet.Meta):
        model = Task
        fields = {
            "id": ["exact", "in"],
            "uid": ["exact"],
            "name": NAME,
            "project": ["exact", "in"],
            "sweep": ["exact"],
            "metric_name": ["exact"],
            "metric_value": NUMBER,
            "owner": ["exact"],
            "vdc": ["exact", "in"],
            "queue": ["exact", "in"],
            "kind": ["exact", "in"],
            "cpu": NUMBER,
            "memory_gib": NUMBER,
            "gpu_spec": ["exact", "icontains"],
            "instances": NUMBER,
            "elastic_min": NUMBER,
            "elastic_max": NUMBER,
            "scaling": NUMBER,
            "expected_duration": NUMBER,
            "wall_time": NUMBER,
            "exit_code": NUMBER,
            "failure_reason": ["exact", "in"],
            "preemptible": ["exact"],
            "preferred_clusters": ["exact"],
            "image": ["exact", "icontains"],
            "ide_type": ["exact"],
            "framework": ["exact"],
            "model_path": ["exact"],
            "epochs": NUMBER,
            "batch_size": NUMBER,
            "checkpoint_path": ["exact"],
            "tensorboard_dir": ["exact"],
            "max_retries": NUMBER,
            "port": ["exact"],
            "max_tokens": NUMBER,
            "temperature": NUMBER,
            "autoscale_min": NUMBER,
            "autoscale_max": NUMBER,
            "idle_stop_percent": [*NUMBER, "isnull"],
            "idle_stop_minutes": [*NUMBER, "isnull"],
            "autoscale_cpu_percent": NUMBER,
            "autoscale_gpu_percent": NUMBER,
            "autoscale_memory_percent": NUMBER,
            "autoscale_rps": NUMBER,
            "autoscale_concurrency": NUMBER,
            "autoscale_latency_ms": [*NUMBER, "isnull"],
            "autoscale_predictive": ["exact"],
            "autoscale_desired": NUMBER,
            "scale_to_zero_after_s": [*NUMBER, "isnull"],
            "last_cold_start_s": [*NUMBER, "isnull"],
            "readiness_path": ["exact"],
            "ready_replicas": [*NUMBER, "isnull"],
            "status": ["exact", "in"],
            "pending_reason": ["exact"],
            "queue_position": NUMBER,
            "estimated_start": TIME,
            "cluster": ["exact", "in", "isnull"],
            "allocated_gpu": NUMBER,
            "held_cpu": NUMBER,
            "held_memory_gib": NUMBER,
            "replicas": NUMBER,
            "external_id": ["exact"],
            "attempt": NUMBER,
            "preemption_count": NUMBER,
            "lost_gpu_seconds": NUMBER,
            "window": NUMBER,
            "submitted_at": TIME,
            "started_at": TIME,
            "finished_at": TIME,
            "updated_at": TIME,
        }

    def filter_waiting(self, queryset, name, value):
        return queryset.filter(status__in=WAITING) if value else queryset.exclude(status__in=WAITING)

    def filter_active(self, queryset, name, value):
        return queryset.filter(status__in=ACTIVE) if value else queryset.exclude(status__in=ACTIVE)


class TaskEventFilterSet(BaseFilterSet):
    search_fields = ("message",)

    class Meta(BaseFilterSet.Meta):
        model = TaskEvent
        fields = {
            "id": ["exact", "in"],
            "task": ["exact", "in"],
            "kind": ["exact", "in"],
            "from_status": ["exact"],
            "to_status": ["exact"],
            "actor": ["exact"],
            "created_at": TIME,
        }


class ServiceLoadSampleFilterSet(BaseFilterSet):
    search_fields = ("task__name",)

    class Meta(BaseFilterSet.Meta):
        model = ServiceLoadSample
        fields = {
            "id": ["exact", "in"],
            "task": ["exact", "in"],
            "start": TIME,
            "rps": [*NUMBER, "isnull"],
            "gpu_percent": [*NUMBER, "isnull"],
            "samples": NUMBER,
            "forecast_rps": [*NUMBER, "isnull"],
            "forecast_method": ["exact"],
        }


class TaskUsageSampleFilterSet(BaseFilterSet):
    """For the admin and the tests; the API serves a task's samples through its utilisation action."""

    search_fields = ("task__name",)

    class Meta(BaseFilterSet.Meta):
        model = TaskUsageSample
        fields = {
            "id": ["exact", "in"],
            "task": ["exact", "in"],
            "at": TIME,
            "gpu_percent": [*NUMBER, "isnull"],
            "vram_used_gib": [*NUMBER, "isnull"],
            "vram_gib": [*NUMBER, "isnull"],
            "cards": NUMBER,
        }


class IdempotentRequestFilterSet(BaseFilterSet):
    """For the admin and the tests; remembered answers are not exposed through the API."""

    search_fields = ("key",)

    class Meta(BaseFilterSet.Meta):
        model = IdempotentRequest
        fields = {
            "id": ["exact", "in"],
            "user": ["exact"],
            "key": ["exact"],
            "status_code": ["exact"],
            "created_at": TIME,
        }


class SweepFilterSet(BaseFilterSet):
    search_fields = ("name",)

    project_name = django_filters.CharFilter(field_name="project__name")

    class Meta(BaseFilterSet.Meta):
        model = Sweep
        fields = {
            "id": ["exact", "in"],
            "name": NAME,
            "project": ["exact", "in"],
            "created_by": ["exact"],
            "goal": ["exact"],
            "created_at": TIME,
        }


class TaskTemplateFilterSet(BaseFilterSet):
    search_fields = ("name", "description")

    project_name = django_filters.CharFilter(field_name="project__name")
    created_by_username = django_filters.CharFilter(field_name="created_by__username")

    class Meta(BaseFilterSet.Meta):
        model = TaskTemplate
        fields = {
            "id": ["exact", "in"],
            "name": NAME,
            "project": ["exact", "in"],
            "created_by": ["exact"],
            "created_at": TIME,
            "updated_at": TIME,
        }
