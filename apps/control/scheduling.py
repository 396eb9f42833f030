"""The scheduling service: load a VDC's snapshot, run the engine, apply its decisions atomically.

One cycle per VDC runs inside one transaction that holds the VDC row lock, so two cycles of the
same VDC never overlap (a second one skips). Loading takes a constant number of queries whatever
the number of tasks; decisions are written with bulk updates. A start writes its launch intent (a
:class:`BackendObject`) in the same transaction, so no placement can exist without the record that
gets it launched; the launch itself and the cancellation of preempted jobs are carried out by the
reconciler (``apps.control.reconcile``), triggered on commit.

A task the engine cannot handle is set aside with the reason on it (``pending_reason``
``invalid_request``), and one VDC's failure never stops another VDC's cycle.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import time
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from decimal import Decimal

from django.db import transaction
from django.db.models import Sum, TextField
from django.db.models.functions import Cast, Length, Substr
from django.utils import timezone

from apps.billing.choices import ResourceType
from apps.billing.models import Account, UsageRecord
from apps.clusters.backends import backend_scales_services
from apps.clusters.capabilities import capabilities, needs_of
from apps.clusters.choices import Sharing
from apps.clusters.gpuspec import Catalog, GPUSpecError, parse_gpu_spec
from apps.clusters.models import CapacityReservation, Cluster, Device, GPUModel, Node, effective_node_status
from apps.control import triggers
from apps.control.jobspec import job_name
from apps.control.models import HOLDING, BackendObject, merge_shares, shares_of
from apps.queues import engine, stats
from apps.queues.choices import PriorityClass
from apps.queues.engine import model as em
from apps.queues.engine import rebalance
from apps.queues.models import TaskQueue
from apps.tasks import ledger, lifecycle
from apps.tasks.bulk import bulk_insert_rows, bulk_update_rows
from apps.tasks.choices import ACTIVE, WAITING
from apps.tasks.models import Task, TaskEvent
from apps.tasks.signals import task_changed
from apps.vdc.models import VDC, CapacityLoan, ProjectQuota, RebalancerSettings

# What the engine accepts of a task: durations and sizes beyond these are set aside, not scheduled.
MAX_DURATION_S = 366 * 24 * 3600
MAX_INSTANCES = 100_000

log = logging.getLogger(__name__)

KIND_LIMIT_KEYS = {"training": "max_training_tasks", "inference": "max_inference_tasks", "dev_env": "max_dev_env_tasks"}


@dataclass
class CycleResult:
    """What one cycle did, for logs, metrics and tests."""

    vdc: str
    skipped: bool = False
    failed: bool = False
    started: int = 0
    preempted: int = 0
    resized: int = 0
    waiting: int = 0
    load_s: float = 0.0
    engine_s: float = 0.0
    apply_s: float = 0.0


def _epoch(dt: datetime | None) -> float | None:
    return dt.timestamp() if dt is not None else None


def _from_epoch(value: float | None) -> datetime | None:
    """A timestamp as a datetime; None also for one beyond what a datetime holds (an estimate centuries away)."""
    if value is None:
        return None
    try:
        return datetime.fromtimestamp(value, tz=UTC)
    except (OverflowError, OSError, ValueError):
        return None


def _seconds(delta: timedelta | None) -> float | None:
    return delta.total_seconds() if delta is not None else None


def _f(value: Decimal | None) -> float:
    return float(value) if value is not None else 0.0


def _needs(t: Task) -> frozenset[str]:
    """What a snapshot's task needs of its cluster, from the head of its command (all of it only when the head is
    blank and more follows)."""
    command = t.command_head
    if not command.strip() and t.command_length > len(command):
        command = Task.objects.filter(pk=t.pk).values_list("command", flat=True).get()
    return needs_of(t.kind, t.image, command)


def _engine_capabilities(cluster_type: str) -> frozenset[str]:
    """What a cluster of ``cluster_type`` can run, as the engine matches tasks' needs and shares with it."""
    caps = capabilities(cluster_type)
    vendors = caps.share_vendors
    shares = {em.SHARE_ANY_VENDOR} if vendors is None else {em.share_capability(v) for v in vendors}
    return caps.names() | shares


@dataclass(frozen=True)
class DeviceRow:
    """What applying decisions needs of a device."""

    index: int
    node_id: int
    unit: dict | None = None  # a MIG instance or time-sliced replica: its slot (and MIG uuid), kept in the placement


