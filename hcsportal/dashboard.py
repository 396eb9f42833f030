"""The operator dashboard's figures: one service function returning plain data.

The admin index renders it (hcsportal.admin_site); a REST endpoint could serialise the same dataclasses.
Every figure comes from rows the portal already keeps: cluster and device state from the health checks and
node agents, task placements, the TaskEvent timeline, billing usage records, and the alert rules of
apps.billing.alerts. The number of queries is fixed, whatever the number of tasks, clusters or devices.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from decimal import Decimal

from django.db.models import F, Q, Sum
from django.utils import timezone

from apps.billing.alerts import Alert, evaluate
from apps.billing.choices import ResourceType
from apps.billing.models import UsageRecord
from apps.billing.monitoring import ZERO, ClusterState, read_state
from apps.clusters.choices import ClusterStatus
from apps.clusters.models import Device
from apps.tasks import ledger
from apps.tasks.choices import WAITING, EventKind
from apps.tasks.models import Task, TaskEvent
from apps.tasks.views import Activity, activity

TOP = 10
TREND_HOURS = 24
TREND_BUCKETS = 48


@dataclass
class ModelUse:
    """One GPU model in a cluster or VDC: cards, cards held by active tasks, average measured utilisation (%)."""

    model: str
    cards: int = 0
    held: Decimal = ZERO
    utilisation: float = 0.0


@dataclass
class ClusterUse:
    """A cluster's health and its GPU-equivalents: capacity, allocated to tasks, used (measured on the cards)."""

    pk: int
    name: str
    vdc: str
    status: str
    status_label: str
    enabled: bool
    last_check: datetime | None
    status_message: str
    capacity: Decimal
    allocated: Decimal
    used: Decimal
    tasks: int
    models: list[ModelUse] = field(default_factory=list)

    @property
    def checked(self) -> bool:
        return self.status != ClusterStatus.UNKNOWN


@dataclass
class QueueBacklog:
    """A queue now: tasks waiting and running, the oldest and the average wait (s), GPU-equivalents held."""

    name: str
    waiting: int
    running: int
    oldest_wait_s: float
    average_wait_s: float
    allocated: Decimal

    @property
    def oldest_wait(self) -> str:
        return human_duration(self.oldest_wait_s) if self.waiting else "-"

    @property
    def average_wait(self) -> str:
        return human_duration(self.average_wait_s) if self.waiting else "-"


@dataclass
class VDCUse:
    """A VDC's clusters summed, its cards per model, and its queues' backlog."""

    name: str
    capacity: Decimal = ZERO
    allocated: Decimal = ZERO
    used: Decimal = ZERO
    clusters: list[ClusterUse] = field(default_factory=list)
    models: list[ModelUse] = field(default_factory=list)
    queues: list[QueueBacklog] = field(default_factory=list)


@dataclass
class ProjectUse:
    """A project's use (GPU-equivalents held now, GPU-equivalent hours this month) and wait (tasks waiting now)."""

    name: str
    held: Decimal = ZERO
    eq_hours_month: Decimal = ZERO
    waiting: int = 0
    longest_wait_s: float = 0.0
    total_wait_s: float = 0.0

    @property
    def longest_wait(self) -> str:
        return human_duration(self.longest_wait_s)

    @property
    def total_wait(self) -> str:
        return human_duration(self.total_wait_s)


def human_duration(seconds: float) -> str:
    """A wait as people say it: "45 s", "12 min", "3 h 05 min"."""
    seconds = int(seconds)
    if seconds < 60:
        return f"{seconds} s"
    if seconds < 3600:
        return f"{seconds // 60} min"
    return f"{seconds // 3600} h {seconds % 3600 // 60:02d} min"


@dataclass
class WaitTrend:
    """Per bucket of the last 24 h: tasks that left the queue for a cluster, and their average and longest wait (s)."""

    times: list[datetime]
    started: list[int]
    average_s: list[float]
    longest_s: list[float]


@dataclass
class Dashboard:
    """Everything the operator dashboard shows, at one moment."""

    now: datetime
    vdcs: list[VDCUse]
    alerts: list[Alert]
    activity: Activity
    waits: WaitTrend
    top_use: list[ProjectUse]
    top_wait: list[ProjectUse]


def operator_dashboard(now: datetime | None = None) -> Dashboard:
    """The operator dashboard's figures, in a fixed number of queries (about fifteen)."""
    now = now or timezone.now()
    state = read_state(now)
    models = _models_per_cluster()
    used = _used_equivalents()
    vdcs: dict[str, VDCUse] = {}
    for c in sorted(state.clusters, key=lambda c: (c.vdc, c.name)):
        vdc = vdcs.setdefault(c.vdc, VDCUse(c.vdc))
        cluster = _cluster_use(c, used.get(c.pk, ZERO), models.get(c.pk, {}))
        vdc.clusters.append(cluster)
        vdc.capacity += cluster.capacity
        vdc.allocated += cluster.allocated
        vdc.used += cluster.used
    for q in sorted(state.queues, key=lambda q: (q.vdc, q.name)):
        backlog = QueueBacklog(q.name, q.waiting, q.running, q.oldest_wait_s, q.average_wait_s, q.allocated["gpu"])
        vdcs.setdefault(q.vdc, VDCUse(q.vdc)).queues.append(backlog)
    for vdc in vdcs.values():
        vdc.models = _merge_models([c.models for c in vdc.clusters if c.enabled])
    projects = _projects(state.projects, now)
    return Dashboard(
        now=now,
        vdcs=sorted(vdcs.values(), key=lambda v: v.name),
        alerts=evaluate(state, now),
        activity=activity(Task.objects.all(), hours=TREND_HOURS, buckets=TREND_BUCKETS),
        waits=wait_trend(now),
        top_use=sorted(
            (p for p in projects if p.held or p.eq_hours_month), key=lambda p: (-p.held, -p.eq_hours_month, p.name)
        )[:TOP],
        top_wait=sorted((p for p in projects if p.waiting), key=lambda p: (-p.longest_wait_s, -p.total_wait_s, p.name))[
            :TOP
        ],
    )


