"""The scheduling cycle (docs/rules.md, docs/engine.md).

:func:`schedule` is the stateless entry point the Django service uses: snapshot in,
decisions out. :class:`Scheduler` is the same engine kept alive between cycles (the
simulator and the benchmarks use it): it applies its own decisions and accepts
``submit`` / ``finish`` events, so a cycle does not rebuild the capacity index.

One cycle: high, then medium, then low; within a class the queues take turns, and each
queue yields its tasks in policy order. For every task the admission checks run first
(budget, limits, quotas, queue capacity, queue order, idle-only for low), then cluster
filters and the cluster strategy, then node/device placement. A high or medium task that
does not fit may preempt (shrinking elastic tasks first); a project or queue below its
guarantee may reclaim borrowed usage (after the victim's minimum run, sized to what is
borrowed). A high task that still does not fit, or a medium task that waited past its queue's
threshold, reserves the nodes where it will start earliest, and later lower-class work keeps
off them unless it is gone by then or may be preempted. Within medium and low, tasks whose
project stays within its guarantee are considered first, so they take freed capacity before
borrowers do. Elastic tasks then grow into what nobody waits for, and every task still queued
gets its position, estimated start and reason. A kept ``Scheduler`` hands those out
lazily (:class:`~.estimate.WaitingList`), so a cycle costs the consideration of the queued
tasks, not the estimation of the whole backlog.
"""

from __future__ import annotations

import gc
from bisect import bisect_left
from collections import deque
from dataclasses import fields, replace
from operator import attrgetter

from . import backfill, elastic, preemption, rebalance, reservations
from .capacity import BEST_FIT, FGD, FIRST_FIT, NODE_SCORERS, Claim, ClusterIndex, NodeState
from .estimate import Clocks, Estimator, WaitingList
from .fragmentation import FragmentationModel, shape_of
from .model import (
    BACKFILL,
    CLASS_RANK,
    DRF,
    FIFO,
    HIGH,
    LAS,
    LOAN_LENDER_CREDITED,
    LOAN_NEITHER,
    LOW,
    MEDIUM,
    POLICIES,
    RESERVING_POLICIES,
    SHARE_ANY_VENDOR,
    Decisions,
    DeviceShare,
    GpuRequest,
    Holding,
    InstancePlacement,
    Preempt,
    Reason,
    Resize,
    Resources,
    RunningTask,
    Snapshot,
    Start,
    Task,
    share_capability,
)
from .policies import check_las_thresholds, drain_reservation, queue_order
from .resources import EPS, WHOLE, Demand, RequestError, demand_of, dominant_share, fits_under, plus
from .scorers import CLUSTER_STRATEGIES

# A degraded cluster missed a health check: what runs there keeps running, nothing new is placed there.
SCHEDULABLE_CLUSTER_STATUS = ("healthy",)
ZERO = Resources()


# At most this many cross-class reservations per cycle (each costs a trial placement per released task); with the
# node bound (VdcSettings.reserved_nodes_max_fraction) it keeps a cycle over a large blocked backlog fast.
RESERVATIONS_PER_CYCLE = 8


def schedule(snapshot: Snapshot) -> Decisions:
    """Run one scheduling cycle on a snapshot and return the decisions (pure, deterministic).

    Unlike :meth:`Scheduler.cycle`, every waiting entry is computed before returning: the caller
    applies them all, and any error belongs to this call.
    """
    was_enabled = gc.isenabled()
    gc.disable()  # see Scheduler.cycle
    try:
        d = Scheduler(snapshot).cycle(snapshot.now)
        return replace(d, waiting=tuple(d.waiting))
    finally:
        if was_enabled:
            gc.enable()


class ClusterView:
    """A cluster with its capacity index and the counters strategies and filters read."""

    __slots__ = ("cluster", "index", "order", "total_gpu", "used_gpu", "running", "per_user", "usable")

    def __init__(self, cluster, index: ClusterIndex, order: int, total_gpu: float):
        self.cluster = cluster
        self.index = index
        self.order = order
        self.total_gpu = total_gpu
        self.used_gpu = 0.0
        self.running = 0
        self.per_user: dict = {}
        self.usable = cluster.enabled and cluster.status in SCHEDULABLE_CLUSTER_STATUS


class Run:
    """Engine-side record of a running task: its claims on the index and what it counts against."""

    __slots__ = (
        "task",
        "cluster_id",
        "claims",
        "placements",
        "alt",
        "started_at",
        "window_s",
        "rank",
        "seq",
        "models",
        "fresh",
        "_held",
        "_rel",
    )

    def __init__(self, task, cluster_id, claims, placements, alt, started_at, window_s, rank, seq):
        self.task = task
        self.cluster_id = cluster_id
        self.claims = claims
        self.placements = placements
        self.alt = alt
        self.started_at = started_at
        self.window_s = window_s
        self.rank = rank
        self.seq = seq
        self.models = frozenset(p.gpu_model for p in placements if p.gpu_model is not None)
        self.fresh = False
        self._held = None
        self._rel: list = []

    def changed(self) -> None:
        """Claims were added or removed: forget what :meth:`held` computed."""
        self._held = None

    def held(self) -> list[tuple[str, float]]:
        """What the task would give back: GPU thousandths per model, or cpu cores when CPU-only."""
        if self._held is None:
            per: dict = {}
            for ns, cpu, _mem, devs in self.claims:
                if not devs:
                    per["cpu"] = per.get("cpu", 0.0) + cpu
                for i, milli in devs:
                    m = ns.dev_model[i]
                    per[m] = per.get(m, 0.0) + milli
            self._held = list(per.items())
        return self._held

    def usage(self) -> Resources:
        """Total resources held."""
        n = len(self.placements)
        return Resources(self.task.cpu * n, self.task.memory_gib * n, self.alt[3] * n)

    def window_end(self) -> float | None:
        """When the medium guarantee of this run ends (None without one)."""
        return None if self.window_s is None else self.started_at + self.window_s

    def expected_end(self) -> float | None:
        """When the task should finish, from its expected duration."""
        d = self.task.expected_duration_s
        return None if d is None else self.started_at + d

    def elastic_min(self) -> int | None:
        """The replica floor when the task is elastic, else None."""
        t = self.task
        if t.min_replicas is None or t.max_replicas is None:
            return None
        return max(1, t.min_replicas)


class Cycle:
    """Per-cycle bookkeeping: failure cache, blocks, reservations and the decisions so far."""

    def __init__(self, now: float):
        self.now = now
        self.fail: set = set()
        # The keys of ``fail`` by (cluster order, GPU model or None), and its "every" keys: which to forget when
        # capacity is given back (:func:`_forget_failures`). They may name keys ``fail`` no longer holds.
        self.fail_by: dict = {}
        self.fail_every: list = []
        self.starts: dict = {}
        self.preempts: list[Preempt] = []
        self.resizes: dict = {}
        self.why: dict = {}  # task id -> why it was resized (the Resize message)
        self.waiting: list[tuple[Task, Demand | None, str, str]] = []
        # Whether a waiting task has several instances / waits for its project's quota: the estimate's extra checks.
        self.gang_waits = False
        self.quota_waits = False
        # GPU models (and "cpu") that a high/medium task waits for: low work must leave them idle.
        self.hm_blocked: set = set()
        # The request shapes of those waiting high/medium tasks ((shape, class) -> (demand, class rank)), and what
        # :meth:`Scheduler._hm_fit_time` derives from them, built when first asked.
        self.hm_waiting: dict = {}
        self.hm_needs: list | None = None
        self.hm_releases: dict = {}
        self.hm_fit: dict = {}
        self.hm_dominated: dict = {}  # (id(demand), alternatives) -> (Scheduler._always_in_the_way, demand)
        # Models any waiting task could use: elastic tasks do not grow into them.
        self.starved: set = set()
        self.queue_blocked: dict = {}
        self.reservation: dict = {}
        # Cross-class reservations: (start time, node positions, rank of the holder, holder task id).
        self.class_res: list = []
        self.class_res_nodes: set = set()  # the node positions they hold
        self.res_bound: int | None = None  # how many nodes they may hold (Scheduler._may_reserve)
        self.preempt_failed: set = set()
        # Low tasks without reclaim rights that found no room: how they were decided (Scheduler._remember).
        self.low_memo: dict = {}
        self.eligible: dict = {}
        self.eligible_static: dict = {}
        self.victim_pool: dict = {}
        # Victim units of class preemption by (class rank, cluster, models, GPU, excluded nodes), sorted; cleared
        # when a running task's replicas change (preemption._units).
        self.units: dict = {}
        # The same units by node, and the nodes by their cheapest unit (preemption._cheapest_nodes); cleared with them.
        self.unit_nodes: dict = {}
        # Capacity reservations resolved for this cycle (None without any), and the earliest start of the
        # tasks they hold off (task id -> the reservation's end).
        self.holds: reservations.Holds | None = None
        self.not_before: dict = {}
        # (id(demand), class) -> demand of the waits already marked (Scheduler._starving: marking again does nothing).
        self.starving_marked: dict = {}