# Task fields the snapshot and the apply step read or write; the rest (command, env ...) stays deferred. A field
# missing here that the apply step reads costs one query per task (the name: waiting messages name running tasks).
SNAPSHOT_FIELDS = (
    "name",
    "project_id",
    "owner_id",
    "vdc_id",
    "queue",
    "kind",
    "cpu",
    "memory_gib",
    "gpu_spec",
    "instances",
    "elastic_min",
    "elastic_max",
    "scaling",
    "expected_duration",
    "preemptible",
    "required_labels",
    "status",
    "status_message",
    "pending_reason",
    "pending_message",
    "queue_position",
    "estimated_start",
    "cluster_id",
    "placement",
    "allocated_gpu",
    "replicas",
    "external_id",
    "attempt",
    "window",
    "submitted_at",
    "started_at",
    "finished_at",
    "updated_at",
    "uid",
    "exit_code",
    "failure_reason",
    "preemption_count",
    "lost_gpu_seconds",
    "wall_time",
    "autoscale_min",
    "autoscale_max",
    "autoscale_desired",
    "ready_replicas",
    "held_cpu",
    "held_memory_gib",
    "image",
)
# What of a task's command the snapshot reads: enough to tell whether it has one (what it needs of its cluster).
COMMAND_HEAD = 64


def _links(text: str | None) -> tuple[em.Link, ...]:
    """A card's links from the JSON its node agent reported (entries without an integer peer are left out)."""
    parsed = json.loads(text) if text else None
    return tuple(
        em.Link(peer_index=link["peer"], kind=link.get("type", "pcie"), bandwidth_gbps=link.get("bandwidth_gbps", 0))
        for link in parsed or ()
        if isinstance(link, dict) and isinstance(link.get("peer"), int)
    )


