"""Choosing whom to preempt (docs/rules.md#preemption).

Who may be a victim of task P:
* never a high task, never a non-preemptible one, never a medium task inside its window,
  never a task started in this same cycle;
* by class: high preempts low and expired medium; medium preempts low;
* by reclaim: if P's project (or queue) stays within its guarantee with P, P may take back
  capacity borrowed by *other* projects (queues) above their guarantee, from tasks of P's
  class or lower;
* before anyone is preempted, elastic tasks of P's class or lower give back replicas above
  their minimum (no work is lost);
* by LAS demotion (policy ``las``, Tiresias): a running task of P's own queue and class whose attained service
  (earlier runs plus this one) puts it in a lower LAS level than P's (docs/engine.md, "2D-LAS");
* a reclaim or a demotion never takes a task that has run less than its queue's ``min_run_before_reclaim_s``
  (anti-churn; for a demotion, that times 2 ** the task's earlier preemptions, so a long task preempted again and
  again still gets runs long enough to reach a checkpoint), and never takes from nodes reserved for another task.

How: candidate units (shrinks first, then low before medium, then least work lost) are
released one by one until P fits; then each unit is put back if P still fits without it,
so the set is minimal (no victim can be spared). A single-instance task is tried on the
few nodes whose cheapest candidates are cheapest; a whole-card gang on the cheapest set of
nodes that can each be cleared for one more instance (worked out on copies of the nodes).
Plans are compared by (highest victim class, highest victim project priority, over-reclaim,
victims, shrinks, work lost), where over-reclaim is how far the reclaim victims take their lenders
below their guarantee: a reclaim takes victims sized to what is borrowed, not the fewest victims
whatever their size. Within a class, lower-priority projects' tasks are released first. If P does not
fit even with every candidate gone, nothing is preempted.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass

from .model import CLASS_RANK, HIGH, LAS, LOW, MEDIUM, PreemptReason, Resources, speedup
from .policies import LAS_THRESHOLDS_GPU_S, las_level, las_running_level
from .resources import WHOLE, Demand, borrowing, within_guarantee

# Single-instance preemptors: how many candidate nodes are evaluated (cheapest first).
NODE_CANDIDATES = 4
ZERO = Resources()
HIGH_RANK, MEDIUM_RANK = CLASS_RANK[HIGH], CLASS_RANK[MEDIUM]


@dataclass
class Plan:
    """A feasible preemption: where the task goes, which replicas shrink and which tasks go."""

    cluster: object
    alts: tuple
    shrinks: list
    victims: list
    cost: tuple


def reclaim_rights(sched, task, q, d: Demand, alts) -> tuple[bool, bool]:
    """Whether the task's project / queue stays within its guarantee with the task (may reclaim)."""
    quota = sched.quotas.get(task.project_id)
    if quota is None and q.guaranteed_gpu <= 0:
        return False, False  # nothing guaranteed to reclaim (the common case of a backlog's low work)
    need = d.vector(alts[0])
    reclaim_p = quota is not None and within_guarantee(
        sched.proj_usage.get(task.project_id, ZERO), need, sched.guarantee_for(quota, q.priority_class)
    )
    reclaim_q = q.guaranteed_gpu > 0 and sched.queue_usage.get(q.id, 0.0) + need.gpu <= q.guaranteed_gpu + 1e-9
    return reclaim_p, reclaim_q


def _size(run) -> float:
    """GPU-equivalents a running task holds."""
    return run.alt[3] * len(run.claims)


def _borrowed(sched, run, reason: str) -> float:
    """GPU-equivalents the victim's project (quota reclaim) or queue (queue reclaim) holds above its guarantee."""
    t = run.task
    if reason == PreemptReason.QUEUE_RECLAIM:
        vqueue = sched.queues.get(t.queue_id)
        return sched.queue_usage.get(t.queue_id, 0.0) - (vqueue.guaranteed_gpu if vqueue is not None else 0.0)
    vq = sched.quotas.get(t.project_id)
    return sched.proj_usage.get(t.project_id, ZERO).gpu - (vq.guaranteed.gpu if vq is not None else 0.0)


