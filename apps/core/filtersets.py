"""The base of every app's FilterSets (shared by the API viewsets, the HTML list pages and the tests).

``BaseFilterSet`` is the parent of every app's FilterSets: relations filter by id with plain id filters
(not choices), so filtering by an id the user cannot see gives an empty list, not a "no such choice" error
that would tell them the object exists. A value a filter cannot take is an error (a 400 in the API),
never silently ignored: booleans are true or false, ``__in`` lists of choices hold only choices, ids are
whole numbers a 64-bit column holds, and times carry offsets the database can store.
"""

from __future__ import annotations

from datetime import UTC, timedelta

import django_filters
from django import forms
from django.core.exceptions import ValidationError
from django.db import models
from django.db.models import Q, QuerySet

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


# What a 64-bit integer column holds. Django answers an integer column's exact and range lookups beyond it
# itself (no match, or all), but hands ids beyond it to the database in relation and ``in`` lookups, which
# cannot take them.
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1


class IdField(forms.IntegerField):
    """A whole number that a 64-bit id column holds; anything else is an error."""

    def __init__(self, **kwargs):
        kwargs.setdefault("min_value", INT64_MIN)
        kwargs.setdefault("max_value", INT64_MAX)
        super().__init__(**kwargs)


class IdFilter(django_filters.NumberFilter):
    """A relation's or row's id (``?project=3``): a whole number a 64-bit column holds, else a 400."""

    field_class = IdField


class IdInFilter(django_filters.BaseInFilter, IdFilter):
    """``field__in=3,4`` of ids: every value a whole number a 64-bit column holds, else a 400."""


class BaseFilterSet(django_filters.FilterSet):
    """Relations filter by id (``?project=3``, ``?project__in=3,4``); ``q`` searches the listed text fields."""

    search_fields: tuple[str, ...] = ()

    q = django_filters.CharFilter(method="search", label="Search")

    class Meta:
        filter_overrides = {
            models.AutoField: {"filter_class": IdFilter},
            models.BigAutoField: {"filter_class": IdFilter},
            models.ForeignKey: {"filter_class": IdFilter},
            models.OneToOneField: {"filter_class": IdFilter},
            models.ManyToManyField: {"filter_class": IdFilter},
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
        filter_class, params = super().filter_for_lookup(field, lookup_type)
        if lookup_type == "in" and issubclass(filter_class, IdFilter):
            return IdInFilter, params
        return filter_class, params

    def search(self, queryset: QuerySet, name: str, value: str) -> QuerySet:
        value = value.strip()
        if not value or not self.search_fields:
            return queryset
        condition = Q()
        for field in self.search_fields:
            condition |= Q(**{f"{field}__icontains": value})
        return queryset.filter(condition)
