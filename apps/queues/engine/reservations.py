"""Capacity reservations: windows in which an admin holds capacity back (maintenance, a coming event).

Not the reservations of :mod:`.backfill`, which a blocked task holds for itself within a cycle: these are
input (:class:`~.model.CapacityReservation`), set by an admin for a time window.

Each cycle resolves every reservation that has not ended into the node positions it holds:

* named nodes are held whole; no nodes and no amount: every node of the scope (a whole cluster or VDC);
* an amount (cards of a model, GPU-equivalents, cpu, memory) is held as whole nodes of the scope that
  together cover it. The engine prefers nodes with no work that would still run at the window's start
  (by its wall-time limit, else its expected duration), so the amount is free when the window opens;
  among those, the smallest node that covers what is left, else the biggest. The choice is made again each
  cycle; nodes whose work is gone by the start stay the preferred ones, so it does not wander.

A queued task keeps off the held nodes when the reservation applies to it: during the window unless its
project is one the reservation is for; before the window when it could still run at the start (its
wall-time limit, else expected duration, reaches past the start; a task with neither counts as running
for the reservation's ``lead_s``). Running work is not preempted when the window starts, unless the
reservation says ``preempt_at_start``: then its preemptible medium and low work is requeued.
"""

from __future__ import annotations

from datetime import UTC, datetime

from .model import CLASS_RANK, HIGH, CapacityReservation, Preempt, PreemptReason, Task
from .resources import EPS


def run_bound(task: Task) -> float | None:
    """How long the task may run: its wall-time limit (a hard stop), else its expected duration, else None."""
    return task.wall_time_s if task.wall_time_s is not None else task.expected_duration_s


def when(t: float) -> str:
    """An engine time (epoch seconds) as a UTC time of day with its date."""
    try:
        return datetime.fromtimestamp(t, tz=UTC).strftime("%Y-%m-%d %H:%M UTC")
    except (OverflowError, OSError, ValueError):
        return f"t={t:.0f}"


class Holds:
    """The reservations of one cycle that have not ended, each with the node positions it holds."""

    __slots__ = ("now", "held", "all_nodes", "_memo")

    def __init__(self, sched, reservations: tuple[CapacityReservation, ...], now: float):
        self.now = now
        self.held: list[tuple[CapacityReservation, frozenset[int]]] = []
        for r in sorted(reservations, key=lambda r: (r.start, r.end, str(r.id))):
            if r.end <= now + EPS:
                continue
            nodes = _resolve(sched, r, now)
            if nodes:
                self.held.append((r, nodes))
        self.all_nodes = frozenset().union(*(nodes for _r, nodes in self.held))
        self._memo: dict = {}

    def applies(self, r: CapacityReservation, task: Task) -> bool:
        """True when ``task`` must keep off ``r``'s nodes now."""
        if task.project_id in r.projects:
            return False
        if r.start <= self.now + EPS:
            return True
        bound = run_bound(task)
        if bound is None:
            bound = r.lead_s
        return self.now + bound > r.start + EPS

    def off_limits(self, task: Task) -> tuple[frozenset[int] | None, CapacityReservation | None]:
        """The node positions ``task`` must keep off now, and the first reservation that puts them there."""
        key = (task.project_id, run_bound(task))
        found = self._memo.get(key)
        if found is None:
            out: frozenset[int] | None = None
            first = None
            for r, nodes in self.held:
                if self.applies(r, task):
                    out = nodes if out is None else out | nodes
                    first = first or r
            found = self._memo[key] = (out, first)
        return found

    def message(self, r: CapacityReservation) -> str:
        """The pending message of a task held off by ``r``."""
        if r.start <= self.now + EPS:
            return f"capacity reserved for {r.purpose} until {when(r.end)}"
        return (
            f"capacity reserved for {r.purpose} from {when(r.start)} until {when(r.end)}; "
            "this task could still be running then"
        )


def _ends_after(run, t: float) -> bool:
    """True when a running task may still run at ``t`` (no bound counts as running on)."""
    bound = run_bound(run.task)
    return bound is None or run.started_at + bound > t + EPS


def _resolve(sched, r: CapacityReservation, now: float) -> frozenset[int]:
    """The node positions ``r`` holds this cycle (see the module docstring)."""
    if r.node_ids:
        return frozenset(sched.node_by_id[n].pos for n in r.node_ids if n in sched.node_by_id)
    clusters = set(r.cluster_ids)
    scope = [ns for ns in sched.nodes if not clusters or ns.cluster_id in clusters]
    if not r.holds_amount:
        return frozenset(ns.pos for ns in scope)
    catalog = sched.catalog
    need = [float(r.cards), r.gpu, r.cpu, r.memory_gib]

    def offer(ns) -> tuple[float, float, float, float]:
        cards = gpu = 0.0
        for i, m in enumerate(ns.dev_model):
            if ns.dev_ok[i]:
                cards += m == r.gpu_model
                gpu += catalog[m].exchange_rate if m in catalog else 0.0
        return (cards, gpu, float(ns.node.cpu), float(ns.node.memory_gib))

    dims = [k for k, v in enumerate(need) if v > EPS]
    offers = {}
    for ns in scope:
        if ns.schedulable:
            o = offer(ns)
            if any(o[k] > EPS for k in dims):
                offers[ns.pos] = o
    t = max(r.start, now)
    busy = set()
    for run in sched.running.values():
        if run.task.project_id not in r.projects and _ends_after(run, t):
            busy.update(claim[0].pos for claim in run.claims)
    primary = dims[0]
    chosen: list[int] = []
    for tier in ([p for p in offers if p not in busy], [p for p in offers if p in busy]):
        left = sorted(tier)
        while left and any(need[k] > EPS for k in dims):
            covering = [p for p in left if all(offers[p][k] + EPS >= need[k] for k in dims)]
            if covering:
                pick = min(covering, key=lambda p: (offers[p][primary], p))
            else:
                pick = max(left, key=lambda p: (offers[p][primary], -p))
            left.remove(pick)
            chosen.append(pick)
            for k in dims:
                need[k] = max(0.0, need[k] - offers[pick][k])
    return frozenset(chosen)


def drain(sched, holds: Holds, cyc) -> None:
    """Requeue preemptible medium and low work of other projects from the nodes of reservations that started
    and say ``preempt_at_start``; high-class and non-preemptible work runs on."""
    high = CLASS_RANK[HIGH]
    for r, nodes in holds.held:
        if not r.preempt_at_start or r.start > cyc.now + EPS:
            continue
        for run in list(sched.running.values()):
            task = run.task
            if task.project_id in r.projects or not task.preemptible or run.rank == high:
                continue
            if not any(claim[0].pos in nodes for claim in run.claims):
                continue
            lost = max(0.0, cyc.now - run.started_at) * run.alt[3] * len(run.claims)
            sched._release_run(run)
            message = f"capacity reserved for {r.purpose} from {when(r.start)} until {when(r.end)}"
            cyc.preempts.append(Preempt(task.id, PreemptReason.CAPACITY_RESERVATION, None, message, True, None, lost))
            cyc.resizes.pop(task.id, None)
            sched.queued[task.id] = task