class Scheduler:
    """The scheduling engine over one VDC; build it from a snapshot, then run cycles."""

    def __init__(self, snapshot: Snapshot):
        s = snapshot.settings
        if s.node_scorer not in NODE_SCORERS:
            raise ValueError(f"unknown node scorer {s.node_scorer!r}; expected one of {NODE_SCORERS}")
        if s.cluster_strategy not in CLUSTER_STRATEGIES:
            raise ValueError(f"unknown cluster strategy {s.cluster_strategy!r}")
        for q in snapshot.queues:
            if q.policy not in POLICIES:
                raise ValueError(f"queue {q.id!r}: unknown policy {q.policy!r}; expected one of {', '.join(POLICIES)}")
            try:
                check_las_thresholds(q.las_thresholds_gpu_s)
            except ValueError as e:
                raise ValueError(f"queue {q.id!r}: {e}") from None
        self.settings = s
        self.strategy = CLUSTER_STRATEGIES[s.cluster_strategy]
        self.scorer = s.node_scorer
        self.catalog = {m.name: m for m in snapshot.gpu_models}
        self.all_models = frozenset(self.catalog)
        shareable = frozenset(m.name for m in snapshot.gpu_models if m.shareable)
        self.queues = {q.id: q for q in snapshot.queues}
        self.queue_rank = {q.id: i for i, q in enumerate(snapshot.queues)}
        self.quotas = {q.project_id: q for q in snapshot.quotas}
        # Capacity reservations (admin-held windows); replace the tuple between cycles to change them.
        self.reservations = snapshot.reservations
        self.has_priorities = any(q.priority for q in snapshot.quotas)
        self.set_loans(snapshot.loans)

        by_cluster: dict = {c.id: [] for c in snapshot.clusters}
        self.nodes: list[NodeState] = []
        self.node_by_id: dict = {}
        self.device_at: dict = {}
        for node in snapshot.nodes:
            if node.cluster_id not in by_cluster:
                continue
            ns = NodeState(len(self.nodes), node, s.subhealthy_below, s.unhealthy_below)
            self.nodes.append(ns)
            self.node_by_id[node.id] = ns
            by_cluster[node.cluster_id].append(ns)
        if snapshot.running or snapshot.draining:
            # Where each device is, for the running tasks' placements (a backlog-only snapshot needs none).
            for ns in self.nodes:
                for i, dev_id in enumerate(ns.dev_ids):
                    self.device_at[dev_id] = (ns, i)
        # Running work is subtracted from the nodes before the index is built: one indexing
        # per node instead of one re-indexing per running task.
        self.seq = 0
        pending = [self._run_of(rt) for rt in snapshot.running]
        for holding in snapshot.draining:
            self._drain(holding)
        self.clusters: dict = {}
        total = [0.0, 0.0, 0.0]
        rate = {m.name: m.exchange_rate for m in self.catalog.values()}
        for order, c in enumerate(snapshot.clusters):
            index = ClusterIndex(c.id, by_cluster[c.id], shareable, self._unshareable(c, shareable))
            gpu = 0.0
            for ns in index.schedulable:
                for m, ok in zip(ns.dev_model, ns.dev_ok, strict=True):
                    if ok and m in rate:
                        gpu += rate[m]
            cv = ClusterView(c, index, order, gpu)
            self.clusters[c.id] = cv
            if cv.usable:
                total[0] += sum(ns.node.cpu for ns in index.schedulable)
                total[1] += sum(ns.node.memory_gib for ns in index.schedulable)
                total[2] += gpu
        self.capacity = Resources(*total)
        self.cap = s.cap
        self.per_user_limits = any(c.max_tasks_per_user is not None for c in snapshot.clusters)
        self.task_limits = self.per_user_limits or any(c.max_total_tasks is not None for c in snapshot.clusters)

        self.proj_usage: dict = {}
        self._shares: dict = {}  # project -> (its usage vector, dominant share): share_of
        self.low_usage: dict = {}  # per project, what its low-class work holds (loans_low_class_only)
        self.queue_usage: dict = {}
        self.proj_count: dict = {}
        self.kind_count: dict = {}
        self.total_usage = ZERO
        self.running: dict = {}
        self.has_elastic = False
        self._releases: dict = {}
        self.release_total: dict = {}
        self._rel_pending: list = []
        # (expected end, seq, run) of the running tasks that have an expected duration, sorted; new entries wait in
        # ``_ends_pending`` until read (:meth:`runs_by_end`), as the release lists do.
        self._ends: list = []
        self._ends_pending: list = []
        self._cycle: Cycle | None = None
        # Cross-class reservations of the last cycle: holder task id -> (start time, node ids). For inspection.
        self.last_reservations: dict = {}
        self._res_cache: dict = {}  # holder -> (epoch, demand, reservation, reserved nodes' free state)
        self._fresh: list[Run] = []  # runs started in the last cycle, not preemptible in it
        self._demands: dict = {}
        self._shapes: dict = {}
        self._eligible_keys: dict = {}  # task id -> (task, Scheduler._eligible_key)
        # Failed (cluster, request shape) placements stay failed until capacity is given back;
        # ``epoch`` counts give-backs, so the cache survives cycles that only add work.
        self.epoch = 0
        self._fail: set = set()
        self._fail_by: dict = {}
        self._fail_every: list = []
        self._fail_epoch = 0
        for run in pending:
            self._charge(run, +1)
        self.queued: dict = {}
        for t in snapshot.queued:
            if t.id not in self.running:
                self.queued[t.id] = t
        # FGD's learned target workload: the request shapes of the most recent submissions (bounded), so a
        # long-lived Scheduler measures against what it is actually asked for.
        self.fgd_window: deque = deque(maxlen=FGD_WINDOW)
        self.fgd_uses_default = False
        self.fgd_default_cycles = 0  # cycles that had only DEFAULT_FGD_WORKLOAD to go by
        self._fgd_pending = 0
        self.fgd = self._fragmentation_model(snapshot) if self.scorer == FGD else None

    # -- state ------------------------------------------------------------------------

    def _fragmentation_model(self, snapshot: Snapshot) -> FragmentationModel:
        """FGD's target workload: the configured shapes, else the tasks in the snapshot and then the rolling
        window of submissions (:meth:`_learn_shape`), else a default mix."""
        wl = self.settings.fgd_workload
        if wl is not None:
            shapes = [
                (
                    w.weight,
                    w.cpu,
                    w.memory_gib,
                    round(w.gpu * WHOLE),
                    frozenset(w.models) if w.models else None,
                )
                for w in wl
            ]
            return FragmentationModel(shapes)
        shapes = []
        for t in list(snapshot.queued) + [r.task for r in snapshot.running]:
            d = self.demand(t)
            if isinstance(d, Demand):
                shapes.append(shape_of(d.cpu, d.memory_gib, d.alternatives, self.all_models))
        if not shapes:
            return self._window_model()
        # Every task of the snapshot counts (the stateless cycle of the Django service); the window keeps the
        # newest for later rebuilds.
        self.fgd_window.extend(shapes)
        return FragmentationModel(shapes)

    def _learn_shape(self, task: Task) -> None:
        """Add a task's request shape to FGD's rolling window (when FGD learns its workload)."""
        d = self.demand(task)
        if isinstance(d, Demand):
            self.fgd_window.append(shape_of(d.cpu, d.memory_gib, d.alternatives, self.all_models))
            self._fgd_pending += 1

    def _window_model(self) -> FragmentationModel:
        # With nothing to learn from (an empty snapshot, a Scheduler started empty), FGD would score every node
        # alike and place first-fit: it measures against a default mix of whole-card requests instead. That mix
        # stays in as a prior worth FGD_PRIOR requests, so the first few submissions do not decide alone.
        self.fgd_uses_default = not self.fgd_window
        self._fgd_pending = 0
        total = sum(s[0] for s in DEFAULT_FGD_WORKLOAD)
        prior = [(w * FGD_PRIOR / total, *rest) for w, *rest in DEFAULT_FGD_WORKLOAD]
        return FragmentationModel(list(self.fgd_window) + prior)

    def _refresh_fgd(self) -> None:
        """Rebuild FGD's model once a quarter of the window is new (a rebuild drops the model's memo)."""
        if self._fgd_pending and (self.fgd_uses_default or 4 * self._fgd_pending >= len(self.fgd_window)):
            self.fgd = self._window_model()
        if self.fgd_uses_default:
            self.fgd_default_cycles += 1

    def demand(self, task: Task, instances: int | None = None) -> Demand | RequestError:
        """The task's normalised demand (cached per task object), or why it is invalid."""
        cached = self._demands.get(task.id)
        if cached is not None and cached[0] is task and instances is None:
            return cached[1]
        n = instances if instances is not None else _start_size(task)
        gpu = task.gpu
        try:
            # A GpuRequest by its fields: equal requests have equal fields, and hashing the tuple skips the
            # dataclass's Python-level __hash__ / __eq__ (one each per task of a 100,000-task backlog).
            req = (GpuRequest, _gpu_fields(gpu)) if type(gpu) is GpuRequest else gpu
            # An autoscaled service's demand differs from a plain task's of the same shape (one_per_node).
            shape = (req, float(task.cpu), float(task.memory_gib), n, task.autoscaled)
            d = self._shapes.get(shape)
        except TypeError:  # an unhashable request object: no sharing between tasks
            shape, d = None, None
        if d is None:
            try:
                d = demand_of(task, self.catalog, n)
            except RequestError as e:
                d = e
            if shape is not None:
                self._shapes[shape] = d
        if instances is None:
            self._demands[task.id] = (task, d)
        return d

    def _drain(self, holding: Holding) -> None:
        """Take capacity a job may still hold off its node (never below nothing: a running task may already count
        the same card, e.g. the preemptor that will get it)."""
        ns = self.node_by_id.get(holding.node_id)
        if ns is None:
            return
        ns.free_cpu -= min(holding.cpu, max(ns.free_cpu, 0.0))
        ns.free_mem -= min(holding.memory_gib, max(ns.free_mem, 0.0))
        for share in holding.devices:
            loc = self.device_at.get(share.device_id)
            if loc is not None and loc[0] is ns:
                i = loc[1]
                ns.dev_free[i] -= min(share.milli, max(ns.dev_free[i], 0))

    def _unshareable(self, cluster, shareable: frozenset) -> frozenset:
        """Shareable models whose cards ``cluster`` cannot run a share of (its capabilities lack their vendor)."""
        caps = cluster.capabilities
        if caps is None or SHARE_ANY_VENDOR in caps:
            return frozenset()
        return frozenset(m for m in shareable if share_capability(self.catalog[m].vendor) not in caps)

    def _run_of(self, rt: RunningTask) -> Run:
        """A running task as a :class:`Run`, its claims subtracted from the (not yet indexed) nodes."""
        task = rt.task
        claims: list[Claim] = []
        eq = 0.0
        for p in rt.placements:
            ns = self.node_by_id.get(p.node_id)
            devs = []
            for share in p.devices:
                loc = self.device_at.get(share.device_id)
                if loc is None:
                    continue
                dns, i = loc
                devs.append((i, share.milli))
                m = self.catalog.get(dns.dev_model[i])
                eq += share.milli / WHOLE * (m.exchange_rate if m else 1.0)
            if ns is not None:
                claim = (ns, float(task.cpu), float(task.memory_gib), tuple(devs))
                ns.free_cpu -= claim[1]
                ns.free_mem -= claim[2]
                for i, milli in claim[3]:
                    ns.dev_free[i] -= milli
                claims.append(claim)
        if rt.gpu_equivalents is not None:
            eq = rt.gpu_equivalents  # the portal's capacity ledger decides what the placements hold
        n = max(1, len(rt.placements))
        model = next((p.gpu_model for p in rt.placements if p.gpu_model), None)
        alt = (model, 0, 0, eq / n)
        q = self.queues.get(task.queue_id)
        rank = CLASS_RANK[q.priority_class] if q else CLASS_RANK[LOW]
        window = rt.window_s
        if window is None and rank == CLASS_RANK[MEDIUM]:
            window = task.window_s or task.expected_duration_s
        run = Run(task, rt.cluster_id, claims, list(rt.placements), alt, rt.started_at, window, rank, self.seq)
        self.seq += 1
        return run

    @property
    def releases(self) -> dict:
        """Expected-end releases per pool key ("cpu" or a GPU model), each list sorted by (end, seq, amount)."""
        self._flush_releases()
        return self._releases

    def _track_releases(self, run: Run, sign: int) -> None:
        """Keep the expected-end release lists of the estimator as runs come and go.

        New entries wait in ``_rel_pending`` and are merged with one sort when the lists are
        read: a cycle that starts thousands of tasks would otherwise pay one list insertion
        (a memmove of the whole list) per start. An entry removed is taken from the sorted list
        or from the pending ones, wherever it is, so preemptions between starts sort nothing.
        """
        if sign < 0:
            releases = self._releases
            for key, entry in run._rel:
                lst = releases.get(key)
                i = bisect_left(lst, entry) if lst else 0
                if lst and i < len(lst) and lst[i] == entry:
                    del lst[i]
                else:
                    self._rel_pending.remove((key, entry))
                self.release_total[key] -= entry[2]
            run._rel = []
            return
        end = run.expected_end()
        if end is None:
            return
        pending = self._rel_pending
        for key, amount in run.held():
            entry = (end, run.seq, amount)
            pending.append((key, entry))
            self.release_total[key] = self.release_total.get(key, 0.0) + amount
            run._rel.append((key, entry))

    def runs_by_end(self) -> list:
        """(expected end, seq, run) of the running tasks that have an expected duration, in that order."""
        pending = self._ends_pending
        if pending:
            self._ends += pending
            self._ends.sort()  # (end, seq) is unique: the runs are never compared
            pending.clear()
        return self._ends

    def _track_end(self, run: Run, sign: int) -> None:
        end = run.expected_end()
        if end is None:
            return
        if sign > 0:
            self._ends_pending.append((end, run.seq, run))
            return
        # From the sorted list or, not merged yet, from the pending entries (no sort: see _track_releases).
        ends = self._ends
        i = bisect_left(ends, (end, run.seq))
        if i < len(ends) and ends[i][2] is run:
            del ends[i]
            return
        pending = self._ends_pending
        for j, entry in enumerate(pending):
            if entry[2] is run:
                del pending[j]
                return

    def _flush_releases(self) -> None:
        """Merge the pending release entries into the sorted lists."""
        pending = self._rel_pending
        if not pending:
            return
        touched = set()
        releases = self._releases
        for key, entry in pending:
            lst = releases.get(key)
            if lst is None:
                lst = releases[key] = []
            lst.append(entry)
            touched.add(key)
        for key in touched:
            releases[key].sort()  # the old part is sorted: a merge of two runs for Timsort
        pending.clear()

    def _charge(self, run: Run, sign: int) -> None:
        """Add (sign=+1) or remove (sign=-1) a run from every usage counter."""
        if self._cycle is not None:
            self._cycle.eligible.clear()
        self._track_releases(run, sign)
        self._track_end(run, sign)
        t = run.task
        if t.max_replicas is not None:
            self.has_elastic = True
        if sign > 0:
            self.running[t.id] = run
        else:
            self.running.pop(t.id, None)
        # run.usage() times sign, added to the counters (written out: this runs for every start).
        n = sign * len(run.placements)
        cpu, mem, gpu = t.cpu * n, t.memory_gib * n, run.alt[3] * n
        p = self.proj_usage.get(t.project_id, ZERO)
        self.proj_usage[t.project_id] = Resources(p.cpu + cpu, p.memory_gib + mem, p.gpu + gpu)
        if not run.rank:
            lo = self.low_usage.get(t.project_id, ZERO)
            self.low_usage[t.project_id] = Resources(lo.cpu + cpu, lo.memory_gib + mem, lo.gpu + gpu)
        self.queue_usage[t.queue_id] = self.queue_usage.get(t.queue_id, 0.0) + gpu
        tu = self.total_usage
        self.total_usage = Resources(tu.cpu + cpu, tu.memory_gib + mem, tu.gpu + gpu)
        self.proj_count[t.project_id] = self.proj_count.get(t.project_id, 0) + sign
        k = (t.project_id, t.kind)
        self.kind_count[k] = self.kind_count.get(k, 0) + sign
        cv = self.clusters.get(run.cluster_id)
        if cv is not None:
            cv.used_gpu += gpu
            cv.running += sign
            cv.per_user[t.owner] = cv.per_user.get(t.owner, 0) + sign

    def resize_charge(self, run: Run, delta_instances: int) -> None:
        """Count replicas added to (or removed from) a running elastic task."""
        if self._cycle is not None:
            self._cycle.eligible.clear()
        self._track_releases(run, -1)
        self._track_releases(run, +1)
        t = run.task
        u = Resources(t.cpu * delta_instances, t.memory_gib * delta_instances, run.alt[3] * delta_instances)
        self.proj_usage[t.project_id] = plus(self.proj_usage.get(t.project_id, ZERO), u)
        if not run.rank:
            self.low_usage[t.project_id] = plus(self.low_usage.get(t.project_id, ZERO), u)
        self.queue_usage[t.queue_id] = self.queue_usage.get(t.queue_id, 0.0) + u.gpu
        self.total_usage = plus(self.total_usage, u)
        self.clusters[run.cluster_id].used_gpu += u.gpu

    def priority_of(self, project_id) -> int:
        """The project's quota priority (0 without a quota)."""
        quota = self.quotas.get(project_id)
        return quota.priority if quota is not None else 0

    def weight_of(self, project_id) -> float:
        """The project's fair-share weight (1 without a quota)."""
        quota = self.quotas.get(project_id)
        return quota.weight if quota is not None else 1.0

    def share_of(self, project_id) -> float:
        """The project's DRF dominant share of the VDC (its usage, less what :meth:`loan_credit` leaves out)."""
        usage = self.proj_usage.get(project_id, ZERO)
        if project_id in self._credited:
            usage = rebalance.apply_adjustment(usage, plus(ZERO, self.loan_credit(project_id), -1))
            return dominant_share(usage, self.cap or self.capacity)
        # Usage vectors are replaced, never changed, when work starts or stops: the share is kept with the one it is of
        # (DRF orders re-read the shares of every queued task's project as tasks start).
        known = self._shares.get(project_id)
        if known is not None and known[0] is usage:
            return known[1]
        share = dominant_share(usage, self.cap or self.capacity)
        self._shares[project_id] = (usage, share)
        return share

    # -- capacity loans (docs/engine.md, Rebalancer) -------------------------------------

    def set_loans(self, loans) -> None:
        """The active capacity loans the quotas carry (``Snapshot.loans``); replace them together with the quotas.

        Fair share counts them as ``settings.loan_billing`` says (:meth:`loan_credit`); with
        ``settings.loans_low_class_only`` only low-class work may run on borrowed capacity (:meth:`fits_own_limit`).
        """
        self.loans = tuple(sorted(loans, key=lambda x: (x.started_at, str(x.id))))
        self.borrowed: dict = {}
        for x in self.loans:
            self.borrowed[x.borrower_id] = plus(self.borrowed.get(x.borrower_id, ZERO), x.amount)
        mode = self.settings.loan_billing
        if mode == LOAN_NEITHER:
            self._credited = {x.borrower_id for x in self.loans}
        elif mode == LOAN_LENDER_CREDITED:
            self._credited = {x.lender_id for x in self.loans}
        else:
            self._credited = set()

    def own_limit(self, project_id) -> Resources | None:
        """The project's quota limit without what it borrowed (None: no quota or no limit)."""
        quota = self.quotas.get(project_id)
        if quota is None or quota.limit is None:
            return None
        b = self.borrowed.get(project_id)
        return quota.limit if b is None else rebalance.apply_adjustment(quota.limit, plus(ZERO, b, -1))

    def fits_own_limit(self, project_id, cls: str, add: Resources) -> bool:
        """With ``settings.loans_low_class_only``, whether work of class ``cls`` adding ``add`` stays off what the
        project borrowed: work above the low class, counted without the project's low work, must fit under the
        project's own limit (what it borrowed is for low work, which the lender's reclaim suspends at once)."""
        if cls == LOW or not self.settings.loans_low_class_only or project_id not in self.borrowed:
            return True
        own = self.own_limit(project_id)
        if own is None:
            return True
        above_low = plus(self.proj_usage.get(project_id, ZERO), self.low_usage.get(project_id, ZERO), -1)
        return fits_under(above_low, add, own)

    def guarantee_for(self, quota, cls: str) -> Resources:
        """The guarantee a task of class ``cls`` reclaims within: as in :meth:`fits_own_limit`, a borrowed
        guarantee backs only low-class work when ``settings.loans_low_class_only``."""
        b = self.borrowed.get(quota.project_id)
        if b is None or cls == LOW or not self.settings.loans_low_class_only:
            return quota.guaranteed
        return rebalance.apply_adjustment(quota.guaranteed, plus(ZERO, b, -1))

    def loan_credit(self, project_id) -> Resources:
        """What fair share leaves out of the project's usage for capacity loans (``settings.loan_billing``).

        "neither": the borrower's usage on its loans; "lender_credited": the part of what the lender lent that
        its borrowers use; "borrower_pays": nothing. Usage on loans is the borrower's usage above its own limit,
        given to its loans oldest first, as billing meters it (:func:`.rebalance.loans_in_use`).
        """
        if project_id not in self._credited:
            return ZERO
        lending = self.settings.loan_billing == LOAN_LENDER_CREDITED
        mine = [x for x in self.loans if (x.lender_id if lending else x.borrower_id) == project_id]
        states = {}
        for b in {x.borrower_id for x in mine}:
            limit = self.own_limit(b)
            if limit is not None:
                states[b] = rebalance.ProjectState(b, limit=limit, used=self.proj_usage.get(b, ZERO))
        in_use = rebalance.loans_in_use(states, [x for x in self.loans if x.borrower_id in states])
        total = ZERO
        for x in mine:
            total = plus(total, in_use.get(x.id, ZERO))
        return total

    # -- events (stateful use) ---------------------------------------------------------

    def submit(self, task: Task) -> None:
        """Queue a new (or requeued) task."""
        if task.id in self.running:
            raise ValueError(f"task {task.id!r} is running; finish it before submitting it again")
        self.queued[task.id] = task
        if self.fgd is not None and self.settings.fgd_workload is None:
            self._learn_shape(task)

    def finish(self, task_id) -> None:
        """A running task ended: give its resources back."""
        self._demands.pop(task_id, None)
        self._eligible_keys.pop(task_id, None)
        run = self.running.get(task_id)
        if run is None:
            self.queued.pop(task_id, None)
            return
        self._release_run(run)

    def _release_run(self, run: Run) -> None:
        self.epoch += 1
        for claim in run.claims:
            self.clusters[claim[0].cluster_id].index.release(claim)
        self._charge(run, -1)

    # -- the cycle ---------------------------------------------------------------------

    def cycle(self, now: float) -> Decisions:
        """Run one scheduling cycle at time ``now``; the decisions are applied to this state.

        The waiting entries are computed as they are read, from inputs frozen at the end of
        the cycle, so reading them after later events or cycles gives the same answer.
        """
        # A cycle allocates many small tuples but no reference cycles; with tens of thousands of
        # live objects the cyclic collector's full passes would cost more than the cycle itself.
        was_enabled = gc.isenabled()
        gc.disable()
        try:
            return self._cycle_run(now)
        finally:
            if was_enabled:
                gc.enable()

    def _cycle_run(self, now: float) -> Decisions:
        cyc = Cycle(now)
        if self._fail_epoch != self.epoch:
            self._fail = set()
            self._fail_by = {}
            self._fail_every = []
            self._fail_epoch = self.epoch
        cyc.fail = self._fail
        cyc.fail_by = self._fail_by
        cyc.fail_every = self._fail_every
        self._cycle = cyc
        if self.fgd is not None and self.settings.fgd_workload is None:
            self._refresh_fgd()
        for run in self._fresh:
            run.fresh = False
        self._fresh = []
        by_queue: dict = {}
        elastic.trim(self, cyc)
        for t in self.queued.values():
            by_queue.setdefault(t.queue_id, []).append(t)
        if self.reservations:
            self._hold_capacity(cyc)
        for cls in (HIGH, MEDIUM, LOW):
            queues = [q for q in self.queues.values() if q.priority_class == cls and q.id in by_queue]
            queues.sort(key=lambda q: (-q.weight, self.queue_rank[q.id]))
            priority_of = self.priority_of if self.has_priorities else None
            share, weight = self.share_of, self.weight_of
            iters = [
                (q, queue_order(q.policy, by_queue[q.id], share, priority_of, now, weight, q.las_thresholds_gpu_s))
                for q in queues
            ]
            self._consider_in_tiers(iters, self._tiers(cls, queues, now) or _one_tier, cls, cyc)
        for qid, tasks in by_queue.items():
            if qid not in self.queues:
                for t in tasks:
                    cyc.waiting.append((t, None, Reason.INVALID_REQUEST, f"unknown queue {qid!r}"))
        elastic.grow(self, cyc)
        waiting = self._waiting(cyc)
        starts = []
        for task_id, (cid, placements, window) in cyc.starts.items():
            starts.append(Start(task_id, cid, tuple(placements), window))
            self.queued.pop(task_id, None)
        resizes = []
        for task_id, (run, added, removed) in cyc.resizes.items():
            why = cyc.why.get(task_id, "elastic")
            resizes.append(Resize(task_id, len(run.placements), tuple(added), tuple(removed), why))
        self.last_reservations = {
            tid: (t_res, frozenset(self.nodes[pos].node.id for pos in nodes)) for t_res, nodes, _r, tid in cyc.class_res
        }
        held = self.last_reservations
        self._res_cache = {tid: v for tid, v in self._res_cache.items() if tid in held}
        self._cycle = None
        return Decisions(tuple(starts), tuple(cyc.preempts), tuple(resizes), waiting)

    def _hold_capacity(self, cyc: Cycle) -> None:
        """Resolve the capacity reservations for this cycle; drain the nodes of those that say so.

        Runs after the cycle's queues were collected, so drained work waits (requeued) until the next cycle.
        """
        holds = reservations.Holds(self, self.reservations, cyc.now)
        if not holds.held:
            return
        cyc.holds = holds
        before = len(cyc.preempts)
        reservations.drain(self, holds, cyc)
        if len(cyc.preempts) != before:
            cyc.fail.clear()
            self._fail_epoch = self.epoch
        for r, nodes in holds.held:
            # Elastic growth keeps off held nodes (it reads every reservation of the cycle).
            cyc.reservation[("capacity", r.id)] = (r.start, nodes)

    def _tiers(self, cls: str, queues: list, now: float):
        """How tasks of a class are tiered within the cycle, or None when queue order alone decides.

        Tier 0: medium tasks that waited longer than their queue's ``reserve_after_s`` (they reserve capacity, so
        they go before the work their reservation must hold off). Tier 1: tasks whose project (or queue) stays
        within its guarantee with them: they take freed capacity directly instead of reclaiming it one cycle
        after a borrower took it. Tier 2: the rest. Queue order is kept within a tier.
        """
        if cls == HIGH:
            return None
        guarantees = any(q.guaranteed_gpu > 0 for q in queues) or any(
            qt.guaranteed != ZERO for qt in self.quotas.values()
        )
        starving = cls == MEDIUM and any(q.reserve_after_s is not None for q in queues)
        if not guarantees and not starving:
            return None

        def tier_of(task: Task, q) -> int:
            if starving and q.reserve_after_s is not None and now - task.submit_time > q.reserve_after_s:
                return 0
            if guarantees:
                d = self.demand(task)
                if isinstance(d, Demand) and any(preemption.reclaim_rights(self, task, q, d, d.alternatives)):
                    return 1
            return 2

        return tier_of

    def _consider_in_tiers(self, iters: list, tier_of, cls: str, cyc: Cycle) -> None:
        """Consider a class's tasks tier by tier (see :meth:`_tiers`); queues take turns within each tier.

        A task's tier is read when its turn comes (starts change guarantees); a task found in a later tier
        waits there in its queue order.
        """
        if tier_of is _one_tier:
            # Plain queue order: the queues take turns until all are drained.
            consider = self._consider
            while iters:
                alive = []
                for q, it in iters:
                    task = next(it, None)
                    if task is not None:
                        alive.append((q, it))
                        consider(task, q, cls, cyc)
                iters = alive
            return
        later: dict = {q.id: ([], []) for q, _it in iters}
        seq = 0
        while iters:
            alive = []
            for q, it in iters:
                task = next(it, None)
                if task is None:
                    continue
                alive.append((q, it))
                tier = tier_of(task, q)
                if tier == 0:
                    self._consider(task, q, cls, cyc)
                else:
                    later[q.id][tier - 1].append((seq, task))
                seq += 1
            iters = alive
        for tier in (1, 2):
            lists = [(self.queues[qid], lists_[tier - 1]) for qid, lists_ in later.items()]
            if tier == 2:
                for _q, lst in lists:
                    lst.sort(key=lambda e: e[0])
            pos = 0
            while True:
                any_left = False
                for q, lst in lists:
                    if pos >= len(lst):
                        continue
                    any_left = True
                    seq_, task = lst[pos]
                    if tier == 1 and tier_of(task, q) == 2:
                        later[q.id][1].append((seq_, task))
                    else:
                        self._consider(task, q, cls, cyc)
                if not any_left:
                    break
                pos += 1

    def _wait(self, cyc: Cycle, task: Task, d, reason: str, message: str) -> None:
        if isinstance(d, Demand):
            if d.instances > 1:
                cyc.gang_waits = True
            if reason == Reason.QUOTA_EXCEEDED:
                cyc.quota_waits = True
        else:
            d = None
        cyc.waiting.append((task, d, reason, message))

    def _consider(self, task: Task, q, cls: str, cyc: Cycle) -> None:
        """One queued task: behind the blocked head of a strict queue with nothing to check on the way there, the
        wait :meth:`_consider_full` would come to, without the checks that cannot stop it; else in full."""
        blocked = cyc.queue_blocked.get(q.id)
        if blocked and q.max_gpu is None and self.cap is None and q.policy in (FIFO, DRF):
            d = self.demand(task)
            quota = self.quotas.get(task.project_id)
            if (
                type(d) is Demand
                and (quota is None or not (quota.budget_exhausted or quota.enforce))
                and (cls != MEDIUM or task.expected_duration_s)
            ):
                keys = _block_keys(d)
                if not blocked.isdisjoint(keys) and (cls == LOW or not self._may_reserve(task, q, cls, cyc)):
                    # What _consider_full does here: no admission check can stop it (no enforced quota, no exhausted
                    # budget, no queue or VDC cap) and it may hold no reservation.
                    if d.instances > 1:
                        cyc.gang_waits = True
                    cyc.waiting.append((task, d, Reason.QUEUE_ORDER, QUEUE_ORDER_MESSAGE))
                    self._starving(cyc, cls, keys, d)
                    return
        self._consider_full(task, q, cls, cyc)

    def _consider_full(self, task: Task, q, cls: str, cyc: Cycle) -> None:
        """Admission checks, then placement, then preemption for one queued task."""
        d = self.demand(task)
        if isinstance(d, RequestError):
            self._wait(cyc, task, None, d.code, str(d))
            return
        quota = self.quotas.get(task.project_id)
        if quota is not None and quota.budget_exhausted:
            self._wait(cyc, task, d, Reason.BUDGET_EXHAUSTED, "the project's budget is exhausted")
            return
        if cls == MEDIUM and not task.expected_duration_s:
            self._wait(cyc, task, d, Reason.INVALID_REQUEST, "a medium task needs an expected duration")
            return
        enforce = quota is not None and quota.enforce
        pid = task.project_id
        if enforce and quota.max_concurrent is not None and self.proj_count.get(pid, 0) >= quota.max_concurrent:
            self._wait(cyc, task, d, Reason.MAX_CONCURRENT, f"project runs {quota.max_concurrent} tasks already")
            return
        if enforce and task.kind in quota.max_per_kind:
            limit = quota.max_per_kind[task.kind]
            if self.kind_count.get((pid, task.kind), 0) >= limit:
                self._wait(cyc, task, d, Reason.KIND_LIMIT, f"project runs {limit} {task.kind} tasks already")
                return
        alts = d.alternatives
        if enforce and quota.limit is not None:
            usage = self.proj_usage.get(pid, ZERO)
            alts = tuple(a for a in alts if fits_under(usage, d.vector(a), quota.limit))
            message = "the project's quota limit would be exceeded"
            if alts and pid in self.borrowed:
                alts = tuple(a for a in alts if self.fits_own_limit(pid, cls, d.vector(a)))
                message += " (its borrowed capacity takes low-class work only)"
            if not alts:
                self._wait(cyc, task, d, Reason.QUOTA_EXCEEDED, message)
                return
        if q.max_gpu is not None:
            used = self.queue_usage.get(q.id, 0.0)
            alts = tuple(a for a in alts if used + a[3] * d.instances <= q.max_gpu + EPS)
            if not alts:
                self._wait(cyc, task, d, Reason.QUEUE_CAPACITY, "the queue is at its maximum capacity")
                return
        if self.cap is not None:
            alts = tuple(a for a in alts if fits_under(self.total_usage, d.vector(a), self.cap))
            if not alts:
                self._wait(cyc, task, d, Reason.VDC_CAPACITY, "the VDC is at its capacity cap")
                return
        keys = _block_keys(d)
        if q.policy in (FIFO, DRF):
            blocked = cyc.queue_blocked.get(q.id)
            if blocked and not blocked.isdisjoint(keys):
                message = QUEUE_ORDER_MESSAGE
                if cls != LOW and self._may_reserve(task, q, cls, cyc):
                    # Behind its head it still holds a reservation, so later lower-class work does not take what
                    # frees up for it (every blocked high task, and medium past reserve_after, holds one).
                    cands = self._eligible(task, cyc)
                    if cands and self._reserve_across_classes(task, q, cls, d, alts, cands, cyc) is not None:
                        message += "; holds a reservation that later lower-class work may not delay"
                self._wait(cyc, task, d, Reason.QUEUE_ORDER, message)
                self._starving(cyc, cls, keys, d)
                return
        aside = protect = False
        if cls == LOW and cyc.hm_blocked:
            # Low work runs only on otherwise idle capacity: a preemptible low task that was never preempted may
            # take idle cards that waiting high / medium work cannot use yet (it is suspended at once when they
            # can), preferring nodes where none of them could fit before it is expected to end; a preempted one
            # starts again only when none of them that could use those resources waits
            # (docs/rules.md#priority-classes): only on such
            # nodes (:meth:`_place_aside`). A non-preemptible one keeps off the models they wait for.
            if task.preemptible:
                aside = any((a[0] or "cpu") in cyc.hm_blocked for a in alts)
                protect = aside and task.preemptions > 0
            else:
                alts = tuple(a for a in alts if (a[0] or "cpu") not in cyc.hm_blocked)
                if not alts:
                    message = "high or medium work waits for these resources"
                    self._wait(cyc, task, d, Reason.WAITING_FOR_HIGHER_CLASS, message)
                    return
        # With cluster task limits, starts can take clusters out of a task's eligible ones; without them the set is
        # fixed for the cycle (only its order changes), so a low task may be decided from the memo first.
        cands = self._eligible(task, cyc) if self.task_limits else None
        if cands is not None and not cands:
            self._no_cluster(cyc, task, d)
            return
        excluded, token = None, None
        res = cyc.reservation.get(q.id) if q.policy == BACKFILL or q.policy in RESERVING_POLICIES else None
        if res is not None:
            t_res, nodes = res
            dur = task.expected_duration_s
            # Work that ends (by its expected duration) before the reservation starts may use its nodes (EASY
            # backfill, under every reserving policy) when the head's start is known from expected ends (None: it
            # waits for unestimated work); the rest keeps off them, so nodes are not drained while short work that
            # ends in time could run there.
            if dur is None or t_res is None or cyc.now + dur > t_res + EPS:
                excluded, token = nodes, res
        held = self._held_off(task, cls, cyc) if cyc.class_res else None
        if held:
            excluded = held if excluded is None else excluded | held
            token = ("held", excluded)
        keep_off = held or None
        off, blocking = cyc.holds.off_limits(task) if cyc.holds is not None else (None, None)
        if off:
            base, base_token = excluded, token
            excluded = off if excluded is None else excluded | off
            token = ("held", excluded)
            keep_off = off if keep_off is None else keep_off | off
        memo = None
        if cls == LOW and off is None:
            rights = preemption.reclaim_rights(self, task, q, d, alts)
            if not rights[0] and not rights[1] and q.policy != LAS:
                # Without reclaim rights, a low task that finds no room at all waits for reasons that depend only
                # on what is keyed here: an identical earlier task of this cycle decided it, unless capacity was
                # given back since (:meth:`_remember`).
                where = id(cands) if cands is not None else self._eligible_key(task)
                memo = (q.id, id(d), alts, aside, protect, where, token)
                hit = cyc.low_memo.get(memo)
                if (
                    hit is not None
                    and hit[0] == self.epoch
                    and (hit[1] is None or hit[1] == len(cyc.starts))
                    and hit[2] is d
                    and (cands is None or hit[3] is cands)
                ):
                    _epoch, _starts, _d, _cands, reason, message, starving, blocks = hit
                    self._wait(cyc, task, d, reason, message)
                    if starving:
                        self._starving(cyc, cls, keys, d)
                    if blocks:
                        cyc.queue_blocked[q.id].update(keys)
                    return
        if cands is None:
            cands = self._eligible(task, cyc)
            if not cands:
                self._no_cluster(cyc, task, d)
                return
        if aside:
            placed, first = self._place_aside(task, d, alts, cands, excluded, token, cyc)
            if placed is None:
                if protect:
                    message = "high or medium work waits for these resources"
                    self._wait(cyc, task, d, Reason.WAITING_FOR_HIGHER_CLASS, message)
                    if first is None and memo is not None:
                        self._remember(cyc, memo, d, cands, Reason.WAITING_FOR_HIGHER_CLASS, message, False, False)
                    return
                if first is not None:  # never preempted: the placement it would have had
                    placed = first
                    for c in first[2]:
                        first[0].index.take(c)
        else:
            placed = self._place(d, alts, cands, excluded, token, cyc)
        if placed is not None:
            self._start(task, q, cls, d, placed, cyc)
            return
        if excluded is not None:
            trial = self._place(d, alts, cands, None, None, cyc)
            if trial is not None:
                self._undo(trial)
                if off:
                    # Would it fit if only the capacity reservations were lifted? Then they are what it waits for.
                    freed = trial if base is None else self._place(d, alts, cands, base, base_token, cyc)
                    if freed is not None:
                        if freed is not trial:
                            self._undo(freed)
                        self._wait(cyc, task, d, Reason.CAPACITY_RESERVED, cyc.holds.message(blocking))
                        cyc.not_before[task.id] = blocking.end
                        self._starving(cyc, cls, keys, d)
                        return
                message = "would delay the reservation of the queue's head task"
                if held:
                    message = "would delay capacity reserved for a higher-class or long-waiting task"
                self._wait(cyc, task, d, Reason.WAITING_FOR_RESERVATION, message)
                self._starving(cyc, cls, keys, d)
                if memo is not None:
                    self._remember(cyc, memo, d, cands, Reason.WAITING_FOR_RESERVATION, message, True, False)
                return
        # (A low task without reclaim rights has no plan: it may not preempt anyone.)
        plan = None if memo is not None else preemption.plan(self, task, q, cls, d, alts, cands, cyc, keep_off)
        if plan is not None:
            self._apply_plan(plan, task, q, cls, d, cyc, keep_off)
            return
        if not any(cv.index.could_ever_fit(alt, d.cpu, d.memory_gib) for cv in cands for alt in alts):
            # Waiting cannot help, so it must not hold back queues or low work either.
            message = "larger than any node of the eligible clusters"
            self._wait(cyc, task, d, Reason.INSUFFICIENT_CAPACITY, message)
            if memo is not None:
                self._remember(cyc, memo, d, cands, Reason.INSUFFICIENT_CAPACITY, message, False, False)
            return
        reserved = self._reserve_across_classes(task, q, cls, d, alts, cands, cyc)
        if reserved is not None:
            t_res, nodes = reserved
            when = "now" if t_res <= cyc.now + EPS else f"in {round(t_res - cyc.now)} s"
            count = len(nodes)
            self._wait(
                cyc,
                task,
                d,
                Reason.HOLDS_RESERVATION,
                f"not enough free capacity; holds a reservation on {count} node{'s' if count != 1 else ''} "
                f"(expected free {when}) that later lower-class work may not delay",
            )
        else:
            self._wait(cyc, task, d, Reason.INSUFFICIENT_CAPACITY, "not enough free capacity on eligible clusters")
        self._starving(cyc, cls, keys, d)
        if q.policy in (FIFO, DRF):
            cyc.queue_blocked.setdefault(q.id, set()).update(keys)
        elif q.policy == BACKFILL and q.id not in cyc.reservation:
            cyc.reservation[q.id] = backfill.reserve(self, d, alts, cands, cyc.now)
        elif q.policy in RESERVING_POLICIES and q.id not in cyc.reservation:
            cyc.reservation[q.id] = drain_reservation(self, d, alts, cands, cyc.now)
        if memo is not None:
            message = "not enough free capacity on eligible clusters"
            blocks = q.policy in (FIFO, DRF)
            self._remember(cyc, memo, d, cands, Reason.INSUFFICIENT_CAPACITY, message, True, blocks)

    def _remember(self, cyc: Cycle, memo: tuple, d: Demand, cands, reason: str, message: str, starving, blocks) -> None:
        """Record how a low task without reclaim rights that found no room at all was decided, for identical
        tasks later in the cycle (:meth:`_consider`): the wait, and whether it marks its models as wanted
        (``starving``) and blocks its queue (``blocks``).

        Valid until capacity is given back: until then a placement that failed fails again (taking capacity never
        makes one fit) and the keyed reservation, alternatives and eligible clusters are the same (``d`` and
        ``cands`` are kept so their ids are not reused). A wait for a reservation (its trial placement without
        the reserved nodes succeeded) holds only until the next start too, which may take that room.
        """
        starts = len(cyc.starts) if reason == Reason.WAITING_FOR_RESERVATION else None
        cyc.low_memo[memo] = (self.epoch, starts, d, cands, reason, message, starving, blocks)

    def _no_cluster(self, cyc: Cycle, task: Task, d: Demand) -> None:
        message = "no enabled, healthy cluster matches the task"
        if task.max_replicas is not None:
            message += " (elastic tasks run only on clusters that can resize a running job, e.g. Kubernetes)"
        usable = [cv.cluster for cv in self.clusters.values() if cv.usable]
        if task.needs and usable and not any(c.capabilities is None or task.needs <= c.capabilities for c in usable):
            missing = sorted({n for c in usable for n in task.needs - c.capabilities})
            message += f" (none of its healthy clusters can run what it needs: {', '.join(missing)})"
        self._wait(cyc, task, d, Reason.NO_ELIGIBLE_CLUSTER, message)

    def _reserve_across_classes(self, task: Task, q, cls: str, d: Demand, alts, cands, cyc: Cycle):
        """A high task (or a medium task waiting past its queue's ``reserve_after_s``) that found no room
        reserves the nodes where it will start earliest; returns (start time, node positions) or None.

        Every such task holds one, in the order the cycle considers them (high first, then long-waiting medium,
        each class in queue order): a later holder's reservation is worked out without the nodes earlier ones
        hold (on them if it fits nowhere else), and the reservations of a cycle hold at most
        ``settings.reserved_nodes_max_fraction`` of the nodes, and there are at most ``RESERVATIONS_PER_CYCLE`` of
        them (a holder past either bound waits without one).
        """
        if not self._may_reserve(task, q, cls, cyc):
            return None
        now = cyc.now
        held = cyc.class_res_nodes
        bound = max(1, int(self.settings.reserved_nodes_max_fraction * len(self.nodes)))
        others = frozenset(held)
        cached = self._res_cache.get(task.id)
        if (
            cached is not None
            and cached[0] == self.epoch
            and cached[1] is d
            and cached[2][0] >= now
            and cached[4] == others
            and all(_node_state(self.nodes[pos]) == state for pos, state in cached[3])
        ):
            # Nothing was given back anywhere and nothing changed on the reserved nodes: the same reservation.
            res = cached[2]
        else:
            # From running tasks' expected ends only: counting what the holder might preempt as free "now"
            # promised room that the preemption plan had just failed to make, and held it idle (trace replays).
            res = backfill.reserve(self, d, alts, cands, now, others or None)
            if res is None and others:
                res = backfill.reserve(self, d, alts, cands, now)
            if res is None:
                return None
            states = tuple((pos, _node_state(self.nodes[pos])) for pos in res[1])
            self._res_cache[task.id] = (self.epoch, d, res, states, others)
        if len(held | res[1]) > bound:
            return None
        held |= res[1]
        cyc.class_res.append((res[0], res[1], CLASS_RANK[cls], task.id))
        # Elastic growth keeps off reserved nodes too (it reads every reservation of the cycle).
        cyc.reservation[("class", task.id)] = res
        return res

    def _may_reserve(self, task: Task, q, cls: str, cyc: Cycle) -> bool:
        """Whether the task may hold a cross-class reservation in this cycle (:meth:`_reserve_across_classes`):
        high, or medium past its queue's ``reserve_after_s``, while the cycle's reservations are within bounds."""
        if cls == LOW:
            return False
        if cls == MEDIUM and (q.reserve_after_s is None or cyc.now - task.submit_time <= q.reserve_after_s):
            return False
        if cyc.res_bound is None:
            cyc.res_bound = max(1, int(self.settings.reserved_nodes_max_fraction * len(self.nodes)))
        return len(cyc.class_res_nodes) < cyc.res_bound and len(cyc.class_res) < RESERVATIONS_PER_CYCLE

    def _held_off(self, task: Task, cls: str, cyc: Cycle) -> frozenset | None:
        """Reserved nodes this task must keep off: those of higher-class (or, for medium, long-waiting medium)
        holders that it would still occupy when the reservation starts and that could not preempt it."""
        if cls == HIGH:
            return None  # high tasks take turns among themselves as before
        if cls == LOW and task.preemptible:
            # Holders are high or medium (low work never reserves across classes) and may preempt it.
            return None
        rank = CLASS_RANK[cls]
        now = cyc.now
        dur = task.expected_duration_s
        end = None if dur is None else now + dur
        window_end = None
        if cls == MEDIUM and task.preemptible:
            window = task.window_s if task.window_s is not None else dur
            window_end = None if window is None else now + window
        out: set = set()
        for t_res, nodes, holder_rank, holder in cyc.class_res:
            if holder_rank < rank or holder == task.id:
                continue
            if end is not None and end <= t_res + EPS:
                continue  # gone (by its expected duration) before the reservation starts
            if cls == LOW and task.preemptible and holder_rank > rank:
                continue  # the holder may preempt it
            if window_end is not None and holder_rank == CLASS_RANK[HIGH] and window_end <= t_res + EPS:
                continue  # its window is over by then, so the high holder may preempt it
            out |= nodes
        return frozenset(out) if out else None

    def _starving(self, cyc: Cycle, cls: str, keys: frozenset, d: Demand) -> None:
        """A task waits for capacity of these kinds: elastic growth (and, for high/medium, low work) keeps off.

        ``keys`` are always ``_block_keys(d)`` and the sets only grow within a cycle, so a demand and class marked
        once are not marked again (the tail of a blocked queue, identical low tasks)."""
        marked = cyc.starving_marked
        mkey = (id(d), cls)
        if marked.get(mkey) is d:
            return
        marked[mkey] = d
        cyc.starved |= keys
        if cls != LOW:
            cyc.hm_blocked |= keys
            key = (d.key, cls)
            if key not in cyc.hm_waiting:
                cyc.hm_waiting[key] = (d, CLASS_RANK[cls])
                cyc.hm_needs = None
                cyc.hm_fit = {}
                cyc.hm_dominated = {}

    def _place_aside(self, task: Task, d: Demand, alts, cands, excluded, token, cyc: Cycle):
        """Place a low task on nodes where no waiting high / medium task could fit before the low task is expected
        to end (:meth:`_hm_fit_time`), trying ``PROTECTED_TRIES`` placements. Returns (that placement, claims
        taken, or None; the first placement found anywhere, claims not taken, or None when nothing fits)."""
        dur = task.expected_duration_s
        horizon = float("inf") if dur is None else cyc.now + dur
        first = None
        for _ in range(PROTECTED_TRIES):
            placed = self._place(d, alts, cands, excluded, token, cyc)
            if placed is None:
                break
            self._undo(placed)  # the fit times are of the nodes without this placement
            if first is None:
                first = placed
                if self._always_in_the_way(d, alts, cyc):
                    break
            bad = frozenset([c[0].pos for c in placed[2] if self._hm_fit_time(c[0], cyc) < horizon])
            if not bad:
                for c in placed[2]:
                    placed[0].index.take(c)
                return placed, first
            excluded = bad if excluded is None else excluded | bad
            token = ("held", excluded)
        return None, first

    def _always_in_the_way(self, d: Demand, alts, cyc: Cycle) -> bool:
        """Whether some waiting high / medium task could fit right now wherever one instance of ``d`` fits with any of
        ``alts``: it needs no more CPU and memory, and (of the same model) no more cards, each no fuller. Then every
        node this task could be placed on is one that waiting work could use now, so no other placement is tried."""
        key = (id(d), alts)
        known = cyc.hm_dominated.get(key)
        if known is not None:
            return known[0]
        needs = _hm_needs(cyc)
        cpu, mem = d.cpu, d.memory_gib
        out = True
        for model, cards, milli, _eq in alts:
            count, free = (cards, WHOLE) if cards else (1 if model is not None else 0, milli)
            if not any(
                n_cpu <= cpu
                and n_mem <= mem
                and (n_model is None or (n_model == model and n_count <= count and n_milli <= free))
                for _rank, n_model, n_count, n_milli, n_cpu, n_mem in needs
            ):
                out = False
                break
        cyc.hm_dominated[key] = (out, d)  # d is kept, so its id is not reused within the cycle
        return out

    def _hm_fit_time(self, ns: NodeState, cyc: Cycle) -> float:
        """The earliest time one instance of a waiting high / medium task could fit on ``ns`` (inf: never).

        docs/rules.md#priority-classes starts a preempted low task again "only when no high or medium task that could
        use those resources
        is waiting". A waiting task cannot use any capacity at once (it found no room even after every preemption it
        may make), so "could use" is read over the time the low task would hold the capacity: on a node where no
        waiting task could fit before the low task is expected to end, it is not in their way and will not be thrown
        out for them. Running work the waiting task may preempt (preemptible low work; for a high task, medium work
        whose window is over) counts as gone now, and so does work without an expected duration and elastic work
        (it may go at any time); the rest goes at its expected end (for a high task, a medium task's window end if
        that is earlier).
        """
        t = cyc.hm_fit.get(ns.pos)
        if t is not None:
            return t
        t = float("inf")
        for rank, model, count, milli, cpu, mem in _hm_needs(cyc):
            if model is not None and model not in ns.models:
                continue
            releases = cyc.hm_releases.get(rank)
            if releases is None:
                releases = cyc.hm_releases[rank] = self._releases_for(rank, cyc.now)
            t = min(t, _earliest_fit(ns, model, count, milli, cpu, mem, releases.get(ns.pos, ()), cyc.now))
            if t <= cyc.now:
                break
        cyc.hm_fit[ns.pos] = t
        return t

    def _releases_for(self, rank: int, now: float) -> dict:
        """Per node position, (time, seq, claim) in time order: when running work gives its claims back to a waiting
        task of class rank ``rank`` (see :meth:`_hm_fit_time`)."""
        per_node: dict = {}
        for run in self.running.values():
            t = run.task
            end = run.expected_end()
            if end is None or run.elastic_min() is not None or (run.rank == CLASS_RANK[LOW] and t.preemptible):
                end = now
            elif rank == CLASS_RANK[HIGH] and run.rank == CLASS_RANK[MEDIUM] and t.preemptible:
                window_end = run.window_end()
                if window_end is not None:
                    end = min(end, window_end)
            for claim in run.claims:
                per_node.setdefault(claim[0].pos, []).append((max(end, now), run.seq, claim))
        for lst in per_node.values():
            lst.sort(key=lambda e: e[:2])
        return per_node

    def _eligible(self, task: Task, cyc: Cycle) -> list[ClusterView]:
        """Cluster filters (enabled, healthy, type, capabilities, labels, task limits, resizable for elastic
        tasks), then the VDC's strategy order.

        The answer depends on the task only through a few fields, and on the clusters only
        through counters that change when something starts or stops, so it is cached per
        cycle until then.
        """
        key = self._eligible_key(task)
        out = cyc.eligible.get(key)
        if out is None:
            out = self._eligible_uncached(task, key, cyc)
            cyc.eligible[key] = out
        return out

    def _eligible_key(self, task: Task) -> tuple:
        """The task fields its eligible clusters depend on (kept per task object)."""
        cached = self._eligible_keys.get(task.id)
        if cached is not None and cached[0] is task:
            return cached[1]
        key = (
            task.cluster_type,
            task.needs,
            task.max_replicas is not None,
            tuple(sorted(task.required_labels.items())) if task.required_labels else (),
            task.owner if self.per_user_limits else None,
            task.preferred_clusters,
        )
        self._eligible_keys[task.id] = (task, key)
        return key

    def _eligible_uncached(self, task: Task, key: tuple, cyc: Cycle) -> list[ClusterView]:
        # The filters on fixed cluster fields hold for the whole cycle; starts and stops only change the
        # task limits and the strategy's order.
        out = cyc.eligible_static.get(key)
        if out is None:
            out = []
            for cv in self.clusters.values():
                c = cv.cluster
                if not cv.usable or (task.cluster_type and c.type != task.cluster_type):
                    continue
                if task.max_replicas is not None and not c.resizable:
                    continue
                if c.capabilities is not None and not task.needs <= c.capabilities:
                    continue
                if any(c.labels.get(k) != v for k, v in task.required_labels.items()):
                    continue
                out.append(cv)
            cyc.eligible_static[key] = out
        if self.task_limits:
            out = [
                cv
                for cv in out
                if (cv.cluster.max_total_tasks is None or cv.running < cv.cluster.max_total_tasks)
                and (
                    cv.cluster.max_tasks_per_user is None
                    or cv.per_user.get(task.owner, 0) < cv.cluster.max_tasks_per_user
                )
            ]
        if len(out) > 1:
            strategy = self.strategy
            # (key, order) is unique per cluster, so the views themselves are never compared.
            return [e[2] for e in sorted([(strategy(cv, task), cv.order, cv) for cv in out])]
        return list(out)

    def _place(self, d: Demand, alts, cands, excluded, token, cyc: Cycle):
        """Place all instances on one cluster (first alternative / cluster that fits); claims are taken."""
        n = d.instances
        cpu, mem = d.cpu, d.memory_gib
        fail = cyc.fail
        by = cyc.fail_by
        # For one instance, best / first fit's search is as cheap as the could_fit pre-check and finds nothing
        # exactly when it says no; the other scorers scan nodes, so the pre-check stays.
        precheck = n > 1 or self.scorer not in (BEST_FIT, FIRST_FIT)
        # A placement that failed leaves every (cluster, alternative) key below in ``fail``, so the same request on
        # the same clusters fails again until ``fail`` is cleared: one lookup instead of one per pair.
        every = ("every", alts, cpu, mem, n, token, d.one_per_node, tuple([cv.order for cv in cands]))
        if every in fail:
            return None
        for cv in cands:
            index = cv.index
            if n == 1 and len(alts) > 1:
                # One instance: the node scorer chooses among the acceptable models too.
                viable = []
                for alt in alts:
                    fkey = (cv.order, alt, cpu, mem, n, token)
                    if fkey not in fail:
                        if index.could_fit(alt[0], alt[1], alt[2]):
                            viable.append(alt)
                        else:
                            fail.add(fkey)
                            by.setdefault((cv.order, alt[0]), []).append(fkey)
                if not viable:
                    continue
                found = index.find_best(viable, cpu, mem, self.scorer, excluded, self.fgd)
                if found is not None:
                    claim, alt = found
                    index.take(claim)
                    return (cv, alt, [claim])
                for alt in viable:
                    fkey = (cv.order, alt, cpu, mem, n, token)
                    fail.add(fkey)
                    by.setdefault((cv.order, alt[0]), []).append(fkey)
                continue
            for alt in alts:
                fkey = (cv.order, alt, cpu, mem, n, token, d.one_per_node)
                if fkey in fail:
                    continue
                if precheck and not index.could_fit(alt[0], alt[1], alt[2], n):
                    fail.add(fkey)
                    by.setdefault((cv.order, alt[0]), []).append(fkey)
                    continue
                claims = self.place_gang(index, alt, cpu, mem, n, excluded, d.one_per_node)
                if claims is not None:
                    return (cv, alt, claims)
                fail.add(fkey)
                by.setdefault((cv.order, alt[0]), []).append(fkey)
        fail.add(every)
        cyc.fail_every.append(every)
        return None

    def place_gang(self, index: ClusterIndex, alt, cpu: float, mem: float, n: int, excluded, one_per_node=False):
        """Take claims for ``n`` instances on one cluster, or take nothing and return None.

        ``one_per_node`` (an autoscaled service, ``Demand.one_per_node``) puts each instance on a node of its own
        when the cluster is a Slurm one, as :func:`elastic.grow` does for its later replicas.
        """
        spread = one_per_node and self.clusters[index.cluster_id].cluster.type == "slurm"
        claims = []
        for _ in range(n):
            claim = index.find(alt, cpu, mem, self.scorer, excluded, self.fgd)
            if claim is None:
                for c in claims:
                    index.release(c)
                return None
            index.take(claim)
            claims.append(claim)
            if spread:
                excluded = (excluded or frozenset()) | {claim[0].pos}
        return claims

    def _undo(self, placed) -> None:
        cv, _alt, claims = placed
        for c in claims:
            cv.index.release(c)

    def placements_of(self, alt, claims) -> list[InstancePlacement]:
        """Output placements for claims on the index."""
        out = []
        model = alt[0]
        for ns, _cpu, _mem, devs in claims:
            ids = ns.dev_ids
            out.append(InstancePlacement(ns.node.id, tuple([DeviceShare(ids[i], milli) for i, milli in devs]), model))
        return out

    def _start(self, task: Task, q, cls: str, d: Demand, placed, cyc: Cycle) -> None:
        cv, alt, claims = placed
        placements = self.placements_of(alt, claims)
        window = None
        if cls == MEDIUM:
            window = task.window_s if task.window_s is not None else task.expected_duration_s
        run = Run(task, cv.cluster.id, list(claims), placements, alt, cyc.now, window, CLASS_RANK[cls], self.seq)
        self.seq += 1
        run.fresh = True
        self._fresh.append(run)
        self._charge(run, +1)
        cyc.starts[task.id] = (cv.cluster.id, placements, window)

    def _apply_plan(self, plan, task: Task, q, cls: str, d: Demand, cyc: Cycle, excluded=None) -> None:
        """Carry out a preemption plan: shrink / evict the victims, then start the task."""
        freed = [claim[0] for _run, claim in plan.shrinks]
        freed += [c[0] for run, _reason in plan.victims for c in run.claims]
        for run, claim in plan.shrinks:
            self._shrink(run, claim, cyc)
            cyc.why[run.task.id] = f"gives replicas back to {task.id!r} ({cls} class) before anyone is preempted"
        for run, reason in plan.victims:
            self._evict(run, reason, task, cyc)
        self.epoch += 1
        self._fail_epoch = self.epoch
        _forget_failures(cyc, freed, self.clusters)
        token = None if excluded is None else ("held", excluded)
        placed = self._place(d, plan.alts, [plan.cluster], excluded, token, cyc)
        if placed is None:
            raise AssertionError("preemption plan did not free enough capacity")
        self._start(task, q, cls, d, placed, cyc)

    def _shrink(self, run: Run, claim: Claim, cyc: Cycle) -> None:
        i = run.claims.index(claim)
        run.claims.pop(i)
        cyc.units.clear()
        cyc.unit_nodes.clear()
        run.changed()
        removed = run.placements.pop(i)
        self.clusters[run.cluster_id].index.release(claim)
        self.resize_charge(run, -1)
        entry = cyc.resizes.setdefault(run.task.id, (run, [], []))
        if removed in entry[1]:
            entry[1].remove(removed)
        else:
            entry[2].append(removed)
        if run.task.id in cyc.starts:
            cid, _p, window = cyc.starts[run.task.id]
            cyc.starts[run.task.id] = (cid, list(run.placements), window)

    def _evict(self, run: Run, reason: str, by: Task, cyc: Cycle) -> None:
        task = run.task
        q = self.queues.get(task.queue_id)
        claims = len(run.claims)
        self._release_run(run)
        new_window = None
        if run.rank == CLASS_RANK[MEDIUM]:
            floor = q.window_floor_s if q else 0.0
            base = run.window_s if run.window_s is not None else (task.expected_duration_s or 0.0)
            # Halved down to the queue's floor, and never longer than the window it had
            # (docs/rules.md#priority-classes).
            new_window = min(base, max(floor, base / 2))
        msg = {
            "higher_class": f"preempted by {by.id!r}, a higher-class task that needs its resources",
            "quota_reclaim": f"project of {by.id!r} reclaims its guaranteed quota",
            "queue_reclaim": f"queue of {by.id!r} reclaims its guaranteed capacity",
            "las_demotion": f"its attained service passed its queue's LAS threshold; {by.id!r} has less",
        }[reason]
        lost = max(0.0, cyc.now - run.started_at) * run.alt[3] * claims
        cyc.preempts.append(Preempt(task.id, reason, by.id, msg, True, new_window, lost))
        cyc.resizes.pop(task.id, None)
        requeued = replace(task, preemptions=task.preemptions + 1)
        self.queued[task.id] = replace(requeued, window_s=new_window) if new_window is not None else requeued

    def _waiting(self, cyc: Cycle) -> WaitingList:
        """Positions, estimated starts and reasons of the tasks that stay queued, computed as they are read.

        ``cyc.waiting`` is in the order the cycle considered the tasks, which is the order
        the positions count in and the order estimated starts are handed out in. The
        estimator's inputs are frozen now, so later events on this scheduler do not change them.
        """
        if not cyc.waiting:
            return WaitingList([], None, cyc.now, {}, [])
        class_of = {q.id: q.priority_class for q in self.queues.values()}
        runs = list(self.running.values())
        clocks = None
        if cyc.gang_waits or cyc.quota_waits:
            clocks = Clocks(self, runs, cyc.now, cyc.gang_waits, cyc.quota_waits)
        return WaitingList(cyc.waiting, Estimator(self, cyc.now), cyc.now, class_of, runs, cyc.not_before, clocks)

    def _class_of(self, task: Task) -> str:
        q = self.queues.get(task.queue_id)
        return q.priority_class if q is not None else LOW