class SnapshotLoader:
    """Maps the rows of one VDC onto the engine's plain input types, in a constant number of queries."""

    def __init__(self, vdc: VDC):
        self.vdc = vdc
        self.tasks: dict[int, Task] = {}
        self.clusters: dict[int, Cluster] = {}
        self.devices: dict[int, DeviceRow] = {}
        self.nodes: dict[int, Node] = {}
        self.queues: dict[int, TaskQueue] = {}
        # Queued tasks set aside, with why: a GPU spec the catalog no longer satisfies, values the engine
        # cannot take, or a task that made the engine fail.
        self.bad_specs: dict[int, str] = {}
        self.loan_adjustments: dict[int, tuple[em.Resources, em.Resources]] = {}
        self.loans: tuple[em.Loan, ...] = ()

    def load(self, now: datetime) -> em.Snapshot:
        gpu_models = list(GPUModel.objects.filter(enabled=True))
        catalog = Catalog(m.as_catalog_entry() for m in gpu_models)
        clusters = list(Cluster.objects.filter(vdc=self.vdc))
        self.clusters = {c.pk: c for c in clusters}
        nodes = list(Node.objects.filter(cluster__vdc=self.vdc))
        # Plain rows: 16,000 model instances would cost more than the engine's whole cycle.
        # Links as their JSON text: the cards of like nodes have like links, so each distinct text is parsed once.
        devices = list(
            Device.objects.filter(node__cluster__vdc=self.vdc)
            .annotate(links_text=Cast("links", TextField()))
            .values_list(
                "pk",
                "node_id",
                "index",
                "gpu_model__name",
                "gpu_model__exchange_rate",
                "health_score",
                "links_text",
                "parent_id",
                "parent__health_score",
                "sharing",
                "slot",
                "uuid",
                "missing_since",
                "parent__missing_since",
            )
        )
        self.nodes = {n.pk: n for n in nodes}
        self.devices = {
            d[0]: DeviceRow(index=d[2], node_id=d[1], unit={"slot": d[10], "uuid": d[11]} if d[7] else None)
            for d in devices
        }
        self.rates = {d[0]: d[4] for d in devices}
        self.queues = {q.pk: q for q in TaskQueue.objects.filter(vdc=self.vdc)}
        quotas = list(ProjectQuota.objects.filter(vdc=self.vdc))
        # Active capacity loans (apps.control.rebalance) move guarantee from lender to borrower until returned.
        # The engine gets the loans too: fair share follows the VDC's loan billing, and work above the low class may
        # be kept off borrowed capacity (RebalancerSettings).
        self.loans = tuple(
            em.Loan(
                x.pk,
                x.lender_id,
                x.borrower_id,
                em.Resources(_f(x.cpu), _f(x.memory_gib), _f(x.gpu)),
                x.started_at.timestamp(),
                x.expires_at.timestamp(),
            )
            for x in CapacityLoan.objects.filter(vdc=self.vdc).active()
        )
        self.loan_adjustments = rebalance.quota_adjustments(self.loans)
        rebalancer = RebalancerSettings.objects.filter(vdc=self.vdc).first()
        exhausted = set(
            Account.objects.filter(project__quotas__vdc=self.vdc, enforce_budget=True).values_list(
                "project_id", "balance", "credit_limit"
            )
        )
        exhausted = {pid for pid, balance, credit in exhausted if balance + credit <= 0}
        tasks = list(
            Task.objects.filter(vdc=self.vdc, status__in=(*WAITING, *ACTIVE))
            .only(*SNAPSHOT_FIELDS)
            .annotate(command_head=Substr("command", 1, COMMAND_HEAD), command_length=Length("command"))
        )
        # Each task's queue is one of the VDC's queues loaded above: share those rather than build a queue
        # object per task (select_related), which costs a fifth of loading the tasks.
        queue_field = Task._meta.get_field("queue")
        for t in tasks:
            if t.queue_id in self.queues:  # (always, unless a row was edited by hand: then it is read when used)
                queue_field.set_cached_value(t, self.queues[t.queue_id])
        self.tasks = {t.pk: t for t in tasks}
        self.attained = self._attained_gpu_s()
        self.preferred: dict[int, list[int]] = {}
        through = Task.preferred_clusters.through.objects.filter(
            task__vdc=self.vdc, task__status__in=(*WAITING, *ACTIVE)
        )
        for task_id, cluster_id in through.values_list("task_id", "cluster_id"):
            self.preferred.setdefault(task_id, []).append(cluster_id)

        devices_by_node: dict[int, list[em.Device]] = {}
        links_by_text: dict[str | None, tuple[em.Link, ...]] = {}
        for pk, node_id, index, model, _rate, health, links_text, parent, parent_health, sharing, *rest in devices:
            if sharing != Sharing.WHOLE:
                continue  # a partitioned card is offered as its MIG instances or replicas only
            if parent is not None:
                health, links = min(health, parent_health), ()  # a unit is as healthy as its card
            elif (links := links_by_text.get(links_text)) is None:
                links = links_by_text[links_text] = _links(links_text)
            if rest[-2] is not None or rest[-1] is not None:
                health = 0  # missing: whoever holds it keeps it, nothing new is placed on it
            devices_by_node.setdefault(node_id, []).append(
                em.Device(id=pk, index=index, model=model, health=health, links=links)
            )
        parse_cache: dict[str, object] = {}
        running, queued = [], []
        draining: list[em.Holding] = self._held_by_jobs()
        for t in tasks:
            request = self._request(t, catalog, parse_cache)
            if request is None:
                continue
            problem = None if t.status in ACTIVE else engine_input_problem(t)
            if problem:
                self.bad_specs[t.pk] = problem
                continue
            et = self._task(t, request)
            if t.status in ACTIVE:
                running.append(
                    em.RunningTask(
                        task=et,
                        cluster_id=t.cluster_id,
                        placements=self._placements(t),
                        started_at=_epoch(t.started_at) or now.timestamp(),
                        window_s=_seconds(t.window),
                        gpu_equivalents=float(ledger.placement_equivalents(t.placement, self.rates)),
                    )
                )
            else:
                queued.append(et)
        return em.Snapshot(
            now=now.timestamp(),
            clusters=tuple(
                em.Cluster(
                    id=c.pk,
                    name=c.name,
                    type=c.cluster_type,
                    enabled=c.enabled,
                    status=c.status,
                    labels=dict(c.labels or {}),
                    priority=c.priority,
                    weight=_f(c.weight),
                    cost_weight=_f(c.cost_weight),
                    max_total_tasks=c.max_total_tasks,
                    max_tasks_per_user=c.max_tasks_per_user,
                    resizable=capabilities(c.cluster_type).resize,
                    capabilities=_engine_capabilities(c.cluster_type),
                )
                for c in clusters
            ),
            nodes=tuple(
                em.Node(
                    id=n.pk,
                    cluster_id=n.cluster_id,
                    cpu=_f(n.cpu),
                    memory_gib=_f(n.memory_gib),
                    devices=tuple(sorted(devices_by_node.get(n.pk, ()), key=lambda d: d.index)),
                    status=effective_node_status(n.status, n.backend_state),
                    health=n.health_score,
                    labels=dict(n.labels or {}),
                )
                for n in nodes
            ),
            gpu_models=tuple(
                em.GpuModel(
                    name=m.name,
                    vendor=m.vendor,
                    vram_gib=_f(m.vram_gib),
                    tflops_fp16=_f(m.tflops_fp16),
                    tflops_fp32=_f(m.tflops_fp32),
                    exchange_rate=_f(m.exchange_rate),
                    shareable=m.shareable,
                    partition=m.partition,
                )
                for m in gpu_models
            ),
            queues=tuple(
                em.Queue(
                    id=q.pk,
                    priority_class=q.priority_class,
                    policy=q.policy,
                    guaranteed_gpu=_f(q.guaranteed_gpu),
                    max_gpu=_f(q.max_gpu) if q.max_gpu is not None else None,
                    weight=_f(q.weight),
                    window_floor_s=q.min_window.total_seconds(),
                    name=q.name,
                    reserve_after_s=_seconds(q.reserve_after),
                    min_run_before_reclaim_s=q.min_run_before_reclaim.total_seconds(),
                    las_thresholds_gpu_s=tuple(float(v) for v in q.las_thresholds_gpu_s)
                    if q.las_thresholds_gpu_s
                    else None,
                )
                for q in self.queues.values()
            ),
            quotas=tuple(self._quota(q, q.project_id in exhausted) for q in quotas),
            running=tuple(running),
            queued=tuple(queued),
            settings=em.VdcSettings(
                cluster_strategy=self.vdc.cluster_selection_strategy,
                node_scorer=self.vdc.node_scorer,
                cap=self._cap(),
                loan_billing=rebalancer.loan_billing if rebalancer is not None else em.LOAN_BORROWER_PAYS,
                loans_low_class_only=rebalancer is not None and rebalancer.loans_low_class_only,
            ),
            reservations=self._reservations(now),
            loans=self.loans,
            draining=tuple(draining),
        )

    def _cap(self) -> em.Resources | None:
        v = self.vdc
        if v.total_cpu is None and v.total_memory_gib is None and v.total_gpu is None:
            return None
        inf = float("inf")
        return em.Resources(
            cpu=_f(v.total_cpu) if v.total_cpu is not None else inf,
            memory_gib=_f(v.total_memory_gib) if v.total_memory_gib is not None else inf,
            gpu=_f(v.total_gpu) if v.total_gpu is not None else inf,
        )

    def _reservations(self, now: datetime) -> tuple[em.CapacityReservation, ...]:
        """The VDC's capacity reservations that have not ended (three queries: rows, nodes, projects)."""
        rows = (
            CapacityReservation.objects.filter(vdc=self.vdc)
            .current_and_upcoming(now)
            .select_related("gpu_model")
            .prefetch_related("nodes", "projects")
        )
        return tuple(
            em.CapacityReservation(
                id=r.pk,
                start=r.starts_at.timestamp(),
                end=r.ends_at.timestamp(),
                cluster_ids=(r.cluster_id,) if r.cluster_id else (),
                node_ids=tuple(n.pk for n in r.nodes.all()),
                gpu_model=r.gpu_model.name if r.gpu_model_id else None,
                cards=r.cards,
                gpu=_f(r.gpu),
                cpu=_f(r.cpu),
                memory_gib=_f(r.memory_gib),
                projects=frozenset(p.pk for p in r.projects.all()),
                lead_s=max(0.0, r.lead_time.total_seconds()),
                preempt_at_start=r.preempt_at_start,
                name=r.name,
            )
            for r in rows
        )

    def _request(self, t: Task, catalog: Catalog, cache: dict):
        spec = t.gpu_spec or ""
        if spec not in cache:
            try:
                cache[spec] = parse_gpu_spec(spec, catalog)
            except GPUSpecError as exc:
                # The catalog changed under a queued task (a model was disabled): keep it waiting, say why.
                cache[spec] = exc
        value = cache[spec]
        if isinstance(value, GPUSpecError):
            self.bad_specs[t.pk] = str(value)
            return None
        return value

    def _attained_gpu_s(self) -> dict[int, float]:
        """GPU-seconds each waiting task of a las queue received in earlier runs (metered GPU card-hours)."""
        las = [pk for pk, q in self.queues.items() if q.policy == em.LAS]
        if not las:
            return {}
        rows = (
            UsageRecord.objects.filter(
                task__vdc=self.vdc, task__queue_id__in=las, task__status__in=WAITING, resource_type=ResourceType.GPU
            )
            .values("task_id")
            .annotate(hours=Sum("quantity"))
            .values_list("task_id", "hours")
        )
        return {pk: float(hours) * 3600 for pk, hours in rows}

    def _task(self, t: Task, request) -> em.Task:
        min_replicas, max_replicas, autoscaled = t.replica_bounds
        if autoscaled and backend_scales_services(self.clusters.get(t.cluster_id)):
            # The backend's autoscaler (a Kubernetes HPA) owns the count: the engine grants up to its wish and gives
            # back what it no longer wants, but shrinks it for nobody below what it runs (the HPA would add it again).
            min_replicas = max(min_replicas, min(len(t.placement or []), max_replicas))
        return em.Task(
            id=t.pk,
            project_id=t.project_id,
            queue_id=t.queue_id,
            kind=t.kind,
            owner=t.owner_id,
            cpu=_f(t.cpu),
            memory_gib=_f(t.memory_gib),
            gpu=request,
            instances=t.instances,
            min_replicas=min_replicas,
            max_replicas=max_replicas,
            autoscaled=autoscaled,
            expected_duration_s=_seconds(t.expected_duration),
            window_s=_seconds(t.window),
            submit_time=t.submitted_at.timestamp(),
            preemptible=t.preemptible,
            required_labels=dict(t.required_labels or {}),
            preferred_clusters=tuple(self.preferred.get(t.pk, ())),
            needs=_needs(t),
            attained_gpu_s=self.attained.get(t.pk, 0.0),
            wall_time_s=_seconds(t.wall_time),
            preemptions=t.preemption_count,
            scaling=t.scaling,
        )

    def _placements(self, t: Task) -> tuple[em.InstancePlacement, ...]:
        """The instances the engine counts: devices of a shrink the backend has not confirmed yet are left out
        (the launch of whoever gets them waits for that confirmation)."""
        return tuple(
            em.InstancePlacement(
                node_id=p["node"],
                devices=tuple(
                    em.DeviceShare(device_id=d["id"], milli=d.get("milli", 1000)) for d in p.get("devices", ())
                ),
                gpu_model=p.get("gpu_model"),
            )
            for p in t.placement or []
        )

    def _quota(self, q: ProjectQuota, budget_exhausted: bool) -> em.ProjectQuota:
        guaranteed = em.Resources(_f(q.guaranteed_cpu), _f(q.guaranteed_memory_gib), _f(q.guaranteed_gpu))
        limit = em.Resources(_f(q.limit_cpu), _f(q.limit_memory_gib), _f(q.limit_gpu))
        if q.project_id in self.loan_adjustments:
            guarantee_delta, limit_delta = self.loan_adjustments[q.project_id]
            guaranteed = rebalance.apply_adjustment(guaranteed, guarantee_delta)
            limit = rebalance.apply_adjustment(limit, limit_delta)
        return em.ProjectQuota(
            project_id=q.project_id,
            guaranteed=guaranteed,
            limit=limit,
            max_concurrent=q.max_concurrent_tasks,
            max_per_kind={
                kind: getattr(q, field) for kind, field in KIND_LIMIT_KEYS.items() if getattr(q, field) is not None
            },
            enforce=q.enforce,
            budget_exhausted=budget_exhausted,
            priority=q.priority,
            weight=_f(q.weight),
        )

    def placement_json(self, placements: tuple[em.InstancePlacement, ...]) -> list[dict]:
        """The placement as stored on the task: node and device ids plus names for display."""
        out = []
        for p in placements:
            node = self.nodes[p.node_id]
            out.append(
                {
                    "node": p.node_id,
                    "node_name": node.name,
                    "gpu_model": p.gpu_model,
                    "devices": [
                        {
                            "id": d.device_id,
                            "index": self.devices[d.device_id].index,
                            "milli": d.milli,
                            **(self.devices[d.device_id].unit or {}),
                        }
                        for d in p.devices
                    ],
                }
            )
        return out

    def _held_by_jobs(self) -> list[em.Holding]:
        """Cards jobs may still hold on their backends beyond what the tasks' placements count: all of a job no live
        attempt wants (a preempted or stopped task's, being cancelled), and the cards a shrunk task gave back until
        its backend confirms. Nothing new is placed on them until then (one query)."""
        rows = BackendObject.objects.filter(cluster__vdc=self.vdc, state__in=HOLDING).values_list(
            "cluster_id", "attempt", "shares", "task_id", "task__status", "task__attempt", "task__cluster_id"
        )
        per_node: dict[int, list[em.DeviceShare]] = {}
        for cluster_id, attempt, shares, task_id, status, task_attempt, task_cluster in rows:
            counted: dict[int, int] = {}
            if status in ACTIVE and task_attempt == attempt and task_cluster == cluster_id and task_id in self.tasks:
                counted = ledger.placement_devices(self.tasks[task_id].placement)  # wanted: its placement counts
            for share in shares or ():
                extra = share["milli"] - counted.get(share["id"], 0)
                row = self.devices.get(share["id"])
                if extra > 0 and row is not None:
                    per_node.setdefault(row.node_id, []).append(em.DeviceShare(share["id"], extra))
        return [em.Holding(node_id=node, devices=tuple(shares)) for node, shares in per_node.items()]


