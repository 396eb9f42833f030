"""Filter backends of the API beyond the FilterSets: an ``?ordering=`` that names what it cannot order by is a 400."""

from __future__ import annotations

from rest_framework.exceptions import ValidationError
from rest_framework.filters import OrderingFilter


class StrictOrderingFilter(OrderingFilter):
    """DRF's ordering filter, answering unknown fields with a 400 that lists the allowed ones instead of
    ignoring them."""

    def remove_invalid_fields(self, queryset, fields, view, request):
        valid = super().remove_invalid_fields(queryset, fields, view, request)
        invalid = [field for field in fields if field not in valid]
        if invalid:
            allowed = sorted(name for name, _label in self.get_valid_fields(queryset, view, {"request": request}))
            raise ValidationError(
                {self.ordering_param: [f"Expected fields among {', '.join(allowed)} (- for descending), "
                                       f"got {', '.join(map(repr, invalid))}."]}
            )  # fmt: skip
        return valid
