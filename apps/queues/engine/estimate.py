"""Queue positions and estimated start times of queued tasks (docs/rules.md#queue-policies), from running tasks'
expected ends.

An approximation that stays O(n log n) for 10,000 queued tasks: capacity is pooled per GPU
model (thousandths of a card over all schedulable nodes) plus one CPU pool for CPU-only work.
Each pool is a step function: what is free now, plus a sorted list of releases at running
tasks' expected ends. Queued tasks are taken in the order the cycle considered them; each
takes the earliest time its pool (any of its alternatives) has enough, and releases it again
at that time plus its own expected duration. Node boundaries are ignored, so the estimate
is a lower bound for tasks that need several cards on one node; running tasks without an
expected duration never release, and a task that can never fit gets None.

Two checks refine that pooled answer (:class:`Clocks`): a task of several instances also waits until enough
nodes of one cluster each have room for an instance (:meth:`Clocks.gang`: the running tasks' releases node by
node, in order of expected end, so the estimate is the latest release it needs), and a task held back by its
project's quota until enough of the project's own running work ends (:meth:`Clocks.quota`).

The pass is sequential, so it is lazy: a cycle only freezes its inputs (free capacity per
pool and the release lists, O(pools + running)), and :class:`WaitingList` hands out positions
and estimates as they are read, in order. A caller that reads the first page of the queue
pays for that page; one that reads everything pays what an eager pass would, once.
"""

from __future__ import annotations

import gc
from bisect import bisect_right, insort
from collections.abc import Sequence
from heapq import heappop, heappush
from operator import itemgetter

from .model import CLASS_RANK, HIGH, MEDIUM, Reason, Resources, Waiting
from .resources import EPS, WHOLE, fits_under

# Reasons for which no start can be predicted from capacity alone.
UNPREDICTABLE = frozenset(
    {
        Reason.INVALID_REQUEST,
        Reason.NO_MATCHING_GPU_MODEL,
        Reason.BUDGET_EXHAUSTED,
        Reason.NO_ELIGIBLE_CLUSTER,
    }
)


_QUEUED_SEQ = 1 << 62
_MEDIUM_RANK = CLASS_RANK[MEDIUM]


class _Pool:
    """Free capacity of one pool as a step function of time.

    The releases are read in (end, seq, amount) order: the running tasks' (``releases``, sorted, read from
    ``ptr``) merged with the queued tasks' own (``queued``: a sorted buffer read from ``qptr``, fed from the
    heap ``later``). A queued release lands anywhere in time, so one sorted list would pay a memmove of its
    tail per waiting task; the buffer only holds what was read ahead and not yet consumed.
    """

    __slots__ = ("free", "releases", "ptr", "queued", "qptr", "later", "cursor", "ahead")

    def __init__(self, free: float, now: float):
        self.free = free
        self.releases: list[tuple[float, int, float]] = []
        self.ptr = 0
        self.queued: list[tuple[float, int, float]] = []
        self.qptr = 0
        self.later: list[tuple[float, int, float]] = []
        self.cursor = now
        self.ahead = 0.0  # sum of releases not yet consumed: a quick "never" answer

    def earliest(self, need: float) -> tuple[float | None, tuple, float]:
        """Earliest time ``need`` is free (or None), with where the reading stopped (running and queued
        positions, the last release read or None) and the amount reached."""
        acc = self.free
        j = self.ptr
        k = self.qptr
        if acc + self.ahead + 1e-9 < need:
            return None, (j, k, None), acc
        t = self.cursor
        rel = self.releases
        nrel = len(rel)
        queued = self.queued
        nq = len(queued)
        later = self.later
        entry = None
        while acc + 1e-9 < need:
            if k == nq and later:
                queued.append(heappop(later))
                nq += 1
            if k < nq and (j == nrel or queued[k] < rel[j]):
                entry = queued[k]
                k += 1
            else:
                entry = rel[j]
                j += 1
            when = entry[0]
            if when > t:
                t = when
            acc += entry[2]
        return t, (j, k, entry), acc

    def commit(self, t: float, at: tuple, acc: float, need: float, duration: float | None) -> None:
        """Take ``need`` at ``t`` (from :meth:`earliest`) and give it back after ``duration``."""
        self.ahead -= acc - self.free
        self.ptr, k, _last = at
        self.cursor = t
        self.free = acc - need
        queued = self.queued
        if k > 64 and 2 * k > len(queued):
            del queued[:k]
            k = 0
        self.qptr = k
        if duration is not None:
            # Queued work sorts after running work that ends at the same time.
            entry = (t + duration, _QUEUED_SEQ, need)
            if len(queued) > k and entry < queued[-1]:
                insort(queued, entry, k)
            else:
                heappush(self.later, entry)
            self.ahead += need


