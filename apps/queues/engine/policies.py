"""Queue ordering policies (SPEC §4): fifo, drf and backfill.

Each policy yields a queue's tasks in the order the engine considers them. DRF is lazy:
the project with the lowest dominant share goes next, and shares are read again after every
task because each start changes them. Backfill orders like fifo; its reservation logic
lives in the engine because it needs the capacity index.
"""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from operator import attrgetter

from .model import DRF, Task
from .resources import EPS


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


def queue_order(
    policy: str,
    tasks: list[Task],
    share_of: Callable[[object], float],
    priority_of: Callable[[object], int] | None = None,
) -> Iterator[Task]:
    """The consideration order of one queue under its policy; ``priority_of`` (project -> quota priority) puts
    higher-priority projects' tasks first, None keeps submit order (every priority equal)."""
    if policy == DRF:
        return drf_order(tasks, share_of, priority_of)
    return iter(submit_order(tasks) if priority_of is None else priority_order(tasks, priority_of))
