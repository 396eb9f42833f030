"""Elastic growth (SPEC §4): replicas above the minimum go into capacity nobody waits for.

Shrinking happens in :mod:`.preemption`, before anyone is preempted.
"""

from __future__ import annotations

from .model import Resources, Task
from .resources import EPS, Demand, fits_under

ZERO = Resources()


def grow(sched, cyc) -> None:
    """Elastic tasks grow one replica at a time into capacity no waiting task can use."""
    runs = [r for r in sched.running.values() if r.task.max_replicas is not None] if sched.has_elastic else []
    runs.sort(key=lambda r: (-r.rank, r.started_at, r.seq))
    reserved = set()
    for _t, nodes in (v for v in cyc.reservation.values() if v is not None):
        reserved |= nodes
    for run in runs:
        t = run.task
        if (run.alt[0] or "cpu") in cyc.starved:
            continue
        quota = sched.quotas.get(t.project_id)
        q = sched.queues.get(t.queue_id)
        cv = sched.clusters.get(run.cluster_id)
        if cv is None or not cv.usable:
            continue
        one = Resources(t.cpu, t.memory_gib, run.alt[3])
        alt = _grow_alt(sched, run)
        while len(run.placements) < t.max_replicas:
            if not _room_for_replica(sched, t, q, quota, one):
                break
            claim = cv.index.find(alt, t.cpu, t.memory_gib, sched.scorer, reserved or None, sched.fgd)
            if claim is None:
                break
            cv.index.take(claim)
            placement = sched.placements_of(alt, [claim])[0]
            run.claims.append(claim)
            run.placements.append(placement)
            run.changed()
            sched.resize_charge(run, +1)
            if t.id in cyc.starts:
                cid, _p, window = cyc.starts[t.id]
                cyc.starts[t.id] = (cid, list(run.placements), window)
            else:
                cyc.resizes.setdefault(t.id, (run, [], []))[1].append(placement)


def _room_for_replica(sched, t: Task, q, quota, one: Resources) -> bool:
    """Quota limit, queue maximum and VDC cap all leave room for one more replica."""
    if (
        quota is not None
        and quota.enforce
        and quota.limit is not None
        and not fits_under(sched.proj_usage.get(t.project_id, ZERO), one, quota.limit)
    ):
        return False
    if q is not None and q.max_gpu is not None and sched.queue_usage.get(q.id, 0.0) + one.gpu > q.max_gpu + EPS:
        return False
    return sched.cap is None or fits_under(sched.total_usage, one, sched.cap)


def _grow_alt(sched, run):
    """The per-replica alternative of a running elastic task (same model and size)."""
    d = sched.demand(run.task, instances=1)
    if isinstance(d, Demand):
        for alt in d.alternatives:
            if alt[0] == run.alt[0]:
                return alt
    return run.alt