_by_seq = itemgetter(1)


class Estimator:
    """Hands out estimated starts one waiting task at a time, in consideration order."""

    def __init__(self, sched, now: float):
        """Freeze the scheduler's pooled free capacity and release lists as they are now."""
        free: dict = {}
        for cv in sched.clusters.values():
            if not cv.usable:
                continue
            for m, milli in cv.index.free_milli_by_model().items():
                free[m] = free.get(m, 0.0) + milli
            free["cpu"] = free.get("cpu", 0.0) + sum(max(ns.free_cpu, 0.0) for ns in cv.index.schedulable)
        pools = {k: _Pool(v, now) for k, v in free.items()}
        for key, releases in sched.releases.items():
            pool = pools.get(key)
            if pool is None:
                pool = pools[key] = _Pool(0.0, now)
            # (end, seq, amount), kept sorted by the scheduler; ends in the past count as now.
            pool.releases = list(releases)
            pool.ahead = sched.release_total.get(key, 0.0)
        self.pools = pools
        self._needs_of: dict = {}

    def next(self, d, duration: float | None) -> tuple[float | None, int | None]:
        """The estimated start of the next waiting task with demand ``d`` (or None), and the ``seq`` of the
        running task whose release completes what it needs (None when free capacity or a queued task's
        release does). Tasks whose reason is in :data:`UNPREDICTABLE` are not passed here."""
        # Demands are shared per request shape and kept alive by the waiting list: their id is a cheap key.
        cached = self._needs_of.get(id(d))
        if cached is not None and cached[0] is d:
            needs = cached[1]
        else:
            needs = []
            pools = self.pools
            for model, cards, milli, _eq in d.alternatives:
                pool = pools.get(model or "cpu")
                if pool is not None:
                    needs.append(
                        (pool, d.instances * (d.cpu if model is None else (cards * WHOLE if cards else milli)))
                    )
            self._needs_of[id(d)] = (d, needs)
        best = None
        for pool, need in needs:
            if pool.free + pool.ahead + 1e-9 < need:
                continue
            if best is not None and pool.cursor >= best[0]:
                continue  # this pool cannot offer an earlier time than the best so far
            if pool.free + 1e-9 >= need:
                # Free now (at the pool's cursor): what earliest() returns without reading a release.
                t, at, acc = pool.cursor, (pool.ptr, pool.qptr, None), pool.free
            else:
                t, at, acc = pool.earliest(need)
            if best is None or t < best[0]:
                best = (t, at, acc, need, pool)
        if best is None:
            return None, None
        t, at, acc, need, pool = best
        last = at[2]
        blocker = None
        if last is not None and last[1] != _QUEUED_SEQ:
            blocker = last[1]
        pool.commit(t, at, acc, need, duration)
        return t, blocker


def _units(value: float) -> str:
    """A quantity as the quota message says it: whole numbers without decimals."""
    return f"{value:.2f}".rstrip("0").rstrip(".")