def engine_input_problem(t: Task) -> str | None:
    """Why the engine cannot take this queued task, or None. Doors validate too; this guards what got past them."""
    labels = t.required_labels
    if not isinstance(labels, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in labels.items()):
        return 'required labels must be an object of strings, e.g. {"gpu": "a100"}; fix or resubmit the task'
    for name in ("expected_duration", "window"):
        value = getattr(t, name)
        if value is not None and not timedelta(0) <= value <= timedelta(seconds=MAX_DURATION_S):
            return f"{name.replace('_', ' ')} must be between 0 and {MAX_DURATION_S // 86400} days"
    sizes = [t.instances, t.elastic_min or 1, t.elastic_max or 1]
    if any(size < 1 or size > MAX_INSTANCES for size in sizes):
        return f"instances and elastic replicas must be between 1 and {MAX_INSTANCES}"
    return None


def _schedule(snapshot: em.Snapshot, loader: SnapshotLoader) -> em.Decisions:
    """Run the engine; when it fails, find the queued tasks that make it fail, set them aside and run again."""
    try:
        return engine.schedule(snapshot)
    except Exception as exc:  # any engine failure: isolate its cause instead of losing the cycle
        log.exception("cycle %s: the engine failed (%s); isolating the tasks that make it fail", loader.vdc.name, exc)
    culprits = _bisect_failures(snapshot, list(snapshot.queued))
    for task in culprits:
        loader.bad_specs[task.id] = "the scheduler could not handle this task; an admin has been told (see the logs)"
    kept = tuple(t for t in snapshot.queued if t not in culprits)
    return engine.schedule(dataclasses.replace(snapshot, queued=kept))


