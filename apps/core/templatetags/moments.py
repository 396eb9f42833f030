"""How a moment reads everywhere: pages (``{% load moments %}``), the admin, live updates.

One place decides it: local time (``TIME_ZONE``) to the minute, or to the second where a timeline needs it, always
followed by its zone ("2026-11-29 07:30 UTC"). The admin and any datetime a template prints bare use the same
format through the project's format module (``hcsportal/formats``), which takes it from here.
"""

from __future__ import annotations

from datetime import datetime

from django import template
from django.utils import dateformat, timezone

register = template.Library()

# Django date-format strings; ``T`` is the zone's abbreviation.
MINUTES = "Y-m-d H:i T"
SECONDS = "Y-m-d H:i:s T"


def format_moment(value, precision: str = "minutes") -> str:
    """A datetime in the current time zone with its zone ("2026-11-29 07:30 UTC"); ``precision="seconds"`` adds
    the seconds. Empty for none."""
    if not isinstance(value, datetime):
        return ""
    if timezone.is_aware(value):
        value = timezone.localtime(value)
    return dateformat.format(value, SECONDS if precision == "seconds" else MINUTES)


@register.filter(expects_localtime=True)
def moment(value, precision: str = "minutes") -> str:
    """``{{ task.submitted_at|moment }}``, ``{{ event.created_at|moment:"seconds" }}``."""
    return format_moment(value, precision)
