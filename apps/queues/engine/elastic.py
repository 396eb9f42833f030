"""Elastic growth (docs/rules.md#gangs-and-elastic-tasks): replicas above the minimum go into capacity nobody waits for.

Shrinking for others happens in :mod:`.preemption`, before anyone is preempted. A task whose maximum dropped
below what it runs (an autoscaled service whose desired count went down) gives the extra replicas back here.
"""

from __future__ import annotations

import heapq

from . import preemption
from .model import CLASS_RANK, LOW, Resources, Task, speedup
from .resources import EPS, Demand, fits_under

ZERO = Resources()


def marginal_gain(run, replicas: int | None = None) -> float:
    """Speed-up the task gains from one more replica, per GPU-equivalent that replica holds (its speed-up curve,
    :func:`~.model.speedup`, relative to one replica)."""
    n = len(run.claims) if replicas is None else replicas
    per_gpu = max(run.alt[3], 0.001)
    return (speedup(run.task, n + 1) - speedup(run.task, n)) / per_gpu


def grow(sched, cyc) -> None:
    """Elastic tasks grow one replica at a time into capacity no waiting task can use: higher classes first, and
    within a class the task whose marginal speed-up per GPU from one more replica is highest (ties: oldest)."""
    runs = [r for r in sched.running.values() if r.task.max_replicas is not None] if sched.has_elastic else []
    if not runs:
        return
    reserved = set()
    for _t, nodes in (v for v in cyc.reservation.values() if v is not None):
        reserved |= nodes
    heap = [(-r.rank, -marginal_gain(r), r.started_at, r.seq, r) for r in runs]
    heapq.heapify(heap)
    while heap:
        _rank, _gain, _started, _seq, run = heapq.heappop(heap)
        if _grow_one(sched, cyc, run, reserved):
            heapq.heappush(heap, (-run.rank, -marginal_gain(run), run.started_at, run.seq, run))


def _grow_one(sched, cyc, run, reserved) -> bool:
    """One more replica for ``run`` when its quota, queue, the VDC cap and free capacity allow; whether it grew."""
    t = run.task
    if sched.running.get(t.id) is not run or (run.alt[0] or "cpu") in cyc.starved:
        return False
    if len(run.placements) >= t.max_replicas:
        return False
    quota = sched.quotas.get(t.project_id)
    q = sched.queues.get(t.queue_id)
    cv = sched.clusters.get(run.cluster_id)
    if cv is None or not cv.usable:
        return False
    one = Resources(t.cpu, t.memory_gib, run.alt[3])
    if not _room_for_replica(sched, t, q, quota, one):
        return False
    alt = _grow_alt(sched, run)
    # On Slurm a service's replicas are jobs that share their node's network, so each listens on the service's
    # port only on a node of its own (docs/slurm.md): a new replica goes to a node the service is not on.
    one_per_node = t.autoscaled and cv.cluster.type == "slurm"
    excluded = (reserved | {c[0].pos for c in run.claims}) if one_per_node else reserved
    claim = cv.index.find(alt, t.cpu, t.memory_gib, sched.scorer, excluded or None, sched.fgd)
    if claim is None and t.autoscaled and run.rank > CLASS_RANK[LOW]:
        claim = _make_room(sched, cyc, run, q, cv, alt, excluded or None)
    if claim is None:
        return False
    cv.index.take(claim)
    placement = sched.placements_of(alt, [claim])[0]
    run.claims.append(claim)
    cyc.units.clear()  # victim units list replicas (preemption._units)
    cyc.unit_nodes.clear()
    run.placements.append(placement)
    run.changed()
    sched.resize_charge(run, +1)
    if t.id in cyc.starts:
        cid, _p, window = cyc.starts[t.id]
        cyc.starts[t.id] = (cid, list(run.placements), window)
    else:
        cyc.resizes.setdefault(t.id, (run, [], []))[1].append(placement)
        cyc.why.setdefault(t.id, "grows into idle capacity")
    return True


def _make_room(sched, cyc, run, q, cv, alt, excluded):
    """A replica an autoscaled service needs, made room for by lower-class work (docs/rules.md#preemption).

    Its maximum is a demand, not an allowance: like a queued task of its class, it takes replicas of
    lower-class elastic tasks and services down towards their minimum first, then lower-class whole tasks
    the class rules let it preempt (low; medium past its window), the minimal set, on its own cluster.
    Returns the claim of the new replica (taken on the index), or None when even that would not make room.
    """
    t = run.task
    d = sched.demand(t, instances=1)
    if not isinstance(d, Demand) or q is None:
        return None
    alts = (alt,)
    units = [
        u
        for u in preemption._units(sched, t, q, q.priority_class, d, alts, cyc, False, False, excluded)
        if u[2] is not run and u[2].rank < run.rank and u[2].cluster_id == run.cluster_id
    ]
    if not units:
        return None
    result = preemption._try(sched, cv, d, alts, units, excluded)
    if result is None:
        return None
    _cost, shrinks, evicted = result
    for _key, _kind, victim, claim in shrinks:
        sched._shrink(victim, claim, cyc)
        cyc.why[victim.task.id] = f"gives replicas back to service {t.id!r} ({q.priority_class} class) that needs them"
    for _key, reason, victim, _claim in evicted:
        sched._evict(victim, reason, t, cyc)
    sched.epoch += 1
    sched._fail_epoch = sched.epoch
    cyc.fail.clear()
    return cv.index.find(alt, t.cpu, t.memory_gib, sched.scorer, excluded, sched.fgd)


def trim(sched, cyc) -> None:
    """Running elastic tasks above their maximum give back their last replicas, down to the maximum."""
    if not sched.has_elastic:
        return
    for run in [r for r in sched.running.values() if r.task.max_replicas is not None]:
        floor = max(run.elastic_min() or 1, run.task.max_replicas)
        while len(run.claims) > floor:
            sched._shrink(run, run.claims[-1], cyc)
        if run.task.id in cyc.resizes:
            cyc.why.setdefault(run.task.id, f"down to its maximum of {floor} replicas")


def _room_for_replica(sched, t: Task, q, quota, one: Resources) -> bool:
    """Quota limit (and, when loans take low-class work only, the project's own limit for other work), queue
    maximum and VDC cap all leave room for one more replica."""
    if (
        quota is not None
        and quota.enforce
        and quota.limit is not None
        and not (
            fits_under(sched.proj_usage.get(t.project_id, ZERO), one, quota.limit)
            and sched.fits_own_limit(t.project_id, q.priority_class if q is not None else LOW, one)
        )
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
