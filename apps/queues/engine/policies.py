"""Queue ordering policies (docs/rules.md#queue-policies; trade-offs in docs/engine.md).

Each policy yields a queue's tasks in the order the engine considers them:

* ``fifo`` / ``backfill`` / ``nonstrict_fifo``: submit order (higher project priority first);
* ``drf``: lowest dominant share first; ``fair_share``: lowest dominant share divided by the
  project's quota weight first. Both are lazy: shares are read again after every task because
  each start changes them;
* ``sjf``: shortest expected duration first (no estimate: last), ties by submit time;
* ``las``: Tiresias' discretised 2D-LAS: least attained service (GPU x seconds already run) in
  a few priority levels (thresholds per queue), FIFO within a level, with a starvation guard; a running task
  demoted past a threshold may be preempted for a waiting one of a higher level (:mod:`.preemption`).

How a blocked task affects the tasks behind it is the engine's part: fifo and drf are strict
(same-kind work behind a blocked task waits), backfill reserves by expected ends (EASY), and
the other policies reserve the nodes the blocked head drains (:func:`drain_reservation`).
"""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from operator import attrgetter

from . import backfill
from .model import DRF, FAIR_SHARE, LAS, POLICIES, SJF, Task
from .resources import EPS, Demand

# 2D-LAS priority levels (Tiresias): attained service below 1 GPU-hour is level 0, below 10 GPU-hours level 1,
# then level 2. Level boundaries rather than exact service keep the order stable (no thrashing between two jobs
# with nearly equal service) and let FIFO decide within a level.
LAS_THRESHOLDS_GPU_S = (3_600.0, 36_000.0)
# Starvation guard: a task that has waited (time since submission minus time it ran) longer than this multiple of
# the time it ran goes back to level 0 (Tiresias' STARVELIMIT / PromoteKnob).
LAS_STARVE_FACTOR = 2.0


def submit_order(tasks: Iterable[Task]) -> list[Task]:
    """Tasks by submit time; equal times keep the order they came in (the sort is stable)."""
    return sorted(tasks, key=_submit_time)


_submit_time = attrgetter("submit_time")


def priority_order(tasks: Iterable[Task], priority_of: Callable[[object], int]) -> list[Task]:
    """Higher project (quota) priority first, then by submit time."""
    return sorted(tasks, key=lambda t: (-priority_of(t.project_id), t.submit_time))


def drf_order(
    tasks: Iterable[Task], share_of: Callable[[object], float], priority_of: Callable[[object], int] | None = None
) -> Iterator[Task]:
    """Lowest dominant share first, ties by project priority (higher first), then submit time; shares are
    re-read as tasks start."""
    per_project: dict[object, deque[Task]] = {}
    rank: dict[object, int] = {}
    ordered = submit_order(tasks) if priority_of is None else priority_order(tasks, priority_of)
    for t in ordered:
        if t.project_id not in per_project:
            rank[t.project_id] = len(rank)
            per_project[t.project_id] = deque()
        per_project[t.project_id].append(t)
    prio = {p: -priority_of(p) for p in per_project} if priority_of is not None else dict.fromkeys(per_project, 0)
    heap = [(share_of(p), prio[p], q[0].submit_time, rank[p]) for p, q in per_project.items()]
    heapq.heapify(heap)
    projects = list(per_project)
    while heap:
        share, _prio, _submit, r = heapq.heappop(heap)
        p = projects[r]
        current = share_of(p)
        if current > share + EPS:
            # A start elsewhere raised this project's share since it was queued: re-queue it.
            heapq.heappush(heap, (current, prio[p], per_project[p][0].submit_time, r))
            continue
        q = per_project[p]
        yield q.popleft()
        if q:
            heapq.heappush(heap, (share_of(p), prio[p], q[0].submit_time, r))


def sjf_order(tasks: Iterable[Task], priority_of: Callable[[object], int] | None = None) -> list[Task]:
    """Shortest expected duration first; tasks without an estimate go last; ties by submit time."""
    inf = float("inf")

    def key(t: Task):
        d = t.expected_duration_s
        return (-priority_of(t.project_id) if priority_of else 0, d if d is not None else inf, t.submit_time)

    return sorted(tasks, key=key)


def las_level(task: Task, now: float, thresholds: tuple[float, ...] | None = None) -> int:
    """The waiting task's 2D-LAS priority level (0 = highest): attained GPU-seconds against the queue's
    ``thresholds`` (None: :data:`LAS_THRESHOLDS_GPU_S`), or 0 when the starvation guard promotes it."""
    attained = task.attained_gpu_s
    level = sum(1 for th in thresholds or LAS_THRESHOLDS_GPU_S if attained >= th)
    if level:
        gpus = _gpus(task)
        ran = attained / gpus if gpus > 0 else attained
        waited = now - task.submit_time - ran
        if waited > LAS_STARVE_FACTOR * ran:
            return 0
    return level