def _over_reclaim(sched, evicted: list) -> float:
    """Sum over lenders of how far the reclaim victims take them below their guarantee (GPU-equivalents)."""
    taken: dict = {}
    for _key, reason, run, _claim in evicted:
        if reason in (PreemptReason.QUOTA_RECLAIM, PreemptReason.QUEUE_RECLAIM):
            who = (reason, run.task.queue_id if reason == PreemptReason.QUEUE_RECLAIM else run.task.project_id)
            entry = taken.setdefault(who, [0.0, _borrowed(sched, run, reason)])
            entry[0] += _size(run)
    return sum(max(0.0, amount - borrowed) for amount, borrowed in taken.values())


def las_rank(task, q, now: float) -> int | None:
    """The LAS level a waiting task of a las queue preempts from: it may take running tasks of its queue in a lower
    level (a larger number). None when it may preempt nobody that way (not las, or already in the lowest level)."""
    if q.policy != LAS:
        return None
    lv = las_level(task, now, q.las_thresholds_gpu_s)
    return lv if lv < len(q.las_thresholds_gpu_s or LAS_THRESHOLDS_GPU_S) else None


def _units(
    sched,
    task,
    q,
    cls: str,
    d: Demand,
    alts,
    cyc,
    reclaim_p: bool,
    reclaim_q: bool,
    excluded=None,
    cluster_id=None,
    las_lv: int | None = None,
    kept: bool = False,
):
    """All shrink / evict units that may make room for ``task`` (on one cluster, or any), cheapest first.

    ``las_lv``: the task's LAS level when it may preempt demoted tasks of its las queue (:func:`las_rank`).
    ``kept``: return (the list as kept for the cycle, which may still hold runs evicted since; its cache key, None
    when it is not kept) instead, for :func:`_cheapest_nodes`."""
    pr = CLASS_RANK[cls]
    now = cyc.now
    gpu = alts[0][3] > 0
    wanted = d.models
    running = sched.running
    # Class preemption alone (no reclaim, no demotion) does not depend on who asks: the sorted list is kept for the
    # cycle and only the runs gone since are dropped when it is read again (docs/engine.md, "Preemption choice").
    ckey = (
        None
        if reclaim_p or reclaim_q or las_lv is not None
        else (pr, cluster_id, wanted, gpu, None if excluded is None else frozenset(excluded))
    )
    if ckey is not None:
        cached = cyc.units.get(ckey)
        if cached is not None:
            if kept:
                return cached, ckey
            return [u for u in cached if running.get(u[2].task.id) is u[2]]
    units = []
    pool, by_model, by_cluster = _pool(sched, cyc, pr)
    if wanted:
        seen: set[int] = set()
        runs = []
        for m in sorted(wanted):
            if cluster_id is not None:
                lists = [by_model.get((cluster_id, m), ())]
            else:
                lists = [lst for (_c, m_), lst in by_model.items() if m_ == m]
            for lst in lists:
                for run in lst:
                    if run.seq not in seen:
                        seen.add(run.seq)
                        runs.append(run)
    else:
        runs = pool if cluster_id is None else by_cluster.get(cluster_id, ())
    for run in runs:
        if run.fresh or running.get(run.task.id) is not run:
            continue
        lo = run.elastic_min()
        if lo is not None and len(run.claims) > lo:
            per_gpu = max(run.alt[3], 0.001)
            for j in range(len(run.claims) - 1, lo - 1, -1):
                if excluded is None or run.claims[j][0].pos not in excluded:
                    # The replica whose loss costs the least speed-up per GPU goes first (its speed-up curve).
                    loss = (speedup(run.task, j + 1) - speedup(run.task, j)) / per_gpu
                    units.append(((0, run.rank, 0, 0.0, loss, run.seq, -j), "shrink", run, run.claims[j]))
        if run.rank == HIGH_RANK or not run.task.preemptible:
            continue
        if excluded is not None and any(c[0].pos in excluded for c in run.claims):
            continue  # its room is reserved for another task: evicting it would not help this one
        if run.rank == MEDIUM_RANK and run.window_s is not None and now < run.started_at + run.window_s:
            continue
        reason = None
        if (pr == HIGH_RANK and run.rank < pr) or (pr == MEDIUM_RANK and run.rank == 0):
            reason = PreemptReason.HIGHER_CLASS
        elif reclaim_p and run.task.project_id != task.project_id:
            vq = sched.quotas.get(run.task.project_id)
            guaranteed = vq.guaranteed if vq is not None else ZERO
            if borrowing(sched.proj_usage.get(run.task.project_id, ZERO), guaranteed, gpu):
                reason = PreemptReason.QUOTA_RECLAIM
        if reason is None and reclaim_q and run.task.queue_id != q.id:
            vqueue = sched.queues.get(run.task.queue_id)
            if vqueue is not None and sched.queue_usage.get(vqueue.id, 0.0) > vqueue.guaranteed_gpu + 1e-9:
                reason = PreemptReason.QUEUE_RECLAIM
        if (
            reason is None
            and las_lv is not None
            and run.rank == pr
            and run.task.queue_id == q.id
            and now - run.started_at >= q.min_run_before_reclaim_s * 2 ** min(run.task.preemptions, 16)
            and las_running_level(run, now, q.las_thresholds_gpu_s) > las_lv
        ):
            reason = PreemptReason.LAS_DEMOTION
        if reason is None:
            continue
        over = 0.0
        if reason in (PreemptReason.QUOTA_RECLAIM, PreemptReason.QUEUE_RECLAIM):
            vqueue = sched.queues.get(run.task.queue_id)
            if vqueue is not None and now - run.started_at < vqueue.min_run_before_reclaim_s:
                continue  # anti-churn: a reclaim waits until the borrower has run its queue's minimum
            # Over-reclaim: how far evicting it alone would take its lender below the guarantee.
            over = max(0.0, _size(run) - _borrowed(sched, run, reason))
        work = (now - run.started_at) * max(run.alt[3], 0.001) * len(run.claims)
        # Within a class, lower-priority projects' work goes first (quota priority), then victims closest in size
        # to what their project borrows, then the least work lost.
        key = (1, run.rank, sched.priority_of(run.task.project_id), over, work, run.seq, 0)
        units.append((key, reason, run, None))
    units.sort()  # the keys are unique (seq, and the claim for shrinks), so only they are compared
    if ckey is not None:
        cyc.units[ckey] = units
    return (units, ckey) if kept else units


