"""FilterSets of the control plane's records (API and tests share them)."""

from __future__ import annotations

import django_filters

from apps.control.models import BackendObject, CheckpointStore, Installation
from apps.core.filtersets import NAME, NUMBER, TIME, BaseFilterSet, IdFilter


class BackendObjectFilterSet(BaseFilterSet):
    search_fields = ("name", "external_id", "message")

    vdc = IdFilter(field_name="cluster__vdc")
    cancelling = django_filters.BooleanFilter(field_name="cancel_requested_at", lookup_expr="isnull", exclude=True)

    class Meta(BaseFilterSet.Meta):
        model = BackendObject
        fields = {
            "id": ["exact", "in"],
            "cluster": ["exact", "in"],
            "task": ["exact", "in"],
            "task_uid": ["exact"],
            "attempt": NUMBER,
            "name": NAME,
            "external_id": ["exact"],
            "backend_uid": ["exact"],
            "launch_token": ["exact"],
            "state": ["exact", "in"],
            "replicas": NUMBER,
            "phase": ["exact", "in"],
            "lease_until": TIME,
            "submit_attempts": NUMBER,
            "cancel_requested_at": TIME,
            "created_at": TIME,
            "submitted_at": TIME,
            "observed_at": TIME,
            "ended_at": TIME,
        }


class InstallationFilterSet(BaseFilterSet):
    class Meta(BaseFilterSet.Meta):
        model = Installation
        fields = {"id": ["exact"], "uid": ["exact"], "created_at": TIME}


class CheckpointStoreFilterSet(BaseFilterSet):
    search_fields = ("project", "message")

    class Meta(BaseFilterSet.Meta):
        model = CheckpointStore
        fields = {
            "id": ["exact", "in"],
            "cluster": ["exact", "in"],
            "task": ["exact", "in"],
            "task_uid": ["exact"],
            "project": ["exact"],
            "failed_at": TIME,
            "created_at": TIME,
        }
