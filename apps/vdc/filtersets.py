"""FilterSets of the vdc app, shared by the API viewsets, the HTML list pages and the tests.

``BaseFilterSet`` is the parent of every app's FilterSets: relations filter by id with plain number
filters, so filtering by an id the user cannot see gives an empty list, not a "no such choice" error
that would tell them the object exists. A value a filter cannot take is an error (a 400 in the API),
never silently ignored: booleans are true or false, ``__in`` lists of choices hold only choices, and
times carry offsets the database can store.
"""

from __future__ import annotations

from datetime import UTC, timedelta

import django_filters
from django import forms
from django.core.exceptions import ValidationError
from django.db import models
from django.db.models import Q, QuerySet

from apps.vdc.models import VDC, CapacityLoan, Membership, Project, ProjectQuota, ProjectSecret, RebalancerSettings

NUMBER = ["exact", "gte", "lte"]
TIME = ["exact", "gte", "lte"]
NAME = ["exact", "icontains"]

# PostgreSQL stores time zone offsets up to 15:59; Python parses up to 23:59.
MAX_UTC_OFFSET = timedelta(hours=15, minutes=59)
TRUE_WORDS = ("true", "1")
FALSE_WORDS = ("false", "0")


class BoundedDateTimeField(forms.DateTimeField):
    """An ISO 8601 time whose offset is within ±15:59 and that stays inside years 1 to 9999 in UTC."""

    def to_python(self, value):
        parsed = super().to_python(value)
        if parsed is None or parsed.utcoffset() is None:
            return parsed
        if abs(parsed.utcoffset()) > MAX_UTC_OFFSET:
            raise ValidationError(
                f"Expected a time zone offset between -15:59 and +15:59, got {value!r}.", code="invalid"
            )
        try:
            parsed.astimezone(UTC)
        except OverflowError:
            raise ValidationError(f"Expected a time between the years 1 and 9999, got {value!r}.", code="invalid")
        return parsed


class BoundedDateTimeFilter(django_filters.IsoDateTimeFilter):
    """A time filter (ISO 8601) that refuses what the database cannot compare (see BoundedDateTimeField)."""

    field_class = BoundedDateTimeField


class RawValueInput(forms.TextInput):
    """Hands the query value over as written, so the field (not the widget) decides whether it is valid."""


class StrictBooleanField(forms.Field):
    """``true`` / ``false`` (or ``1`` / ``0``, any case); anything else is an error, empty means no filter."""

    widget = RawValueInput

    def to_python(self, value):
        if isinstance(value, bool) or value is None:
            return value
        word = str(value).strip().lower()
        if word in self.empty_values:
            return None
        if word in TRUE_WORDS:
            return True
        if word in FALSE_WORDS:
            return False
        raise ValidationError(f"Expected true or false, got {value!r}.", code="invalid")


class StrictBooleanFilter(django_filters.BooleanFilter):
    """A boolean filter that answers a value other than true / false with an error instead of ignoring it."""

    field_class = StrictBooleanField


class ChoiceInFilter(django_filters.BaseInFilter, django_filters.ChoiceFilter):
    """``field__in=a,b`` of a field with choices: every value must be one of them."""


class BaseFilterSet(django_filters.FilterSet):
    """Relations filter by id (``?project=3``, ``?project__in=3,4``); ``q`` searches the listed text fields."""

    search_fields: tuple[str, ...] = ()

    q = django_filters.CharFilter(method="search", label="Search")

    class Meta:
        filter_overrides = {
            models.ForeignKey: {"filter_class": django_filters.NumberFilter},
            models.OneToOneField: {"filter_class": django_filters.NumberFilter},
            models.ManyToManyField: {"filter_class": django_filters.NumberFilter},
            models.BooleanField: {"filter_class": StrictBooleanFilter},
            models.DateTimeField: {"filter_class": BoundedDateTimeFilter},
        }

    def __init__(self, data=None, *args, given_only: bool = False, **kwargs):
        if given_only and data is not None:
            # Filters a query string does not name filter nothing; leave them out (see GivenFiltersBackend).
            self.base_filters = {name: f for name, f in self.base_filters.items() if name in data}
        super().__init__(data, *args, **kwargs)

    @classmethod
    def filter_for_lookup(cls, field, lookup_type):
        if lookup_type == "in" and getattr(field, "choices", None):
            return ChoiceInFilter, {"choices": field.choices}
        return super().filter_for_lookup(field, lookup_type)

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
            "weight": NUMBER,
            "enforce": ["exact"],
            "created_at": TIME,
            "updated_at": TIME,
        }


class ProjectSecretFilterSet(BaseFilterSet):
    search_fields = ("name", "description", "project__name")

    class Meta(BaseFilterSet.Meta):
        model = ProjectSecret
        fields = {"id": ["exact", "in"], "project": ["exact", "in"], "name": NAME, "created_by": ["exact"],
                  "updated_by": ["exact"], "created_at": TIME, "updated_at": TIME}  # fmt: skip


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

    project = django_filters.NumberFilter(method="lent_or_borrowed", label="Lent or borrowed by project (id)")
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
