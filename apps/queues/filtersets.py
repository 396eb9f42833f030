"""FilterSet of task queues (API, pages and tests share it)."""

from __future__ import annotations

import django_filters

from apps.core.filtersets import NAME, NUMBER, TIME, BaseFilterSet
from apps.queues.models import TaskQueue


class TaskQueueFilterSet(BaseFilterSet):
    search_fields = ("name", "description")

    vdc_name = django_filters.CharFilter(field_name="vdc__name")

    class Meta(BaseFilterSet.Meta):
        model = TaskQueue
        fields = {
            "id": ["exact", "in"],
            "vdc": ["exact", "in"],
            "name": NAME,
            "priority_class": ["exact", "in"],
            "policy": ["exact", "in"],
            "guaranteed_gpu": NUMBER,
            "max_gpu": NUMBER,
            "weight": NUMBER,
            "min_window": NUMBER,
            "max_expected_duration": NUMBER,
            "default_wall_time": NUMBER,
            "max_wall_time": NUMBER,
            "reserve_after": NUMBER,
            "min_run_before_reclaim": NUMBER,
            "backend_flavour": ["exact"],
            "is_open": ["exact"],
            "created_at": TIME,
            "updated_at": TIME,
        }
