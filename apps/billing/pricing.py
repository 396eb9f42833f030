"""Price arithmetic in Decimal: hours of an interval, discount tiers, rounding. No database access."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import timedelta
from decimal import ROUND_HALF_UP, Decimal

from apps.billing.templatetags.money import format_money

ZERO = Decimal("0")
HOUR_US = Decimal(3_600_000_000)
QUANTITY = Decimal("0.000001")
MONEY = Decimal("0.0001")


def hours(delta: timedelta) -> Decimal:
    """The exact length of an interval in hours (microsecond resolution, no float on the way)."""
    return Decimal(delta // timedelta(microseconds=1)) / HOUR_US


def quantity(units: Decimal, delta: timedelta) -> Decimal:
    """Units x hours, as stored on a usage record."""
    return (units * hours(delta)).quantize(QUANTITY, rounding=ROUND_HALF_UP)


def money(amount: Decimal) -> Decimal:
    return amount.quantize(MONEY, rounding=ROUND_HALF_UP)


def format_totals(pairs: Iterable[tuple[Decimal, str]]) -> str:
    """Amounts summed per currency ("19.82 CNY" or "19.82 CNY + 5.00 EUR"); "nothing" for none."""
    totals: dict[str, Decimal] = {}
    for amount, currency in pairs:
        totals[currency] = totals.get(currency, ZERO) + Decimal(amount)
    return " + ".join(format_money(v, c) for c, v in sorted(totals.items())) or "nothing"


def tiered_cost(
    price_per_hour: Decimal, amount: Decimal, accumulated: Decimal, tiers: Iterable[Mapping] = ()
) -> Decimal:
    """The cost of ``amount`` unit-hours when the project already used ``accumulated`` of the same resource.

    Each tier ``{"from_hours": h, "percent": p}`` discounts by p% the unit-hours past h; the part of
    ``amount`` that crosses a boundary is split there, so each part gets the discount of its own tier.
    """
    bounds = sorted((Decimal(str(t["from_hours"])), Decimal(str(t["percent"]))) for t in tiers)
    start, end = accumulated, accumulated + amount
    edges = [(ZERO, ZERO), *bounds]
    total = ZERO
    for i, (low, percent) in enumerate(edges):
        high = edges[i + 1][0] if i + 1 < len(edges) else None
        part_start = max(start, low)
        part_end = end if high is None else min(end, high)
        if part_end > part_start:
            total += (part_end - part_start) * price_per_hour * (1 - percent / 100)
    return money(total)