def _bisect_failures(snapshot: em.Snapshot, tasks: list[em.Task]) -> list[em.Task]:
    """The queued tasks that make the engine raise, found by halving (a few engine runs per culprit)."""

    def fails(subset: list[em.Task]) -> bool:
        try:
            engine.schedule(dataclasses.replace(snapshot, queued=tuple(subset)))
        except Exception:
            return True
        return False

    if not tasks or not fails(tasks):
        return []
    if len(tasks) == 1:
        return tasks
    middle = len(tasks) // 2
    found = _bisect_failures(snapshot, tasks[:middle]) + _bisect_failures(snapshot, tasks[middle:])
    return found or tasks  # only the two halves together fail: set both aside rather than fail every cycle


def run_cycle(vdc_id: int) -> CycleResult:
    """One scheduling cycle of one VDC; skipped when another cycle of the VDC holds the lock."""
    t0 = time.perf_counter()
    with transaction.atomic():
        vdc = VDC.objects.select_for_update(skip_locked=True).filter(pk=vdc_id, enabled=True).first()
        if vdc is None:
            return CycleResult(vdc=str(vdc_id), skipped=True)
        now = timezone.now()
        loader = SnapshotLoader(vdc)
        snapshot = loader.load(now)
        t1 = time.perf_counter()
        decisions = _schedule(snapshot, loader)
        t2 = time.perf_counter()
        result = _apply(loader, decisions, now)
        result.load_s, result.engine_s, result.apply_s = t1 - t0, t2 - t1, time.perf_counter() - t2
    stats.record_cycle(
        vdc.name, time.perf_counter() - t0, result.started, result.preempted, result.resized, result.waiting
    )
    log.debug("cycle %s: %s", vdc.name, result)
    return result


