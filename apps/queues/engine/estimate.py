"""Estimated start times of queued tasks (SPEC §4), from running tasks' expected ends.

An approximation that stays O(n log n) for 10,000 queued tasks: capacity is pooled per GPU
model (thousandths of a card over all schedulable nodes) plus one CPU pool for CPU-only work.
Each pool is a step function: what is free now, plus a sorted list of releases at running
tasks' expected ends. Queued tasks are taken in the order the cycle considered them; each
takes the earliest time its pool (any of its alternatives) has enough, and releases it again
at that time plus its own expected duration. Node boundaries are ignored, so the estimate
is a lower bound for tasks that need several cards on one node; running tasks without an
expected duration never release, and a task that can never fit gets None.
"""

from __future__ import annotations

from bisect import insort

from .model import Reason
from .resources import WHOLE

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


class _Pool:
    """Free capacity of one pool as a step function of time."""

    __slots__ = ("free", "releases", "ptr", "cursor", "ahead")

    def __init__(self, free: float, now: float):
        self.free = free
        self.releases: list[tuple[float, int, float]] = []
        self.ptr = 0
        self.cursor = now
        self.ahead = 0.0  # sum of releases not yet consumed: a quick "never" answer

    def earliest(self, need: float) -> tuple[float | None, int, float]:
        """Earliest time ``need`` is free (or None), with the release index and amount reached."""
        acc = self.free
        if acc + self.ahead + 1e-9 < need:
            return None, self.ptr, acc
        t = self.cursor
        j = self.ptr
        rel = self.releases
        while acc + 1e-9 < need:
            when, _seq, amount = rel[j]
            if when > t:
                t = when
            acc += amount
            j += 1
        return t, j, acc

    def commit(self, t: float, j: int, acc: float, need: float, duration: float | None) -> None:
        """Take ``need`` at ``t`` (from :meth:`earliest`) and give it back after ``duration``."""
        self.ahead -= acc - self.free
        self.ptr = j
        self.cursor = t
        self.free = acc - need
        if duration is not None:
            # Queued work sorts after running work that ends at the same time.
            insort(self.releases, (t + duration, _QUEUED_SEQ, need))
            self.ahead += need


def estimate_starts(sched, now: float, waiting: list) -> tuple[dict, dict]:
    """For ``waiting`` = [(task, demand, reason)] in order: task id -> estimated start (or None), and task id ->
    the ``seq`` of the running task whose release completes what it needs (absent when free capacity or a
    queued task's release does)."""
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
    out: dict = {}
    blockers: dict = {}
    needs_of: dict = {}
    for task, d, reason in waiting:
        if d is None or reason in UNPREDICTABLE:
            out[task.id] = None
            continue
        needs = needs_of.get(d.key)
        if needs is None:
            needs = []
            for model, cards, milli, _eq in d.alternatives:
                pool = pools.get(model or "cpu")
                if pool is not None:
                    needs.append(
                        (pool, d.instances * (d.cpu if model is None else (cards * WHOLE if cards else milli)))
                    )
            needs_of[d.key] = needs
        best = None
        for pool, need in needs:
            if pool.free + pool.ahead + 1e-9 < need:
                continue
            if best is not None and pool.cursor >= best[0]:
                continue  # this pool cannot offer an earlier time than the best so far
            t, j, acc = pool.earliest(need)
            if best is None or t < best[0]:
                best = (t, j, acc, need, pool)
        if best is None:
            out[task.id] = None
            continue
        t, j, acc, need, pool = best
        if j > pool.ptr and pool.releases[j - 1][1] != _QUEUED_SEQ:
            blockers[task.id] = pool.releases[j - 1][1]
        pool.commit(t, j, acc, need, task.expected_duration_s)
        out[task.id] = t
    return out, blockers
