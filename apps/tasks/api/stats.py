"""Aggregates behind the VDC and cluster stats endpoints: a fixed number of grouped queries each."""

from __future__ import annotations

from collections import defaultdict
from decimal import Decimal

from django.db.models import Count, QuerySet, Sum

from apps.clusters.models import Cluster, Device, Node
from apps.tasks.choices import ACTIVE, WAITING, TaskStatus
from apps.tasks.ledger import allocation_sums
from apps.tasks.models import Task
from apps.vdc.models import VDC

ZERO = Decimal("0")
RESOURCES = ("cpu", "memory_gib", "gpu")


def _allocation_sums() -> dict:
    return {**allocation_sums(), "tasks": Count("id")}


def _vector(row: dict | None) -> dict[str, Decimal]:
    row = row or {}
    return {r: Decimal(row.get(r) or ZERO) for r in RESOURCES}


def _minus(a: dict, b: dict) -> dict[str, Decimal]:
    return {r: a[r] - b[r] for r in RESOURCES}


def allocated(tasks: QuerySet[Task]) -> dict:
    """Cpu, memory and GPU-equivalents held by the active tasks of the queryset, and their count."""
    row = tasks.filter(status__in=ACTIVE).aggregate(**_allocation_sums())
    return {**_vector(row), "tasks": row["tasks"]}


def vdc_stats(vdc: VDC) -> dict:
    """Task counts per status, waiting and active counts, GPU-equivalents held by running work."""
    counts = dict.fromkeys(TaskStatus.values, 0)
    for row in Task.objects.filter(vdc=vdc).values("status").annotate(n=Count("id")):
        counts[row["status"]] = row["n"]
    running = Task.objects.filter(vdc=vdc, status__in=ACTIVE).aggregate(gpu=Sum("allocated_gpu"))["gpu"]
    return {
        "vdc": vdc.pk,
        "tasks_by_status": counts,
        "queued": sum(counts[s] for s in WAITING),
        "active": sum(counts[s] for s in ACTIVE),
        "running_gpu_equivalents": running or ZERO,
    }


def _cluster_capacities(clusters: QuerySet[Cluster]) -> dict[int, dict[str, Decimal]]:
    capacity: dict[int, dict[str, Decimal]] = defaultdict(lambda: _vector(None))
    nodes = Node.objects.filter(cluster__in=clusters).values("cluster_id")
    for row in nodes.annotate(cpu=Sum("cpu"), memory_gib=Sum("memory_gib")):
        capacity[row["cluster_id"]].update(cpu=row["cpu"] or ZERO, memory_gib=row["memory_gib"] or ZERO)
    devices = Device.objects.units().present().filter(node__cluster__in=clusters).values("node__cluster_id")
    for row in devices.annotate(gpu=Sum("gpu_model__exchange_rate")):
        capacity[row["node__cluster_id"]]["gpu"] = row["gpu"] or ZERO
    return capacity


def vdc_resources(vdc: VDC) -> dict:
    """The VDC's capacity, what active tasks hold and what is free, in total and per cluster."""
    clusters = list(vdc.clusters.order_by("name"))
    capacity = _cluster_capacities(vdc.clusters.all())
    held = {
        row["cluster_id"]: _vector(row)
        for row in Task.objects.filter(vdc=vdc, status__in=ACTIVE, cluster__isnull=False)
        .values("cluster_id")
        .annotate(**_allocation_sums())
    }
    total_capacity = {r: Decimal(v) for r, v in vdc.capacity().items()}
    total_allocated = allocated(Task.objects.filter(vdc=vdc))
    total_allocated.pop("tasks")
    per_cluster = []
    for cluster in clusters:
        cap, used = capacity[cluster.pk], held.get(cluster.pk, _vector(None))
        per_cluster.append(
            {
                "id": cluster.pk,
                "name": cluster.name,
                "enabled": cluster.enabled,
                "status": cluster.status,
                "capacity": cap,
                "allocated": used,
                "free": _minus(cap, used),
            }
        )
    return {
        "vdc": vdc.pk,
        "capacity": total_capacity,
        "allocated": total_allocated,
        "free": _minus(total_capacity, total_allocated),
        "clusters": per_cluster,
    }


def cluster_stats(cluster: Cluster) -> dict:
    """Nodes per status, devices per GPU model, capacity and what active tasks hold on the cluster."""
    by_status = dict(cluster.nodes.values_list("status").annotate(n=Count("id")).order_by())
    devices = (
        Device.objects.units()
        .filter(node__cluster=cluster)
        .values("gpu_model__name", "gpu_model__vendor")
        .annotate(count=Count("id"), vram_gib=Sum("vram_gib"), gpu_equivalents=Sum("gpu_model__exchange_rate"))
        .order_by("gpu_model__name")
    )
    held = allocated(Task.objects.filter(cluster=cluster))
    return {
        "cluster": cluster.pk,
        "nodes": {"total": sum(by_status.values()), "by_status": by_status},
        "devices": [
            {
                "gpu_model": row["gpu_model__name"],
                "vendor": row["gpu_model__vendor"],
                "count": row["count"],
                "vram_gib": row["vram_gib"],
                "gpu_equivalents": row["gpu_equivalents"],
            }
            for row in devices
        ],
        "capacity": _cluster_capacities(Cluster.objects.filter(pk=cluster.pk))[cluster.pk],
        "allocated": {r: held[r] for r in RESOURCES},
        "active_tasks": held["tasks"],
    }
