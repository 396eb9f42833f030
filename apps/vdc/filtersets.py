"""FilterSets of the vdc app, shared by the API viewsets, the HTML list pages and the tests (base: apps.core)."""

from __future__ import annotations

import django_filters
from django.db.models import Q, QuerySet

from apps.core.filtersets import NAME, NUMBER, TIME, BaseFilterSet, IdFilter, StrictBooleanFilter
from apps.vdc.models import VDC, CapacityLoan, Membership, Project, ProjectQuota, ProjectSecret, RebalancerSettings


class VDCFilterSet(BaseFilterSet):
    search_fields = ("name", "description")

    class Meta(BaseFilterSet.Meta):
        model = VDC
        fields = {
            "id": ["exact", "in"],
            "name": NAME,
            "total_cpu": NUMBER,
            "total_memory_gib": NUMBER,
            "total_gpu": NUMBER,
            "allow_overcommit": ["exact"],
            "overcommit_ratio": NUMBER,
            "default_queue_policy": ["exact"],
            "cluster_selection_strategy": ["exact"],
            "node_scorer": ["exact"],
            "is_default": ["exact"],
            "enabled": ["exact"],
            "created_at": TIME,
            "updated_at": TIME,
        }


class ProjectFilterSet(BaseFilterSet):
    search_fields = ("name", "description")

    vdc = IdFilter(field_name="quotas__vdc", label="Has a quota in VDC (id)")

    class Meta(BaseFilterSet.Meta):
        model = Project
        fields = {
            "id": ["exact", "in"],
            "name": NAME,
            "created_at": TIME,
            "members": ["exact"],
            "idle_stop_percent": NUMBER,
            "idle_stop_minutes": NUMBER,
        }


class MembershipFilterSet(BaseFilterSet):
    search_fields = ("project__name", "user__username")

    username = django_filters.CharFilter(field_name="user__username")

    class Meta(BaseFilterSet.Meta):
        model = Membership
        fields = {
            "id": ["exact", "in"],
            "project": ["exact", "in"],
            "user": ["exact"],
            "role": ["exact", "in"],
            "created_at": TIME,
        }


class ProjectQuotaFilterSet(BaseFilterSet):
    search_fields = ("project__name", "vdc__name")

    class Meta(BaseFilterSet.Meta):
        model = ProjectQuota
        fields = {
            "id": ["exact", "in"],
            "project": ["exact", "in"],
            "vdc": ["exact", "in"],
            "guaranteed_cpu": NUMBER,
            "limit_cpu": NUMBER,
            "guaranteed_memory_gib": NUMBER,
            "limit_memory_gib": NUMBER,
            "guaranteed_gpu": NUMBER,
            "limit_gpu": NUMBER,
            "max_concurrent_tasks": NUMBER,
            "max_training_tasks": NUMBER,
            "max_inference_tasks": NUMBER,
            "max_dev_env_tasks": NUMBER,
            "priority": NUMBER,
            "weight": NUMBER,
            "enforce": ["exact"],
            "created_at": TIME,
            "updated_at": TIME,
        }


class ProjectSecretFilterSet(BaseFilterSet):
    search_fields = ("name", "description", "project__name")

    class Meta(BaseFilterSet.Meta):
        model = ProjectSecret
        fields = {
            "id": ["exact", "in"],
            "project": ["exact", "in"],
            "name": NAME,
            "created_by": ["exact"],
            "updated_by": ["exact"],
            "created_at": TIME,
            "updated_at": TIME,
        }


class RebalancerSettingsFilterSet(BaseFilterSet):
    search_fields = ("vdc__name",)

    class Meta(BaseFilterSet.Meta):
        model = RebalancerSettings
        fields = {
            "id": ["exact", "in"],
            "vdc": ["exact", "in"],
            "enabled": ["exact"],
            "interval": NUMBER,
            "threshold_percent": NUMBER,
            "max_loan_duration": NUMBER,
            "min_loan_duration": NUMBER,
            "cooldown": NUMBER,
            "loan_billing": ["exact", "in"],
            "loans_low_class_only": ["exact"],
            "last_run_at": TIME,
        }


class CapacityLoanFilterSet(BaseFilterSet):
    """Loans by lender, borrower, either (``project``), VDC, state and time."""

    search_fields = ("lender__name", "borrower__name", "reason", "return_message")

    project = IdFilter(method="lent_or_borrowed", label="Lent or borrowed by project (id)")
    active = StrictBooleanFilter(field_name="returned_at", lookup_expr="isnull", label="Not returned yet")

    class Meta(BaseFilterSet.Meta):
        model = CapacityLoan
        fields = {
            "id": ["exact", "in"],
            "vdc": ["exact", "in"],
            "lender": ["exact", "in"],
            "borrower": ["exact", "in"],
            "gpu": NUMBER,
            "cpu": NUMBER,
            "memory_gib": NUMBER,
            "started_at": TIME,
            "expires_at": TIME,
            "returned_at": TIME,
            "return_reason": ["exact", "in"],
            "used_gpu_hours": NUMBER,
            "accounted_until": TIME,
            "settlement": NAME,
        }

    def lent_or_borrowed(self, queryset: QuerySet, name: str, value) -> QuerySet:
        return queryset.filter(Q(lender_id=value) | Q(borrower_id=value))
