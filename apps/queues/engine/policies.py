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


def drf_order(tasks: Iterable[Task], share_of: Callable[[object], float]) -> Iterator[Task]:
    """Lowest dominant share first, ties by submit time; shares are re-read as tasks start."""
    per_project: dict[object, deque[Task]] = {}
    rank: dict[object, int] = {}
    for t in submit_order(tasks):
        if t.project_id not in per_project:
            rank[t.project_id] = len(rank)
            per_project[t.project_id] = deque()
        per_project[t.project_id].append(t)
    heap = [(share_of(p), q[0].submit_time, rank[p]) for p, q in per_project.items()]
    heapq.heapify(heap)
    projects = list(per_project)
    while heap:
        share, _submit, r = heapq.heappop(heap)
        p = projects[r]
        current = share_of(p)
        if current > share + EPS:
            # A start elsewhere raised this project's share since it was queued: re-queue it.
            heapq.heappush(heap, (current, per_project[p][0].submit_time, r))
            continue
        q = per_project[p]
        yield q.popleft()
        if q:
            heapq.heappush(heap, (share_of(p), q[0].submit_time, r))


def queue_order(policy: str, tasks: list[Task], share_of: Callable[[object], float]) -> Iterator[Task]:
    """The consideration order of one queue under its policy."""
    if policy == DRF:
        return drf_order(tasks, share_of)
    return iter(submit_order(tasks))