def las_running_level(run, now: float, thresholds: tuple[float, ...] | None = None) -> int:
    """The 2D-LAS level of a running task: its service from earlier runs plus this run's GPUs x seconds so far
    (a running task is never promoted: the starvation guard is for waiting ones)."""
    count = getattr(run.task.gpu, "count", 0) if run.task.gpu is not None else 0
    try:
        gpus = float(count) * len(run.claims)
    except (TypeError, ValueError):
        gpus = float(len(run.claims))
    attained = run.task.attained_gpu_s + max(0.0, now - run.started_at) * gpus
    return sum(1 for th in thresholds or LAS_THRESHOLDS_GPU_S if attained >= th)


def las_order(
    tasks: Iterable[Task],
    now: float,
    priority_of: Callable[[object], int] | None = None,
    thresholds: tuple[float, ...] | None = None,
) -> list[Task]:
    """Lowest 2D-LAS level first, then submit time (FIFO within a level)."""

    def key(t: Task):
        return (-priority_of(t.project_id) if priority_of else 0, las_level(t, now, thresholds), t.submit_time)

    return sorted(tasks, key=key)


def check_las_thresholds(thresholds) -> None:
    """A queue's LAS thresholds must be positive and strictly ascending (None: the default)."""
    if thresholds is None:
        return
    ths = tuple(thresholds)
    if not ths or any(th <= 0 for th in ths) or any(b <= a for a, b in zip(ths, ths[1:], strict=False)):
        raise ValueError(f"las thresholds must be positive and ascending GPU-seconds, got {ths!r}")


def _gpus(task: Task) -> float:
    """Cards the task holds while it runs (its request's count times its instances)."""
    count = getattr(task.gpu, "count", 0) if task.gpu is not None else 0
    try:
        return float(count) * max(1, task.instances)
    except (TypeError, ValueError):
        return 1.0


def queue_order(
    policy: str,
    tasks: list[Task],
    share_of: Callable[[object], float],
    priority_of: Callable[[object], int] | None = None,
    now: float = 0.0,
    weight_of: Callable[[object], float] | None = None,
    las_thresholds: tuple[float, ...] | None = None,
) -> Iterator[Task]:
    """The consideration order of one queue under its policy; ``priority_of`` (project -> quota priority) puts
    higher-priority projects' tasks first, None keeps submit order (every priority equal). ``now`` is the cycle
    time (for las), ``weight_of`` the project's fair-share weight (for fair_share; None = every weight 1),
    ``las_thresholds`` the queue's LAS level thresholds (None: the default)."""
    if policy == DRF:
        return drf_order(tasks, share_of, priority_of)
    if policy == FAIR_SHARE:
        weighted = share_of if weight_of is None else (lambda p: share_of(p) / weight_of(p))
        return drf_order(tasks, weighted, priority_of)
    if policy == SJF:
        return iter(sjf_order(tasks, priority_of))
    if policy == LAS:
        return iter(las_order(tasks, now, priority_of, las_thresholds))
    if policy not in POLICIES:
        raise ValueError(f"unknown queue policy {policy!r}; expected one of {', '.join(POLICIES)}")
    return iter(submit_order(tasks) if priority_of is None else priority_order(tasks, priority_of))


def drain_reservation(sched, d: Demand, alts, cands, now: float):
    """Reservation of a blocked head under the non-strict policies: the nodes it will start on earliest.

    Running work on the eligible clusters is given back in the order it is expected to end (work without an
    expected duration after all that has one, oldest start first) until the head fits; the nodes of that
    placement are reserved. Unlike EASY backfill, no estimate is needed and later tasks never use reserved
    nodes, however short they claim to be. Returns (expected start or None, node positions), or None when the
    head would not fit even on empty clusters.
    """
    eligible = {cv.cluster.id for cv in cands}
    inf = float("inf")
    runs = []
    for run in sched.running.values():
        if run.cluster_id in eligible:
            end = run.expected_end()
            runs.append((max(end, now) if end is not None else inf, run.started_at, run.seq, run))
    runs.sort(key=lambda r: r[:3])
    released = []
    result = None
    placed = backfill._place_uncached(sched, d, alts, cands)
    i = 0
    while placed is None and i < len(runs):
        run = runs[i][3]
        for claim in run.claims:
            sched.clusters[run.cluster_id].index.release(claim)
        released.append(run)
        placed = backfill._place_uncached(sched, d, alts, cands)
        i += 1
    if placed is not None:
        end = runs[i - 1][0] if i else now
        result = (None if end == inf else end, frozenset(c[0].pos for c in placed[2]))
        for c in placed[2]:
            placed[0].index.release(c)
    for run in released:
        for claim in run.claims:
            sched.clusters[run.cluster_id].index.take(claim)
    return result
