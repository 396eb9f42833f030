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
from django.db.models.functions import Cast
from django.utils import timezone

from apps.billing.choices import ResourceType
from apps.billing.models import Account, UsageRecord
from apps.clusters.backends import can_resize
from apps.clusters.choices import Sharing
from apps.clusters.gpuspec import Catalog, GPUSpecError, parse_gpu_spec
from apps.clusters.models import CapacityReservation, Cluster, Device, GPUModel, Node, effective_node_status
from apps.control import triggers
from apps.control.jobspec import job_name
from apps.control.models import BackendObject
from apps.queues import engine, stats
from apps.queues.choices import PriorityClass
from apps.queues.engine import model as em
from apps.queues.engine import rebalance
from apps.queues.models import TaskQueue
from apps.tasks.bulk import bulk_insert_rows, bulk_update_rows
from apps.tasks.choices import ACTIVE, WAITING, EventKind, TaskStatus
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


@dataclass(frozen=True)
class DeviceRow:
    """What applying decisions needs of a device."""

    index: int
    exchange_rate: Decimal
    unit: dict | None = None  # a MIG instance or time-sliced replica: its slot (and MIG uuid), kept in the placement


# Task fields the snapshot and the apply step read or write; the rest (command, env ...) stays deferred. A field
# missing here that the apply step reads costs one query per task (the name: waiting messages name running tasks).
SNAPSHOT_FIELDS = (
    "name", "project_id", "owner_id", "vdc_id", "queue", "kind", "cpu", "memory_gib", "gpu_spec", "instances",
    "elastic_min", "elastic_max", "expected_duration", "preemptible", "required_labels", "status", "status_message",
    "pending_reason", "pending_message", "queue_position", "estimated_start", "cluster_id", "placement",
    "allocated_gpu", "replicas", "external_id", "attempt", "window", "submitted_at", "started_at", "finished_at",
    "updated_at", "uid", "exit_code", "failure_reason", "preemption_count", "lost_gpu_seconds", "wall_time",
    "autoscale_min", "autoscale_max", "autoscale_desired",
)  # fmt: skip


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
            )
        )
        self.nodes = {n.pk: n for n in nodes}
        self.devices = {
            d[0]: DeviceRow(index=d[2], exchange_rate=d[4], unit={"slot": d[10], "uuid": d[11]} if d[7] else None)
            for d in devices
        }
        self.queues = {q.pk: q for q in TaskQueue.objects.filter(vdc=self.vdc)}
        quotas = list(ProjectQuota.objects.filter(vdc=self.vdc))
        # Active capacity loans (apps.control.rebalance) move guarantee from lender to borrower until returned.
        # The engine gets the loans too: fair share follows the VDC's loan billing, and work above the low class may
        # be kept off borrowed capacity (RebalancerSettings).
        self.loans = tuple(
            em.Loan(x.pk, x.lender_id, x.borrower_id, em.Resources(_f(x.cpu), _f(x.memory_gib), _f(x.gpu)),
                    x.started_at.timestamp(), x.expires_at.timestamp())
            for x in CapacityLoan.objects.filter(vdc=self.vdc).active()
        )  # fmt: skip
        self.loan_adjustments = rebalance.quota_adjustments(self.loans)
        rebalancer = RebalancerSettings.objects.filter(vdc=self.vdc).first()
        exhausted = set(
            Account.objects.filter(project__quotas__vdc=self.vdc, enforce_budget=True).values_list(
                "project_id", "balance", "credit_limit"
            )
        )
        exhausted = {pid for pid, balance, credit in exhausted if balance + credit <= 0}
        tasks = list(Task.objects.filter(vdc=self.vdc, status__in=(*WAITING, *ACTIVE)).only(*SNAPSHOT_FIELDS))
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
        for pk, node_id, index, model, _rate, health, links_text, parent, parent_health, sharing, *_ in devices:
            if sharing != Sharing.WHOLE:
                continue  # a partitioned card is offered as its MIG instances or replicas only
            if parent is not None:
                health, links = min(health, parent_health), ()  # a unit is as healthy as its card
            elif (links := links_by_text.get(links_text)) is None:
                links = links_by_text[links_text] = _links(links_text)
            devices_by_node.setdefault(node_id, []).append(
                em.Device(id=pk, index=index, model=model, health=health, links=links)
            )
        parse_cache: dict[str, object] = {}
        running, queued = [], []
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
                    resizable=can_resize(c),
                )  # fmt: skip
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
                )  # fmt: skip
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
                )  # fmt: skip
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
                )  # fmt: skip
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
            )  # fmt: skip
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
            attained_gpu_s=self.attained.get(t.pk, 0.0),
            wall_time_s=_seconds(t.wall_time),
            preemptions=t.preemption_count,
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
            for p in t.live_placement
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
                        }  # fmt: skip
                        for d in p.devices
                    ],
                }
            )
        return out

    def releasing_placements(self, t: Task) -> tuple[em.InstancePlacement, ...]:
        """Instances an elastic task gave up whose release its backend has not confirmed yet."""
        return tuple(
            em.InstancePlacement(
                node_id=p["node"],
                devices=tuple(em.DeviceShare(device_id=d["id"], milli=d.get("milli", 1000)) for d in p["devices"]),
                gpu_model=p.get("gpu_model"),
            )
            for p in t.releasing_placement
        )

    def equivalents(self, placements: tuple[em.InstancePlacement, ...]) -> Decimal:
        """GPU-equivalents a placement holds (card share x exchange rate)."""
        total = Decimal("0")
        for p in placements:
            for d in p.devices:
                rate = self.devices[d.device_id].exchange_rate
                total += rate * Decimal(d.milli) / 1000
        return total.quantize(Decimal("0.001"))


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
    except Exception as exc:  # noqa: BLE001 - any engine failure: isolate its cause instead of losing the cycle
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
        except Exception:  # noqa: BLE001
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
    stats.record_cycle(vdc.name, time.perf_counter() - t0, result.started, result.preempted, result.resized,
                       result.waiting)  # fmt: skip
    log.debug("cycle %s: %s", vdc.name, result)
    return result