def _claims_of(unit) -> list:
    return [unit[3]] if unit[1] == "shrink" else unit[2].claims


def _cheapest_nodes(sched, cv, d: Demand, alts, units: list, ckey, cyc) -> list:
    """For a single-instance task: the units of the ``NODE_CANDIDATES`` nodes whose cheapest live unit is cheapest
    (ties by node position), among nodes where the task could fit with all their units gone; cheapest first.

    ``units`` may hold runs evicted since it was built (kept for the cycle under ``ckey``): the nodes are walked in
    the order of their cheapest unit when the list was built, a lower bound of their live cheapest, and a node is
    taken once its live cheapest is below the next node's bound, so the answer is that of a fresh list's sort.
    """
    table = cyc.unit_nodes.get(ckey) if ckey is not None else None
    if table is None:
        per_node: dict = {}
        for u in units:
            for c in _claims_of(u):
                per_node.setdefault(c[0].pos, []).append(u)
        table = (per_node, sorted((lst[0][0], pos) for pos, lst in per_node.items()))
        if ckey is not None:
            cyc.unit_nodes[ckey] = table
    per_node, order = table
    running = sched.running
    by_pos = cv.index.by_pos
    heap: list = []
    chosen: list = []
    i, n = 0, len(order)
    while len(chosen) < NODE_CANDIDATES:
        while i < n and (not heap or (heap[0][0], heap[0][1]) > order[i]):
            pos = order[i][1]
            i += 1
            lst = per_node[pos]
            live = [u for u in lst if running.get(u[2].task.id) is u[2]] if ckey is not None else lst
            if live:
                heapq.heappush(heap, (live[0][0], pos, live))
        if not heap:
            break
        _key, pos, live = heapq.heappop(heap)
        if _node_could_fit(by_pos[pos], live, d, alts):
            chosen.append(live)
    return chosen


def _pool(sched, cyc, pr: int):
    """Runs that could yield capacity to a class-``pr`` task in this cycle, built once per cycle: not those that can
    neither shrink nor be preempted (high, non-preemptible, medium inside its window). Returns them all, by
    (cluster, GPU model) and by cluster."""
    cached = cyc.victim_pool.get(pr)
    if cached is None and pr < HIGH_RANK and HIGH_RANK in cyc.victim_pool:
        # The same filter as the high class's pool, for fewer classes: a subset of it.
        high = cyc.victim_pool[HIGH_RANK]
        cached = cyc.victim_pool[pr] = (
            [run for run in high[0] if run.rank <= pr],
            {k: [run for run in runs if run.rank <= pr] for k, runs in high[1].items()},
            {k: [run for run in runs if run.rank <= pr] for k, runs in high[2].items()},
        )
    if cached is None:
        pool = []
        by_model: dict = {}
        by_cluster: dict = {}
        now = cyc.now
        for run in sched.running.values():
            if run.rank > pr:
                continue
            lo = run.elastic_min()
            shrinkable = lo is not None and len(run.claims) > lo
            if not shrinkable and (
                run.rank == HIGH_RANK
                or not run.task.preemptible
                or (run.rank == MEDIUM_RANK and run.window_s is not None and now < run.started_at + run.window_s)
            ):
                continue
            pool.append(run)
            by_cluster.setdefault(run.cluster_id, []).append(run)
            for m in run.models:
                by_model.setdefault((run.cluster_id, m), []).append(run)
        cached = cyc.victim_pool[pr] = (pool, by_model, by_cluster)
    return cached