def run_all_cycles() -> list[CycleResult]:
    """A cycle for every enabled VDC; a VDC whose cycle fails is logged and skipped, the others still run."""
    results = []
    for pk in VDC.objects.filter(enabled=True).values_list("pk", flat=True):
        try:
            results.append(run_cycle(pk))
        except Exception:  # one VDC's failure must not stop the others
            log.exception("scheduling cycle of VDC %s failed", pk)
            results.append(CycleResult(vdc=str(pk), skipped=True, failed=True))
    return results


def _apply(loader: SnapshotLoader, decisions: em.Decisions, now: datetime) -> CycleResult:
    """Write the engine's decisions: every task's new state comes from :mod:`apps.tasks.lifecycle`, written with
    a fixed number of bulk statements whatever the number of decisions."""
    result = CycleResult(vdc=loader.vdc.name)
    tasks = loader.tasks
    changed: dict[int, Task] = {}
    events: list[TaskEvent] = []
    intents: list[BackendObject] = []
    to_reconcile: set[int] = set()

    def keep(change: lifecycle.Change) -> None:
        changed[change.task.pk] = change.task
        events.extend(change.events)

    for p in decisions.preemptions:
        task = tasks[p.task_id]
        cluster_id, external_id = task.cluster_id, task.external_id
        message = preemption_message(task, tasks.get(p.by_task_id), p.reason, p.new_window_s, p.message)
        data = {
            "reason": p.reason,
            "by_task": p.by_task_id,
            "cluster": cluster_id,
            "external_id": external_id,
            "lost_gpu_seconds": round(p.lost_gpu_s, 1),
        }
        if p.new_window_s is not None:
            data["new_window_s"] = p.new_window_s
        keep(lifecycle.preempted(task, message, data, new_window_s=p.new_window_s, lost_gpu_s=p.lost_gpu_s))
        if cluster_id:
            to_reconcile.add(cluster_id)  # its job no longer belongs to a live attempt: cancel it now
        result.preempted += 1

    for s in decisions.starts:
        task = tasks[s.task_id]
        placement = loader.placement_json(s.placements)
        nodes = ", ".join(p["node_name"] for p in placement)
        keep(
            lifecycle.placed(
                task,
                s.cluster_id,
                placement,
                f"Placed on {loader.clusters[s.cluster_id].name}: {nodes}",
                now,
                rates=loader.rates,
                window_s=s.window_s,
            )
        )
        intents.append(
            BackendObject(
                cluster_id=s.cluster_id,
                task_id=task.pk,
                task_uid=task.uid,
                attempt=task.attempt,
                name=job_name(task),
                shares=shares_of(placement),
                replicas=len(s.placements),
            )
        )
        result.started += 1

    resized: dict[int, list[dict]] = {}
    for r in decisions.resizes:
        task = tasks[r.task_id]
        removed = {(p.node_id, tuple(d.device_id for d in p.devices)) for p in r.removed}
        # What it gives back leaves its placement (and its bill) now, like a preemption's; its backend object keeps
        # those cards from everyone else until the backend confirms them free.
        kept = [
            e for e in task.placement or [] if (e["node"], tuple(d["id"] for d in e.get("devices", ()))) not in removed
        ]
        added = loader.placement_json(r.added)
        message = r.message or f"Resized to {r.replicas} replicas"
        keep(
            lifecycle.resized(
                task, kept + added, message, {"replicas": r.replicas, "released": len(r.removed)}, loader.rates
            )
        )
        resized[task.pk] = added
        to_reconcile.add(task.cluster_id)
        result.resized += 1

    waiting_changed: list[Task] = []
    for w in decisions.waiting:
        task = tasks[w.task_id]
        start = _from_epoch(w.estimated_start)
        message = _pending_message(task, w, tasks.get(w.blocked_by), start, now)
        if lifecycle.waiting(task, w.position, start, w.reason, message):
            waiting_changed.append(task)
        result.waiting += 1
    for task_id, message in loader.bad_specs.items():
        if lifecycle.set_aside(tasks[task_id], message):
            waiting_changed.append(tasks[task_id])

    for task in changed.values():
        task.updated_at = now
    bulk_update_rows(Task, list(changed.values()), lifecycle.STATE_FIELDS)
    bulk_update_rows(Task, [t for t in waiting_changed if t.pk not in changed], lifecycle.WAITING_FIELDS)
    bulk_insert_rows(TaskEvent, events)
    bulk_insert_rows(BackendObject, intents)
    _hold_grown_devices(tasks, resized)

    notify = {*changed, *(t.pk for t in waiting_changed)}
    launches = [obj.pk for obj in intents]

    def after_commit() -> None:
        for cluster_id in sorted(to_reconcile):
            triggers.request_reconcile(cluster_id)
        for object_id in launches:
            triggers.enqueue(triggers.LAUNCH, object_id)
        if notify:
            task_changed.send(sender=Task, task_ids=sorted(notify))

    transaction.on_commit(after_commit)
    return result