def _cluster_use(c: ClusterState, used: Decimal, models: dict[str, ModelUse]) -> ClusterUse:
    return ClusterUse(
        pk=c.pk,
        name=c.name,
        vdc=c.vdc,
        status=c.status,
        status_label=ClusterStatus(c.status).label,
        enabled=c.enabled,
        last_check=c.last_heartbeat,
        status_message=c.status_message,
        capacity=c.capacity["gpu"],
        allocated=c.allocated["gpu"],
        used=used if c.enabled else ZERO,
        tasks=c.tasks,
        models=sorted(models.values(), key=lambda m: m.model),
    )


def _models_per_cluster() -> dict[int, dict[str, ModelUse]]:
    """Cards per cluster and model, what active tasks hold of them and their average utilisation, as the capacity
    ledger counts them (two queries)."""
    out: dict[int, dict[str, ModelUse]] = defaultdict(dict)
    for (cluster_id, model), use in ledger.card_use().items():
        out[cluster_id][model] = ModelUse(model, use.cards, use.held, use.utilisation)
    return out


def _merge_models(groups: list[list[ModelUse]]) -> list[ModelUse]:
    """Per model over several clusters: cards and held cards summed, utilisation weighted by cards."""
    merged: dict[str, ModelUse] = {}
    for group in groups:
        for m in group:
            total = merged.setdefault(m.model, ModelUse(m.model))
            cards = total.cards + m.cards
            total.utilisation = (total.utilisation * total.cards + m.utilisation * m.cards) / cards if cards else 0.0
            total.cards, total.held = cards, total.held + m.held
    return sorted(merged.values(), key=lambda m: m.model)


def _used_equivalents() -> dict[int, Decimal]:
    """GPU-equivalents measured busy per cluster: each card's exchange rate times its utilisation (one query).

    Utilisation is summed per cluster and exchange rate in SQL and weighted here: SQLite would divide integers.
    """
    out: dict[int, Decimal] = defaultdict(Decimal)
    rows = (
        Device.objects.cards()
        .values(cluster_id=F("node__cluster_id"), rate=F("gpu_model__exchange_rate"))
        .annotate(percent=Sum("utilization"))
    )
    for row in rows.order_by():
        out[row["cluster_id"]] += Decimal(row["rate"]) * (row["percent"] or 0) / 100
    return {cluster: used.quantize(Decimal("0.01")) for cluster, used in out.items()}


def _projects(held: dict[tuple[str, str], dict[str, Decimal]], now: datetime) -> list[ProjectUse]:
    """Per project: GPU-equivalents held now (from the monitoring state), this month's GPU-equivalent hours
    (billing usage records) and the tasks waiting now with their waits (two queries)."""
    out: dict[str, ProjectUse] = {}

    def project(name: str) -> ProjectUse:
        return out.setdefault(name, ProjectUse(name))

    for (_vdc, name), resources in held.items():
        project(name).held += resources["gpu"]
    month = timezone.localtime(now).replace(day=1, hour=0, minute=0, second=0, microsecond=0)
    usage = (
        UsageRecord.objects.filter(resource_type=ResourceType.GPU_EQUIVALENT, period_start__gte=month)
        .values("project__name")
        .annotate(hours=Sum("quantity"))
        .order_by()
    )
    for row in usage:
        project(row["project__name"]).eq_hours_month = row["hours"] or ZERO
    for name, submitted in Task.objects.filter(status__in=WAITING).values_list("project__name", "submitted_at"):
        p, wait = project(name), max(0.0, (now - submitted).total_seconds())
        p.waiting += 1
        p.longest_wait_s = max(p.longest_wait_s, wait)
        p.total_wait_s += wait
    return list(out.values())


def wait_trend(now: datetime, hours: int = TREND_HOURS, buckets: int = TREND_BUCKETS) -> WaitTrend:
    """How long tasks waited before each placement of the last ``hours``, from the timeline (one query).

    A wait runs from the event that put the task in a waiting status (submitted, requeued, preempted ...)
    to its next "scheduled" event; a wait that began before the window is counted from its real start.
    """
    start = now - timedelta(hours=hours)
    step = (now - start) / buckets
    placed = TaskEvent.objects.filter(kind=EventKind.SCHEDULED, created_at__gt=start).values("task_id")
    rows = (
        TaskEvent.objects.filter(task_id__in=placed, created_at__lte=now)
        .filter(Q(kind=EventKind.SCHEDULED) | ~Q(to_status=""))
        .order_by("task_id", "created_at", "id")
        .values_list("task_id", "created_at", "kind", "to_status")
    )
    waits: list[list[float]] = [[] for _ in range(buckets)]
    waiting_since: dict[int, datetime] = {}
    for task_id, created_at, kind, to_status in rows:
        if kind == EventKind.SCHEDULED and task_id in waiting_since:
            since = waiting_since.pop(task_id)
            if created_at > start:
                index = min(buckets - 1, int((created_at - start) / step))
                waits[index].append((created_at - since).total_seconds())
        elif to_status in WAITING:
            waiting_since.setdefault(task_id, created_at)
        else:
            waiting_since.pop(task_id, None)
    return WaitTrend(
        times=[start + step * (i + 1) for i in range(buckets)],
        started=[len(w) for w in waits],
        average_s=[sum(w) / len(w) if w else 0.0 for w in waits],
        longest_s=[max(w, default=0.0) for w in waits],
    )