class _Trial:
    """Tentative releases on the index, so they can be undone exactly."""

    def __init__(self, sched):
        self.sched = sched
        self.out: set[int] = set()
        self.by_unit: dict[int, list] = {}

    def release(self, unit) -> None:
        """Give back what the unit holds and is not given back yet."""
        _key, kind, run, claim = unit
        index = self.sched.clusters[run.cluster_id].index
        mine = []
        for c in [claim] if kind == "shrink" else run.claims:
            if id(c) not in self.out:
                index.release(c)
                self.out.add(id(c))
                mine.append(c)
        self.by_unit[id(unit)] = mine

    def retake(self, unit) -> None:
        """Undo :meth:`release` of the unit."""
        run = unit[2]
        index = self.sched.clusters[run.cluster_id].index
        for c in self.by_unit.pop(id(unit), ()):
            index.take(c)
            self.out.discard(id(c))


def _fits(sched, cv, d: Demand, alts, excluded=None) -> bool:
    for alt in alts:
        if cv.index.could_fit(alt[0], alt[1], alt[2], d.instances):
            claims = sched.place_gang(cv.index, alt, d.cpu, d.memory_gib, d.instances, excluded, d.one_per_node)
            if claims is not None:
                for c in claims:
                    cv.index.release(c)
                return True
    return False


def _try(sched, cv, d: Demand, alts, units: list, excluded=None):
    """Release units in order until the task fits, prune to a minimal set, restore; cost or None."""
    trial = _Trial(sched)
    released = []
    ok = False
    for u in units:
        trial.release(u)
        released.append(u)
        if _fits(sched, cv, d, alts, excluded):
            ok = True
            break
    if not ok:
        for u in reversed(released):
            trial.retake(u)
        return None
    # Prune: spare the most expensive units first whenever the task still fits without them.
    kept = list(released)
    for u in sorted(released, key=lambda u: u[0], reverse=True):
        trial.retake(u)
        if _fits(sched, cv, d, alts, excluded):
            kept.remove(u)
        else:
            trial.release(u)
    for u in reversed(kept):
        trial.retake(u)
    evicted = [u for u in kept if u[1] != "shrink"]
    gone = {id(u[2]) for u in evicted}
    shrinks = [u for u in kept if u[1] == "shrink" and id(u[2]) not in gone]
    cost = (
        max((u[2].rank for u in evicted), default=-1),
        max((u[0][2] for u in evicted), default=0),  # the highest project priority it preempts
        round(_over_reclaim(sched, evicted), 6),  # reclaim takes what is borrowed, not more
        len(evicted),
        len(shrinks),
        sum(u[0][4] for u in evicted),
    )
    return cost, shrinks, evicted