def _hold_grown_devices(tasks: dict[int, Task], grown: dict[int, list[dict]]) -> None:
    """Cards added to an elastic task are held by its backend object from now on (for launch conflicts)."""
    if not grown:
        return
    objects = BackendObject.objects.select_for_update().filter(
        task_id__in=grown, attempt__in={tasks[pk].attempt for pk in grown}
    )
    for obj in objects:
        if obj.attempt == tasks[obj.task_id].attempt and grown[obj.task_id]:
            obj.shares = merge_shares(obj.shares, shares_of(grown[obj.task_id]))
            obj.save(update_fields=["shares"])


_PREEMPTION_REASONS = {
    "higher_class": "it needs these resources and its class comes first",
    "quota_reclaim": "its project reclaims the quota it is guaranteed",
    "las_demotion": "its queue runs the tasks with the least attained service first (LAS), and it has run longer",
    "queue_reclaim": "its queue reclaims the capacity it is guaranteed",
}


def _named_for(task: Task, other: Task | None) -> str:
    """How ``task``'s people may read about ``other``: by name within the project, anonymous outside it."""
    if other is None:
        return "another task"
    klass = other.queue.get_priority_class_display().lower()
    if other.project_id == task.project_id:
        return f"task #{other.pk} “{other.name}” ({klass} class)"
    return f"a {klass}-class task of another project"