class Clocks:
    """When a waiting task's own constraints clear, from the running tasks' expected ends: the node-by-node room
    of a task of several instances, and the quota of a task's project. Frozen when the cycle ends."""

    def __init__(self, sched, runs: list, now: float, gangs: bool, quotas: bool):
        """``gangs``: snapshot the free room of every node (a task of several instances waits); ``quotas``: the
        projects' usage and limits (a task waits for its project's quota)."""
        self.now = now
        self._runs = runs
        self._gang_cache: dict = {}
        self._nodes: dict | None = None
        self._rooms: dict = {}
        self._fits: dict = {}  # (cluster, key, need per instance) -> instances that fit in the frozen rooms
        self._events: dict = {}
        self._by_end: list = []
        self._past: list = []
        self._claims: dict = {}
        self._at = 0
        if gangs:
            # Frozen cheaply (the free room of every node, the running tasks' claims by expected end); the rooms per
            # pool key and the release events are worked out from these when a gang's estimate is first read.
            # cluster -> (its index, [(free cpu, free thousandths per card)] in the order of its schedulable nodes)
            self._nodes = {
                cid: (cv.index, [(ns.free_cpu, tuple(ns.dev_free)) for ns in cv.index.schedulable])
                for cid, cv in sched.clusters.items()
                if cv.usable
            }
            by_end = sched.runs_by_end()
            # Ends in the past count as now; those then go by seq, as every (end, seq) is. Only an elastic task's
            # claims change after a start (replicas added or given back): those are copied, the rest kept as is.
            k = bisect_right(by_end, (now, float("inf")))
            self._past = sorted(((now, seq, run) for _end, seq, run in by_end[:k]), key=_by_seq)
            self._by_end = by_end[k:]
            self._claims = (
                {run.seq: tuple(run.claims) for run in runs if run.task.max_replicas is not None}
                if sched.has_elastic
                else {}
            )
        self._usage: dict = dict(sched.proj_usage) if quotas else {}
        self._limits: dict = (
            {pid: q.limit for pid, q in sched.quotas.items() if q.enforce and q.limit is not None} if quotas else {}
        )
        self._by_project: dict | None = None

    def gang(self, d) -> tuple[float | None, int | None]:
        """The earliest time one cluster has room for every instance of ``d``, node by node (None: never by a
        known time), and the ``seq`` of the running task whose release completes it (None: room now)."""
        cached = self._gang_cache.get(id(d))
        if cached is not None and cached[0] is d:
            return cached[1]
        best: tuple[float | None, int | None] = (None, None)
        for model, cards, milli, _eq in d.alternatives:
            key = model or "cpu"
            need = d.cpu if model is None else (cards * WHOLE if cards else milli)
            if need <= 0:
                continue
            for cid, rooms in self._rooms_of(key).items():
                fit = self._fits.get((cid, key, need))
                if fit is None:
                    fit = self._fits[(cid, key, need)] = sum(int((v + EPS) // need) for v in rooms.values())
                if fit >= d.instances:
                    best = (self.now, None)
                    break
                room = {}  # the rooms the releases read so far changed (the rest are as frozen)
                for end, seq, pos, amount in self._events_of(cid, key):
                    if best[0] is not None and end >= best[0]:
                        break
                    was = room.get(pos)
                    if was is None:
                        was = rooms.get(pos)
                        if was is None:
                            continue
                    before = int((was + EPS) // need)
                    now_room = room[pos] = was + amount
                    fit += int((now_room + EPS) // need) - before
                    if fit >= d.instances:
                        best = (end, seq)
                        break
            if best == (self.now, None):
                break
        self._gang_cache[id(d)] = (d, best)
        return best

    def _rooms_of(self, key) -> dict:
        """Per usable cluster, node position -> the free room of pool ``key`` (a GPU model, or "cpu") when frozen:
        every schedulable node for "cpu", the nodes that have the model for a model (no other node gets or gives
        back any of it)."""
        rooms = self._rooms.get(key)
        if rooms is None:
            rooms = self._rooms[key] = {}
            for cid, (index, frozen) in (self._nodes or {}).items():
                per = rooms[cid] = {}
                nodes = index.schedulable
                if key == "cpu":
                    for ns, (free_cpu, _free) in zip(nodes, frozen, strict=True):
                        per[ns.pos] = max(free_cpu, 0.0)
                    continue
                for k, cards in index.with_model(key):
                    # Summed in card order from 0.0, as a node's room always was.
                    per[nodes[k].pos] = sum(map(frozen[k][1].__getitem__, cards), 0.0)
        return rooms

    def _events_of(self, cid, key):
        """(end, seq, node position, amount) that running work of cluster ``cid`` gives back to pool ``key``, by
        end (then seq, then the order of its claims). The running tasks are read only as far as some caller
        needed: one shared pass, each task's releases sorted into every (cluster, key) list at once."""
        events = self._events.get((cid, key))
        if events is None:
            events = self._events[(cid, key)] = []
        i = 0
        while True:
            while i < len(events):
                yield events[i]
                i += 1
            if not self._read_next_run():
                return

    def _read_next_run(self) -> bool:
        """Sort the releases of the next running task (by end) into the event lists; False when none is left."""
        at = self._at
        past = len(self._past)
        if at >= past + len(self._by_end):
            return False
        self._at = at + 1
        end, seq, run = self._past[at] if at < past else self._by_end[at - past]
        claims = self._claims.get(seq, run.claims)
        lists = self._events
        for ns, cpu, _mem, devs in claims:
            cid = ns.cluster_id
            if not devs:
                lst = lists.get((cid, "cpu"))
                if lst is None:
                    lst = lists[(cid, "cpu")] = []
                lst.append((end, seq, ns.pos, cpu))
                continue
            for i, milli in devs:
                k = (cid, ns.dev_model[i])
                lst = lists.get(k)
                if lst is None:
                    lst = lists[k] = []
                lst.append((end, seq, ns.pos, milli))
        return True

    def quota(self, project_id, d) -> tuple[float | None, int | None, str]:
        """The earliest time the project's own running work has freed enough of its quota limit for ``d`` (None:
        nothing of it ends by a known time), the ``seq`` of the task whose end does it, and, without a time,
        the message that says so."""
        limit = self._limits.get(project_id)
        usage = self._usage.get(project_id, Resources())
        if limit is None:
            return self.now, None, ""
        if self._by_project is None:
            by: dict = {}
            for run in self._runs:
                end = run.expected_end()
                if end is not None:
                    by.setdefault(run.task.project_id, []).append((max(end, self.now), run.seq, run.usage()))
            for lst in by.values():
                lst.sort(key=lambda e: (e[0], e[1]))
            self._by_project = by
        best: tuple[float, int | None] | None = None
        for alt in d.alternatives:
            add = d.vector(alt)
            if fits_under(usage, add, limit):
                return self.now, None, ""
            cpu, mem, gpu = usage.cpu, usage.memory_gib, usage.gpu
            for end, seq, u in self._by_project.get(project_id, ()):
                if best is not None and end >= best[0]:
                    break
                cpu, mem, gpu = cpu - u.cpu, mem - u.memory_gib, gpu - u.gpu
                if fits_under(Resources(cpu, mem, gpu), add, limit):
                    best = (end, seq)
                    break
        if best is not None:
            return best[0], best[1], ""
        over = []
        add = d.vector(d.alternatives[0]) if d.alternatives else Resources()
        if usage.gpu + add.gpu > limit.gpu + EPS:
            over.append(f"{_units(usage.gpu)} of {_units(limit.gpu)} GPUs in use")
        if usage.cpu + add.cpu > limit.cpu + EPS:
            over.append(f"{_units(usage.cpu)} of {_units(limit.cpu)} CPU cores in use")
        if usage.memory_gib + add.memory_gib > limit.memory_gib + EPS:
            over.append(f"{_units(usage.memory_gib)} of {_units(limit.memory_gib)} GiB of memory in use")
        detail = f" ({'; '.join(over)})" if over else ""
        return None, None, f"no estimate: waits for your project's quota{detail}"


class WaitingList(Sequence):
    """The tasks that stay queued after a cycle, as :class:`Waiting` entries computed on first read.

    Entries are produced in consideration order, which is the order positions count in and
    estimated starts are handed out in; reading entry ``i`` (or a slice up to it) computes entries
    ``0..i`` once, iterating computes them all.
    Compares equal to any sequence of the same entries; pickles as a plain tuple.
    """

    __slots__ = (
        "_pending",
        "_done",
        "_estimator",
        "_now",
        "_class_of",
        "_runs",
        "_by_seq",
        "_position",
        "_not_before",
        "_clocks",
    )

    def __init__(
        self,
        pending: list,
        estimator: Estimator | None,
        now: float,
        class_of: dict,
        runs: list,
        not_before: dict | None = None,
        clocks: Clocks | None = None,
    ):
        """``pending`` = [(task, demand or None, reason, message)] in consideration order; ``runs`` = the
        running tasks at the end of the cycle (for ``blocked_by``); ``not_before`` = task id -> the earliest
        start (the end of the capacity reservation that holds it off); ``clocks`` = the gang and quota checks."""
        self._not_before = not_before or {}
        self._clocks = clocks
        self._pending = pending
        self._done: list[Waiting] = []
        self._estimator = estimator
        self._now = now
        self._class_of = class_of
        self._runs = runs
        self._by_seq: dict | None = None
        self._position: dict = {}

    def _fill(self, upto: int) -> None:
        """Compute entries up to index ``upto`` (exclusive)."""
        upto = min(upto, len(self._pending))
        if upto <= len(self._done):
            return
        # As in a cycle: many small objects, no reference cycles, so the cyclic collector only costs time.
        was_enabled = gc.isenabled()
        gc.disable()
        try:
            self._compute(upto)
        finally:
            if was_enabled:
                gc.enable()

    def _compute(self, upto: int) -> None:
        done, pending, position, append = self._done, self._pending, self._position, self._done.append
        nxt = self._estimator.next if self._estimator is not None else None
        for k in range(len(done), upto):
            t, d, reason, message = pending[k]
            qid = t.queue_id
            pos = position[qid] = position.get(qid, 0) + 1
            if nxt is None or d is None or reason in UNPREDICTABLE:
                append(Waiting(t.id, qid, pos, None, reason, message, None, False))
                continue
            start, seq = nxt(d, t.expected_duration_s)
            clocks = self._clocks
            if clocks is not None:
                if reason == Reason.QUOTA_EXCEEDED:
                    when, by, words = clocks.quota(t.project_id, d)
                    if when is None:
                        start, seq, message = None, None, words
                    elif start is not None and when > start:
                        start, seq = when, by
                if start is not None and d.instances > 1:
                    when, by = clocks.gang(d)
                    if when is None or when > start:
                        start, seq = when, by
            floor = self._not_before.get(t.id)
            if floor is not None and start is not None and start < floor:
                start, seq = floor, None  # the reservation decides, not the running work the pools wait for
            blocker = None
            if seq is not None:
                if self._by_seq is None:
                    self._by_seq = {run.seq: run for run in self._runs}
                blocker = self._by_seq.get(seq)
            if blocker is None:
                append(Waiting(t.id, qid, pos, start, reason, message, None, False))
                continue
            at_window = False
            if self._class_of.get(qid) == HIGH:
                # A high task may preempt medium work once its guaranteed window is over: that can come first.
                window_end = blocker.window_end()
                if (
                    blocker.rank == _MEDIUM_RANK
                    and blocker.task.preemptible
                    and window_end is not None
                    and window_end < start
                ):
                    start, at_window = max(window_end, self._now), True
            append(Waiting(t.id, qid, pos, start, reason, message, blocker.task.id, at_window))
        if len(done) == len(pending):
            # Everything is computed: drop what only the computation needed.
            self._estimator = self._runs = self._by_seq = self._clocks = None

    def __len__(self) -> int:
        return len(self._pending)

    def __getitem__(self, i):
        n = len(self._pending)
        if isinstance(i, slice):
            start, stop, step = i.indices(n)
            if step > 0:
                self._fill(stop)
            else:
                self._fill(n)
            return tuple(self._done[i])
        if i < 0:
            i += n
        if not 0 <= i < n:
            raise IndexError("waiting list index out of range")
        self._fill(i + 1)
        return self._done[i]

    def __iter__(self):
        # Iterating reads everything (index or slice to read a page): one pass with the collector off, not
        # one per chunk, because re-enabling it between chunks triggers collections over the whole heap.
        self._fill(len(self._pending))
        return iter(self._done)

    def __eq__(self, other) -> bool:
        if isinstance(other, (WaitingList, tuple, list)):
            return len(self) == len(other) and tuple(self) == tuple(other)
        return NotImplemented

    def __hash__(self) -> int:
        return hash(tuple(self))

    def __repr__(self) -> str:
        return f"WaitingList({tuple(self)!r})"

    def __reduce__(self):
        return (tuple, (tuple(self),))