def plan(sched, task, q, cls: str, d: Demand, alts, cands, cyc, excluded=None) -> Plan | None:
    """The cheapest feasible preemption plan for ``task`` over the candidate clusters, or None.

    ``excluded`` node positions are reserved for other tasks: the task is not placed there and nothing
    there is preempted for it.
    """
    reclaim_p, reclaim_q = reclaim_rights(sched, task, q, d, alts)
    las_lv = las_rank(task, q, cyc.now)
    if cls == LOW and not reclaim_p and not reclaim_q and las_lv is None:
        return None
    # Without reclaim rights the outcome depends only on class and shape, not on who asks.
    fkey = (
        cls,
        d.key,
        alts,
        task.project_id if reclaim_p else None,
        q.id if reclaim_q else None,
        task.queue_id if reclaim_q else None,
        excluded,
        (q.id, las_lv) if las_lv is not None else None,
    )
    if fkey in cyc.preempt_failed:
        return None
    best = None
    for cv in cands:
        # Built per cluster: most plans stop after the first (see the end of the loop).
        args = (sched, task, q, cls, d, alts, cyc, reclaim_p, reclaim_q, excluded, cv.cluster.id, las_lv)
        if d.instances == 1:
            # The NODE_CANDIDATES nodes whose cheapest units are cheapest, among those where the task could fit.
            units, ckey = _units(*args, kept=True)
            trials = [(_dedupe(live), alts) for live in _cheapest_nodes(sched, cv, d, alts, units, ckey, cyc)]
        else:
            mine = _units(*args)
            if not mine:
                continue
            trials = [(_gang_subset(cv, mine, d, alt), (alt,)) for alt in alts]
        for trial, trial_alts in trials:
            result = _try(sched, cv, d, trial_alts, trial, excluded)
            if result is None:
                continue
            cost, shrinks, evicted = result
            if best is None or cost < best.cost:
                best = Plan(cv, trial_alts, [(u[2], u[3]) for u in shrinks], [(u[2], u[1]) for u in evicted], cost)
        if best is not None and best.cost[0] <= 0 and best.cost[1] <= 0 and best.cost[2] <= 0 and best.cost[3] <= 1:
            # One low victim of no priority (or shrinking alone): other clusters could at most lose a
            # little less work, which is not worth trial placements on every cluster.
            break
    if best is None:
        cyc.preempt_failed.add(fkey)
    return best


def _gang_subset(cv, units: list, d: Demand, alt) -> list:
    """For a whole-card gang: the cheapest nodes to clear, one instance's room each, as one unit list.

    Releasing victims one by one across the whole cluster and re-placing the gang after each
    is quadratic; instead each node with victims is cleared locally (on a copy of its free
    cards) just until it can host one more instance, and the cheapest such nodes are combined.
    """
    model, cards, _milli, _eq = alt
    if model is None or not cards:
        return units
    index = cv.index
    hosts_now = sum(len(lst) * (k // cards) for k, lst in enumerate(index.whole.get(model, ())) if k)
    need = d.instances - hosts_now
    per_node: dict = {}
    for u in units:
        for c in [u[3]] if u[1] == "shrink" else u[2].claims:
            per_node.setdefault(c[0].pos, []).append(u)
    options = []
    for pos, node_units in per_node.items():
        ns = index.by_pos[pos]
        free = list(ns.dev_free)
        usable = [i for i, m in enumerate(ns.dev_model) if m == model and ns.dev_ok[i]]
        base = sum(1 for i in usable if free[i] == WHOLE) // cards
        prefix = []
        seen: set[int] = set()
        for u in _dedupe(node_units):
            prefix.append(u)
            for c in [u[3]] if u[1] == "shrink" else u[2].claims:
                if c[0] is ns and id(c) not in seen:
                    seen.add(id(c))
                    for i, milli in c[3]:
                        free[i] += milli
            if sum(1 for i in usable if free[i] == WHOLE) // cards > base:
                options.append(((max(x[0] for x in prefix), len(prefix), pos), prefix))
                break
    options.sort(key=lambda o: o[0])
    chosen: list = []
    for _key, prefix in options[: max(need, 0) + 2]:
        chosen.extend(prefix)
    return sorted(_dedupe(chosen), key=lambda u: u[0])


def _node_could_fit(ns, units: list, d: Demand, alts) -> bool:
    """Upper bound without touching the index: would the task fit on ``ns`` with all units gone?"""
    free = list(ns.dev_free)
    cpu, mem = ns.free_cpu, ns.free_mem
    seen: set[int] = set()
    for _key, kind, run, claim in units:
        for c in [claim] if kind == "shrink" else run.claims:
            if c[0] is ns and id(c) not in seen:
                seen.add(id(c))
                cpu += c[1]
                mem += c[2]
                for i, milli in c[3]:
                    free[i] += milli
    if cpu + 1e-9 < d.cpu or mem + 1e-9 < d.memory_gib:
        return False
    for model, cards, milli, _eq in alts:
        if model is None:
            return True
        ok = [f for i, f in enumerate(free) if ns.dev_model[i] == model and ns.dev_ok[i]]
        if cards and sum(1 for f in ok if f >= 1000) >= cards:
            return True
        if milli and any(f >= milli for f in ok):
            return True
    return False


def _dedupe(units: list) -> list:
    seen = set()
    out = []
    for u in units:
        k = id(u)
        if k not in seen:
            seen.add(k)
            out.append(u)
    return out
