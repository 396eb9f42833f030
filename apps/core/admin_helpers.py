"""Helpers every admin module shares: scalar-subquery columns, number formats, status badges, read-only admins.

Computed columns are scalar subqueries annotated on the changelist queryset, so a page costs the same number of
queries whatever the number of rows.
"""

from __future__ import annotations

from decimal import Decimal

from django.db.models import DecimalField, F, Func, IntegerField, QuerySet, Subquery, Value
from django.db.models.functions import Coalesce
from django.utils.html import format_html

ZERO = Decimal("0")
DECIMAL = DecimalField(max_digits=20, decimal_places=4)
# Badge colours are classes of static/portal/admin.css: the Content Security Policy blocks style attributes.
GREEN, ORANGE, RED, GREY = "ok", "warn", "bad", "muted"


def _scalar(queryset: QuerySet, function: str, expression) -> Coalesce:
    """``function`` (SUM, AVG) of ``expression`` over ``queryset`` (correlated through OuterRef), 0 when empty.

    One scalar subquery per column rather than Sum() over joins: two joined reverse relations would multiply
    each other's rows, and the subquery keeps the changelist at one query however many rows it shows.
    """
    if isinstance(expression, str):
        expression = F(expression)
    inner = queryset.order_by().annotate(value=Func(expression, function=function, output_field=DECIMAL))
    return Coalesce(Subquery(inner.values("value"), output_field=DECIMAL), Value(ZERO), output_field=DECIMAL)


def sum_of(queryset: QuerySet, expression) -> Coalesce:
    """SUM of ``expression`` over ``queryset`` (correlated through OuterRef) as a scalar subquery."""
    return _scalar(queryset, "SUM", expression)


def avg_of(queryset: QuerySet, expression) -> Coalesce:
    """AVG of ``expression`` over ``queryset`` (correlated through OuterRef) as a scalar subquery."""
    return _scalar(queryset, "AVG", expression)


def count_of(queryset: QuerySet) -> Coalesce:
    """COUNT of ``queryset`` (correlated through OuterRef) as a scalar subquery."""
    inner = queryset.order_by().annotate(n=Func(F("pk"), function="COUNT", output_field=IntegerField()))
    return Coalesce(Subquery(inner.values("n"), output_field=IntegerField()), Value(0))


def number(value, places: int = 2) -> str:
    """A quantity for a column: fixed decimals, no float noise from SQLite sums."""
    return f"{Decimal(value or 0):.{places}f}"


def badge(text: str, colour: str):
    """A coloured status word; ``colour`` is one of GREEN, ORANGE, RED, GREY."""
    return format_html('<strong class="badge badge-{}">{}</strong>', colour, text)


def percent(part, whole) -> str:
    """``part`` of ``whole`` as a whole percentage, "-" when there is no whole."""
    return f"{Decimal(part or 0) * 100 / Decimal(whole):.0f}%" if whole else "-"


class ReadOnlyAdminMixin:
    """Lists, filters and detail pages, but no add, change or delete: for rows only jobs may write."""

    def has_add_permission(self, request, obj=None) -> bool:
        return False

    def has_change_permission(self, request, obj=None) -> bool:
        return False

    def has_delete_permission(self, request, obj=None) -> bool:
        return False
