"""FilterSets of the vdc app, shared by the API viewsets, the HTML list pages and the tests.

``BaseFilterSet`` is the parent of every app's FilterSets: relations filter by id with plain number
filters, so filtering by an id the user cannot see gives an empty list, not a "no such choice" error
that would tell them the object exists.
"""

from __future__ import annotations

import django_filters
from django.db import models
from django.db.models import Q, QuerySet

from apps.vdc.models import VDC, Membership, Project, ProjectQuota

NUMBER = ["exact", "gte", "lte"]
TIME = ["exact", "gte", "lte"]
NAME = ["exact", "icontains"]


class BaseFilterSet(django_filters.FilterSet):
    """Relations filter by id (``?project=3``, ``?project__in=3,4``); ``q`` searches the listed text fields."""

    search_fields: tuple[str, ...] = ()

    q = django_filters.CharFilter(method="search", label="Search")

    class Meta:
        filter_overrides = {
            models.ForeignKey: {"filter_class": django_filters.NumberFilter},
            models.OneToOneField: {"filter_class": django_filters.NumberFilter},
            models.ManyToManyField: {"filter_class": django_filters.NumberFilter},
        }

    def search(self, queryset: QuerySet, name: str, value: str) -> QuerySet:
        value = value.strip()
        if not value or not self.search_fields:
            return queryset
        condition = Q()
        for field in self.search_fields:
            condition |= Q(**{f"{field}__icontains": value})
        return queryset.filter(condition)


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

    vdc = django_filters.NumberFilter(field_name="quotas__vdc", label="Has a quota in VDC (id)")

    class Meta(BaseFilterSet.Meta):
        model = Project
        fields = {"id": ["exact", "in"], "name": NAME, "created_at": TIME, "members": ["exact"]}


class MembershipFilterSet(BaseFilterSet):
    search_fields = ("project__name", "user__username")

    username = django_filters.CharFilter(field_name="user__username")

    class Meta(BaseFilterSet.Meta):
        model = Membership
        fields = {"id": ["exact", "in"], "project": ["exact", "in"], "user": ["exact"], "role": ["exact", "in"],
                  "created_at": TIME}  # fmt: skip


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
            "enforce": ["exact"],
            "created_at": TIME,
            "updated_at": TIME,
        }
