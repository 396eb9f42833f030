"""Admin forms of billing: discount tiers as readable lines instead of JSON (model and fields come from the admin)."""

from __future__ import annotations

import re

from django import forms
from django.core.exceptions import ValidationError

_TIER_RE = re.compile(r"^(\d+(?:\.\d+)?)\s*h?\s*[:\s]\s*(\d+(?:\.\d+)?)\s*%?\Z", re.ASCII | re.IGNORECASE)


def _plain(number: str) -> int | float:
    value = float(number)
    return int(value) if value.is_integer() else value


class DiscountTiersField(forms.CharField):
    """Discount tiers edited as one ``hours: percent`` per line, e.g. ``100h: 10%``."""

    widget = forms.Textarea(attrs={"rows": 3, "cols": 30})

    def __init__(self, **kwargs) -> None:
        kwargs.setdefault("required", False)
        kwargs.setdefault(
            "help_text",
            "One tier per line, increasing hours: accumulated hours and the discount past them, "
            "e.g. 100h: 10% then 1000h: 25%. Empty: no discount.",
        )
        super().__init__(**kwargs)

    def prepare_value(self, value):
        if isinstance(value, list):
            return "\n".join(
                f"{tier.get('from_hours')}h: {tier.get('percent')}%" if isinstance(tier, dict) else str(tier)
                for tier in value
            )
        return value

    def to_python(self, value) -> list[dict]:
        tiers = []
        for number, line in enumerate(super().to_python(value).splitlines(), start=1):
            line = line.strip()
            if not line:
                continue
            match = _TIER_RE.match(line)
            if match is None:
                raise ValidationError(f"Line {number}: expected 'hours: percent', e.g. 100h: 10%; got {line!r}.")
            tiers.append({"from_hours": _plain(match[1]), "percent": _plain(match[2])})
        return tiers

    def has_changed(self, initial, data) -> bool:
        try:
            return self.to_python(data) != (initial or [])
        except ValidationError:
            return True


class PriceRuleAdminForm(forms.ModelForm):
    discount_tiers = DiscountTiersField()
