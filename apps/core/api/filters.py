"""Filter backends of the API beyond the FilterSets: an ``?ordering=`` that names what it cannot order by is a 400,
and so is a query parameter a list does not know; a FilterSet is built with only the filters a request uses."""

from __future__ import annotations

from django_filters.rest_framework import DjangoFilterBackend
from rest_framework.exceptions import ValidationError
from rest_framework.filters import BaseFilterBackend, OrderingFilter, SearchFilter
from rest_framework.settings import api_settings


class GivenFiltersBackend(DjangoFilterBackend):
    """django-filter's backend, building each request's FilterSet with the filters its query string names only.

    A filter without a value filters nothing, but a FilterSet copies every filter and builds and validates a
    form field for each on every request: tens of milliseconds for the task list's 150 filters.
    """

    def get_filterset_kwargs(self, request, queryset, view) -> dict:
        return {**super().get_filterset_kwargs(request, queryset, view), "given_only": True}

    def to_html(self, request, queryset, view):
        # The browsable API's filter form offers every filter.
        return DjangoFilterBackend().to_html(request, queryset, view)


class StrictOrderingFilter(OrderingFilter):
    """DRF's ordering filter, answering unknown fields with a 400 that lists the allowed ones instead of
    ignoring them."""

    def remove_invalid_fields(self, queryset, fields, view, request):
        valid = super().remove_invalid_fields(queryset, fields, view, request)
        invalid = [field for field in fields if field not in valid]
        if invalid:
            allowed = sorted(name for name, _label in self.get_valid_fields(queryset, view, {"request": request}))
            raise ValidationError(
                {
                    self.ordering_param: [
                        f"Expected fields among {', '.join(allowed)} (- for descending), "
                        f"got {', '.join(map(repr, invalid))}."
                    ]
                }
            )
        return valid


class KnownQueryParamsFilter(BaseFilterBackend):
    """A list answers a query parameter none of its filters, its ordering, search, pagination or format takes
    with a 400 that names it, instead of ignoring it: a misspelt filter (``?name__startswith=``, ``?page_size=``)
    would otherwise list everything. A view that reads more parameters itself names them in
    ``extra_query_params``. Detail views are left alone (their filters only scope the lookup)."""

    def filter_queryset(self, request, queryset, view):
        if getattr(view, "detail", False):
            return queryset
        unknown = sorted(set(request.query_params) - known_query_params(view, queryset))
        if unknown:
            raise ValidationError(
                {
                    name: [
                        "Unknown query parameter: this list has no filter of that name (its parameters are in "
                        "/api/schema/)."
                    ]
                    for name in unknown
                }
            )
        return queryset


def known_query_params(view, queryset) -> set[str]:
    """Every query parameter a list view takes."""
    known = {api_settings.URL_FORMAT_OVERRIDE, *getattr(view, "extra_query_params", ())}
    for backend_class in view.filter_backends:
        backend = backend_class()
        if isinstance(backend, DjangoFilterBackend):
            filterset_class = backend.get_filterset_class(view, queryset)
            known.update(filterset_class.base_filters if filterset_class else ())
        elif isinstance(backend, OrderingFilter):
            known.add(backend.ordering_param)
        elif isinstance(backend, SearchFilter):
            known.add(backend.search_param)
    paginator = getattr(view, "paginator", None)
    if paginator is not None:
        known.update(parameter["name"] for parameter in paginator.get_schema_operation_parameters(view))
    return known
