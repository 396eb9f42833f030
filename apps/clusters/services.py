"""Cluster-side services: the GPU catalog as the parser sees it, GPU spec validation, cluster state."""

from __future__ import annotations

from django.core.exceptions import ValidationError

from apps.clusters.choices import ClusterStatus
from apps.clusters.gpuspec import Catalog, GPURequest, GPUSpecError, parse_gpu_spec
from apps.clusters.models import Cluster, GPUModel


def catalog() -> Catalog:
    """The enabled GPU models of the database catalog (one query; rates are admin-editable)."""
    return Catalog(m.as_catalog_entry() for m in GPUModel.objects.filter(enabled=True))


def validate_gpu_spec(text: str | None, gpu_catalog: Catalog | None = None) -> GPURequest:
    """Parse a GPU spec against the catalog; a ValidationError carries the parser's message."""
    try:
        return parse_gpu_spec(text, gpu_catalog or catalog())
    except GPUSpecError as exc:
        raise ValidationError(str(exc), code="gpu_spec")


def set_cluster_enabled(cluster: Cluster, enabled: bool) -> Cluster:
    """Enable or disable a cluster; a disabled cluster keeps its running tasks but takes no new ones."""
    cluster.enabled = enabled
    cluster.save(update_fields=["enabled", "updated_at"])
    return cluster


def set_cluster_maintenance(cluster: Cluster, on: bool) -> Cluster:
    """Put a cluster into maintenance (no new tasks) or back to healthy; health checks then take over."""
    cluster.status = ClusterStatus.MAINTENANCE if on else ClusterStatus.HEALTHY
    cluster.missed_heartbeats = 0
    cluster.status_message = "Maintenance set by an admin" if on else ""
    cluster.save(update_fields=["status", "missed_heartbeats", "status_message", "updated_at"])
    return cluster