QUEUE_ORDER_MESSAGE = "waiting behind an earlier task of its queue"
# Submissions FGD learns its target workload from (a long-lived Scheduler); the oldest drop out.
FGD_WINDOW = 2000
# A low task tries this many placements away from nodes waiting high / medium work could use (a preempted one waits
# if none is found, one never preempted takes the placement it would have had).
PROTECTED_TRIES = 4
FGD_PRIOR = 20.0
# FGD's target workload when neither the VDC settings nor the snapshot give one: requests of 1, 2, 4 and 8 whole
# cards of any model (one core each), smaller ones more frequent, as in the public GPU-cluster traces.
DEFAULT_FGD_WORKLOAD = tuple(
    (weight, 1.0, 1.0, cards * WHOLE, None) for cards, weight in ((1, 8), (2, 4), (4, 2), (8, 1))
)


def _forget_failures(cyc: Cycle, freed: list, clusters: dict) -> None:
    """Forget the remembered placement failures that capacity given back on the ``freed`` nodes could turn.

    A placement of an alternative only looks at nodes of its cluster that have its GPU model (any node for
    CPU-only work), and taking capacity never makes a failed placement fit; so a failure stays a failure
    unless one of these nodes is in its cluster and has its model. "every" keys (a whole request) are all
    forgotten: they are rebuilt from the per-cluster keys in one lookup each.
    """
    fail, by = cyc.fail, cyc.fail_by
    touched = set()
    for ns in freed:
        order = clusters[ns.cluster_id].order
        touched.add((order, None))
        for model in ns.models:
            touched.add((order, model))
    for pair in touched:
        keys = by.pop(pair, None)
        if keys:
            fail.difference_update(keys)
    fail.difference_update(cyc.fail_every)
    cyc.fail_every.clear()


