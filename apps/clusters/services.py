"""Cluster-side services: the GPU catalog as the parser sees it, and GPU spec validation."""

from __future__ import annotations

from django.core.exceptions import ValidationError

from apps.clusters.gpuspec import Catalog, GPURequest, GPUSpecError, parse_gpu_spec
from apps.clusters.models import GPUModel


def catalog() -> Catalog:
    """The enabled GPU models of the database catalog (one query; rates are admin-editable)."""
    return Catalog(m.as_catalog_entry() for m in GPUModel.objects.filter(enabled=True))


def validate_gpu_spec(text: str | None, gpu_catalog: Catalog | None = None) -> GPURequest:
    """Parse a GPU spec against the catalog; a ValidationError carries the parser's message."""
    try:
        return parse_gpu_spec(text, gpu_catalog or catalog())
    except GPUSpecError as exc:
        raise ValidationError(str(exc), code="gpu_spec")
