"""How money and metered usage read everywhere: pages (``{% load money %}``), the admin, the API's text, alerts.

One place decides it (docs/billing.md#how-amounts-read): an amount is rounded half up to cents, thousands are
grouped and the currency follows ("1,234.57 CNY"); a usage quantity is shown to two decimals of its unit
("16.30 GPU-hours") while the ledger and invoices keep the stored precision behind it.
"""

from __future__ import annotations

from decimal import ROUND_HALF_UP, Decimal, InvalidOperation

from django import template

register = template.Library()

CENTS = Decimal("0.01")
USAGE_DECIMALS = Decimal("0.01")
NONE = "—"


def _decimal(value) -> Decimal | None:
    if value is None or value == "":
        return None
    try:
        return Decimal(str(value))
    except InvalidOperation:
        return None


def format_money(amount, currency: str | None = "") -> str:
    """An amount as people read it: cents, thousands grouped, its currency ("1,234.57 CNY"); "—" for none."""
    value = _decimal(amount)
    if value is None:
        return NONE
    text = f"{value.quantize(CENTS, rounding=ROUND_HALF_UP):,}"
    return f"{text} {currency}" if currency else text


def format_quantity(quantity, unit: str = "") -> str:
    """A metered quantity to two decimals of its unit, thousands grouped ("1,016.30 GPU-hours")."""
    value = _decimal(quantity)
    if value is None:
        return NONE
    text = f"{value.quantize(USAGE_DECIMALS, rounding=ROUND_HALF_UP):,}"
    return f"{text} {unit}" if unit else text


@register.filter(name="money")
def money_filter(amount, currency: str | None = "") -> str:
    """``{{ amount|money:currency }}``."""
    return format_money(amount, currency)


@register.filter(name="quantity")
def quantity_filter(quantity, unit: str = "") -> str:
    """``{{ quantity|quantity:unit }}``."""
    return format_quantity(quantity, unit)