def _hm_needs(cyc: Cycle) -> list:
    """The cycle's waiting high / medium needs (:func:`_minimal_needs`), worked out when first asked."""
    if cyc.hm_needs is None:
        cyc.hm_needs = _minimal_needs(cyc.hm_waiting.values())
    return cyc.hm_needs


def _minimal_needs(waiting) -> list:
    """What one instance of each waiting task needs, per alternative: (rank, model, cards, milli, cpu, memory) with
    "cards of at least milli free" (a whole card is 1000), keeping only needs no other need of the same rank and
    model undercuts in every part: where a bigger one fits, a smaller one does too. Any cluster counts (a task's
    eligible clusters are not told apart: that can only keep low work off more nodes)."""
    groups: dict = {}
    for d, rank in waiting:
        for model, cards, milli, _eq in d.alternatives:
            need = (cards or (1 if model is not None else 0), WHOLE if cards else milli, d.cpu, d.memory_gib)
            groups.setdefault((rank, model), set()).add(need)
    out = []
    for (rank, model), needs in groups.items():
        for n in needs:
            if not any(o != n and all(a <= b for a, b in zip(o, n, strict=True)) for o in needs):
                out.append((rank, model, *n))
    return out


def _earliest_fit(ns: NodeState, model, count: int, milli: int, cpu: float, mem: float, releases, now: float):
    """When ``count`` usable cards of ``model`` with ``milli`` free each (and ``cpu`` / ``mem``) are first free on
    ``ns`` as ``releases`` ((time, seq, claim), by time) give capacity back; inf if never."""
    free = list(ns.dev_free)
    free_cpu, free_mem = ns.free_cpu, ns.free_mem
    cards = [k for k, m in enumerate(ns.dev_model) if m == model and ns.dev_ok[k]] if model is not None else []
    i, n = 0, len(releases)
    t = now
    while True:
        while i < n and releases[i][0] <= t:
            claim = releases[i][2]
            free_cpu += claim[1]
            free_mem += claim[2]
            for k, m in claim[3]:
                free[k] += m
            i += 1
        if free_cpu + EPS >= cpu and free_mem + EPS >= mem and sum(1 for k in cards if free[k] >= milli) >= count:
            return t
        if i >= n:
            return float("inf")
        t = releases[i][0]


def _node_state(ns: NodeState) -> tuple:
    """A node's free capacity, to tell whether anything was placed on it or given back since."""
    return (ns.free_cpu, ns.free_mem, tuple(ns.dev_free))


def _one_tier(_task: Task, _q) -> int:
    """Every task in the first tier: plain queue order, the queues taking turns."""
    return 0


_gpu_fields = attrgetter(*(f.name for f in fields(GpuRequest)))


def _start_size(task: Task) -> int:
    """Instances a task starts with: its gang size, or the minimum of an elastic task."""
    if task.min_replicas is not None and task.max_replicas is not None:
        return max(1, task.min_replicas)
    return task.instances


def _block_keys(d: Demand) -> frozenset:
    """What a capacity-blocked task waits for: its GPU models, or "cpu" for CPU-only work."""
    return d.models if d.models else frozenset(("cpu",))