def _clock(when: datetime, now: datetime) -> str:
    """A time of day with its zone (and the date when it is not today), in the server's zone."""
    local, today = timezone.localtime(when), timezone.localtime(now)
    return local.strftime("%H:%M:%S %Z" if local.date() == today.date() else "%Y-%m-%d %H:%M:%S %Z")


def _pending_message(task: Task, w: em.Waiting, blocker: Task | None, start: datetime | None, now: datetime) -> str:
    """The engine's reason, made precise where capacity decides: which running task is waited for, until when."""
    capacity = (em.Reason.INSUFFICIENT_CAPACITY, em.Reason.HOLDS_RESERVATION)
    if w.reason == em.Reason.QUOTA_EXCEEDED and blocker is not None and start is not None:
        who = _named_for(task, blocker)
        return f"{w.message}; enough of it frees up when {who} is expected to end, {_clock(start, now)}"
    if w.reason not in capacity or blocker is None or start is None or "any node" in w.message:
        return w.message
    who = _named_for(task, blocker)
    if w.until_window_end:
        return f"waiting for {who}'s guaranteed window, which ends {_clock(start, now)}; it may be preempted then"
    return f"not enough free capacity; enough frees up when {who} is expected to end, {_clock(start, now)}"


def preemption_message(
    task: Task, by: Task | None, reason: str, new_window_s: float | None, engine_message: str = ""
) -> str:
    """What the preempted task's people read: who took its resources and why, and what happens next.

    The other task is named only within the same project; another project's task stays anonymous.
    """
    verb = "Suspended" if task.queue.priority_class == PriorityClass.LOW else "Preempted"
    if reason == em.PreemptReason.CAPACITY_RESERVATION:
        # No task took its place: an admin's reservation drains its nodes (engine_message says which, until when).
        return f"{verb}: {engine_message}. Requeued; it starts again when resources are free."
    who = _named_for(task, by)
    text = f"{verb} for {who}: {_PREEMPTION_REASONS.get(reason, reason)}."
    if new_window_s is not None:
        text += f" Requeued; its next run is guaranteed {timedelta(seconds=round(new_window_s))}."
    else:
        text += " Requeued; it starts again when resources are free."
    return text
