"""The platform's state in figures, read in a constant number of queries: /metrics and the alerts share it.

Utilisation is allocation over capacity (what the scheduler placed over what the clusters have),
per VDC, cluster, project and queue; the GPU busy ratio is what the node agents measure on the cards.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from datetime import datetime
from decimal import Decimal

from django.db.models import Avg, Count, F, Sum

from apps.clusters.models import Cluster, Device, Node
from apps.queues.models import TaskQueue
from apps.tasks.choices import ACTIVE, WAITING
from apps.tasks.ledger import allocation_sums
from apps.tasks.models import Task

ZERO = Decimal("0")
RESOURCES = ("cpu", "memory_gib", "gpu")


def _resources(cpu=None, memory=None, gpu=None) -> dict[str, Decimal]:
    return {"cpu": cpu or ZERO, "memory_gib": memory or ZERO, "gpu": gpu or ZERO}


def ratio(used: Decimal, total: Decimal) -> float:
    """used / total, 0 when there is nothing to use."""
    return float(used / total) if total else 0.0


@dataclass
class ClusterState:
    """One cluster's capacity (enabled clusters only count) and what runs on it; gpu in equivalents."""

    name: str
    vdc: str
    status: str
    enabled: bool
    capacity: dict[str, Decimal]
    allocated: dict[str, Decimal]
    cards: int = 0
    missing_cards: int = 0
    busy: float | None = None
    tasks: int = 0
    pk: int | None = None
    last_heartbeat: datetime | None = None
    status_message: str = ""


@dataclass
class QueueState:
    """One queue: what waits in it, for how long, and what its running tasks hold."""

    name: str
    vdc: str
    max_gpu: Decimal | None
    waiting: int = 0
    oldest_wait_s: float = 0.0
    average_wait_s: float = 0.0
    running: int = 0
    allocated: dict[str, Decimal] = field(default_factory=_resources)


@dataclass
class State:
    """Clusters, queues and per-project allocation at one moment."""

    clusters: list[ClusterState]
    queues: list[QueueState]
    projects: dict[tuple[str, str], dict[str, Decimal]]

    def vdcs(self) -> dict[str, tuple[dict[str, Decimal], dict[str, Decimal]]]:
        """(capacity, allocated) per VDC, summed over its clusters."""
        out: dict[str, tuple[dict, dict]] = {}
        for c in self.clusters:
            capacity, allocated = out.setdefault(c.vdc, (_resources(), _resources()))
            for r in RESOURCES:
                capacity[r] += c.capacity[r]
                allocated[r] += c.allocated[r]
        return out


def read_state(now: datetime) -> State:
    """Everything /metrics and the alerts need, in seven queries whatever the size of the platform."""
    clusters = {
        c.pk: ClusterState(
            c.name,
            c.vdc.name,
            c.status,
            c.enabled,
            _resources(),
            _resources(),
            pk=c.pk,
            last_heartbeat=c.last_heartbeat,
            status_message=c.status_message,
        )
        for c in Cluster.objects.select_related("vdc")
    }
    for row in Node.objects.values("cluster_id").annotate(cpu=Sum("cpu"), memory=Sum("memory_gib")).order_by():
        state = clusters[row["cluster_id"]]
        if state.enabled:
            state.capacity.update(cpu=row["cpu"] or ZERO, memory_gib=row["memory"] or ZERO)
    devices = (
        Device.objects.units()
        .present()
        .values(cluster_id=F("node__cluster_id"))
        .annotate(cards=Count("id"), eq=Sum("gpu_model__exchange_rate"), busy=Avg("utilization"))
    )
    for row in devices.order_by():
        state = clusters[row["cluster_id"]]
        state.cards, state.busy = row["cards"], (row["busy"] / 100 if row["busy"] is not None else None)
        if state.enabled:
            state.capacity["gpu"] = row["eq"] or ZERO

    missing = Device.objects.cards().missing().values(cluster_id=F("node__cluster_id")).annotate(n=Count("id"))
    for row in missing.order_by():
        clusters[row["cluster_id"]].missing_cards = row["n"]

    active = Task.objects.filter(status__in=ACTIVE)
    per_group = (
        active.values("cluster_id", "queue_id", "vdc__name", "project__name")
        .annotate(n=Count("id"), **allocation_sums())
        .order_by()
    )
    queues = {
        q.pk: QueueState(q.name, q.vdc.name, q.max_gpu) for q in TaskQueue.objects.select_related("vdc").order_by("pk")
    }
    projects: dict[tuple[str, str], dict[str, Decimal]] = defaultdict(_resources)
    for row in per_group:
        held = _resources(row["cpu"], row["memory_gib"], row["gpu"])
        targets = [projects[(row["vdc__name"], row["project__name"])], queues[row["queue_id"]].allocated]
        if row["cluster_id"] in clusters:
            clusters[row["cluster_id"]].tasks += row["n"]
            targets.append(clusters[row["cluster_id"]].allocated)
        queues[row["queue_id"]].running += row["n"]
        for target in targets:
            for r in RESOURCES:
                target[r] += held[r]

    waits: dict[int, list[float]] = defaultdict(list)
    for queue_id, submitted in Task.objects.filter(status__in=WAITING).values_list("queue_id", "submitted_at"):
        waits[queue_id].append(max(0.0, (now - submitted).total_seconds()))
    for queue_id, ages in waits.items():
        q = queues[queue_id]
        q.waiting, q.oldest_wait_s, q.average_wait_s = len(ages), max(ages), sum(ages) / len(ages)
    return State(list(clusters.values()), list(queues.values()), dict(projects))