def run_all_cycles() -> list[CycleResult]:
    """A cycle for every enabled VDC; a VDC whose cycle fails is logged and skipped, the others still run."""
    results = []
    for pk in VDC.objects.filter(enabled=True).values_list("pk", flat=True):
        try:
            results.append(run_cycle(pk))
        except Exception:  # noqa: BLE001 - one VDC's failure must not stop the others
            log.exception("scheduling cycle of VDC %s failed", pk)
            results.append(CycleResult(vdc=str(pk), skipped=True, failed=True))
    return results


def _apply(loader: SnapshotLoader, decisions: em.Decisions, now: datetime) -> CycleResult:
    result = CycleResult(vdc=loader.vdc.name)
    tasks = loader.tasks
    changed: dict[int, Task] = {}
    events: list[TaskEvent] = []
    intents: list[BackendObject] = []
    to_reconcile: set[int] = set()

    def event(task: Task, kind: str, message: str, previous: str, data: dict | None = None) -> None:
        events.append(
            TaskEvent(  # task_id, not task: setting the relation asks the database router, per event
                task_id=task.pk,
                kind=kind,
                message=message,
                from_status=previous,
                to_status=task.status,
                data=data or {},
            )
        )

    for p in decisions.preemptions:
        task = tasks[p.task_id]
        previous, cluster_id, external_id = task.status, task.cluster_id, task.external_id
        low = task.queue.priority_class == PriorityClass.LOW
        task.status = TaskStatus.SUSPENDED if low else TaskStatus.PREEMPTED
        message = preemption_message(task, tasks.get(p.by_task_id), p.reason, p.new_window_s, p.message)
        task.status_message = message
        if p.new_window_s is not None:
            task.window = timedelta(seconds=p.new_window_s)
        task.preemption_count += 1
        task.lost_gpu_seconds += Decimal(f"{p.lost_gpu_s:.1f}")
        task.cluster, task.placement, task.allocated_gpu, task.replicas, task.external_id = None, [], 0, 0, ""
        changed[task.pk] = task
        data = {"reason": p.reason, "by_task": p.by_task_id, "cluster": cluster_id, "external_id": external_id}
        data["lost_gpu_seconds"] = round(p.lost_gpu_s, 1)
        if p.new_window_s is not None:
            data["new_window_s"] = p.new_window_s
        event(task, EventKind.SUSPENDED if low else EventKind.PREEMPTED, message, previous, data)
        if cluster_id:
            to_reconcile.add(cluster_id)  # its job no longer belongs to a live attempt: cancel it now
        result.preempted += 1

    for s in decisions.starts:
        task = tasks[s.task_id]
        previous = task.status
        task.status = TaskStatus.SCHEDULED
        task.cluster_id = s.cluster_id
        task.placement = loader.placement_json(s.placements)
        task.allocated_gpu = loader.equivalents(s.placements)
        task.replicas = len(s.placements)
        task.attempt += 1
        task.external_id = ""
        task.started_at = now
        task.finished_at = None
        task.exit_code = None
        task.failure_reason = ""
        if s.window_s is not None:
            task.window = timedelta(seconds=s.window_s)
        task.queue_position = task.estimated_start = None
        task.pending_reason = task.pending_message = task.status_message = ""
        changed[task.pk] = task
        nodes = ", ".join(p["node_name"] for p in task.placement)
        event(task, EventKind.SCHEDULED, f"Placed on {loader.clusters[s.cluster_id].name}: {nodes}", previous,
              {"cluster": s.cluster_id, "placement": task.placement, "attempt": task.attempt})  # fmt: skip
        intents.append(
            BackendObject(
                cluster_id=s.cluster_id, task_id=task.pk, task_uid=task.uid, attempt=task.attempt, name=job_name(task),
                devices=sorted({d.device_id for p in s.placements for d in p.devices}), replicas=len(s.placements),
            )
        )  # fmt: skip
        result.started += 1

    resized: dict[int, set[int]] = {}
    for r in decisions.resizes:
        task = tasks[r.task_id]
        removed = {(p.node_id, tuple(d.device_id for d in p.devices)) for p in r.removed}
        entries = []
        for entry in task.placement or []:
            key = (entry["node"], tuple(d["id"] for d in entry.get("devices", ())))
            # Until the backend confirms the shrink, the task keeps (and pays for) what it releases.
            entries.append({**entry, "releasing": True} if key in removed and not entry.get("releasing") else entry)
        task.placement = entries + loader.placement_json(r.added)
        task.allocated_gpu = loader.equivalents((*loader._placements(task), *loader.releasing_placements(task)))
        task.replicas = len(task.placement)  # held: the released instances count until the backend confirms
        changed[task.pk] = task
        resized[task.pk] = {d.device_id for p in r.added for d in p.devices}
        event(task, EventKind.RESIZED, r.message or f"Resized to {r.replicas} replicas", task.status,
              {"replicas": r.replicas, "releasing": len(r.removed)})  # fmt: skip
        to_reconcile.add(task.cluster_id)
        result.resized += 1

    waiting_fields = ("queue_position", "estimated_start", "pending_reason", "pending_message")
    waiting_changed: list[Task] = []
    for w in decisions.waiting:
        task = tasks[w.task_id]
        start = _from_epoch(w.estimated_start)
        new = (w.position, start, w.reason[:32], _pending_message(task, w, tasks.get(w.blocked_by), start, now))
        if (task.queue_position, task.estimated_start, task.pending_reason, task.pending_message) != new:
            task.queue_position, task.estimated_start, task.pending_reason, task.pending_message = new
            waiting_changed.append(task)
        result.waiting += 1
    for task_id, message in loader.bad_specs.items():
        task = tasks[task_id]
        if task.status in WAITING and (task.pending_reason, task.pending_message) != ("invalid_request", message):
            task.pending_reason, task.pending_message = "invalid_request", message
            task.queue_position = task.estimated_start = None
            waiting_changed.append(task)

    state_fields = [
        "status", "status_message", "window", "cluster", "placement", "allocated_gpu", "replicas", "external_id",
        "attempt", "started_at", "finished_at", "queue_position", "estimated_start", "pending_reason",
        "pending_message", "updated_at", "exit_code", "failure_reason", "preemption_count", "lost_gpu_seconds",
    ]  # fmt: skip
    for task in changed.values():
        task.updated_at = now
    bulk_update_rows(Task, list(changed.values()), state_fields)
    bulk_update_rows(Task, [t for t in waiting_changed if t.pk not in changed], waiting_fields)
    bulk_insert_rows(TaskEvent, events)
    bulk_insert_rows(BackendObject, intents)
    _hold_grown_devices(tasks, resized)

    notify = {*changed, *(t.pk for t in waiting_changed)}
    launches = [obj.pk for obj in intents]

    def after_commit() -> None:
        from apps.control import jobs  # noqa: PLC0415 - the jobs module imports this one

        for cluster_id in sorted(to_reconcile):
            triggers.request_reconcile(cluster_id)
        for object_id in launches:
            triggers.enqueue(jobs.launch, object_id)
        if notify:
            task_changed.send(sender=Task, task_ids=sorted(notify))

    transaction.on_commit(after_commit)
    return result


def _hold_grown_devices(tasks: dict[int, Task], grown: dict[int, set[int]]) -> None:
    """Devices added to an elastic task are held by its backend object from now on (for launch conflicts)."""
    if not grown:
        return
    objects = BackendObject.objects.select_for_update().filter(
        task_id__in=grown, attempt__in={tasks[pk].attempt for pk in grown}
    )
    for obj in objects:
        if obj.attempt == tasks[obj.task_id].attempt and grown[obj.task_id]:
            obj.devices = sorted(set(obj.devices or ()) | grown[obj.task_id])
            obj.save(update_fields=["devices"])


_PREEMPTION_REASONS = {
    "higher_class": "it needs these resources and its class comes first",
    "quota_reclaim": "its project reclaims the quota it is guaranteed",
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
