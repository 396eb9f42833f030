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


class _Pool:
    __slots__ = ("free", "releases", "ptr", "cursor")

    def __init__(self, free: float, now: float):
        self.free = free
        self.releases: list[tuple[float, float]] = []
        self.ptr = 0
        self.cursor = now

    def earliest(self, need: float) -> tuple[float | None, int, float]:
        acc = self.free
        t = self.cursor
        j = self.ptr
        rel = self.releases
        while acc + 1e-9 < need and j < len(rel):
            t = max(t, rel[j][0])
            acc += rel[j][1]
            j += 1
        if acc + 1e-9 < need:
            return None, j, acc
        return t, j, acc

    def commit(self, t: float, j: int, acc: float, need: float, duration: float | None) -> None:
        self.ptr = j
        self.cursor = t
        self.free = acc - need
        if duration is not None:
            insort(self.releases, (t + duration, need))


def estimate_starts(sched, now: float, waiting: list) -> dict:
    """Map task id -> estimated start (or None) for ``waiting`` = [(task, demand, reason)] in order."""
    free: dict = {}
    for cv in sched.clusters.values():
        if not cv.usable:
            continue
        for ns in cv.index.schedulable:
            free["cpu"] = free.get("cpu", 0.0) + max(ns.free_cpu, 0.0)
            for i, m in enumerate(ns.dev_model):
                if ns.dev_ok[i]:
                    free[m] = free.get(m, 0.0) + ns.dev_free[i]
    pools = {k: _Pool(v, now) for k, v in free.items()}
    for run in sched.running.values():
        end = run.expected_end()
        if end is None:
            continue
        end = max(end, now)
        n = len(run.claims)
        if run.alt[0] is None:
            pools.setdefault("cpu", _Pool(0.0, now)).releases.append((end, run.task.cpu * n))
            continue
        for _ns, _cpu, _mem, devs in run.claims:
            for i, milli in devs:
                m = _ns.dev_model[i]
                pools.setdefault(m, _Pool(0.0, now)).releases.append((end, float(milli)))
    for p in pools.values():
        p.releases.sort()
    out: dict = {}
    for task, d, reason in waiting:
        if d is None or reason in UNPREDICTABLE:
            out[task.id] = None
            continue
        best = None
        for model, cards, milli, _eq in d.alternatives:
            key = model or "cpu"
            pool = pools.get(key)
            if pool is None:
                continue
            need = d.instances * (d.cpu if model is None else (cards * WHOLE if cards else milli))
            t, j, acc = pool.earliest(need)
            if t is not None and (best is None or t < best[0]):
                best = (t, j, acc, need, pool)
        if best is None:
            out[task.id] = None
            continue
        t, j, acc, need, pool = best
        pool.commit(t, j, acc, need, task.expected_duration_s)
        out[task.id] = t
    return out
