"""Engine speed at the §13 reference scale: 2,000 nodes, 16,000 GPUs, 10,000 queued tasks.

Run: ``python -m benchmarks.engine_speed``. Targets: a full cycle <= 1.0 s (issue 3) at that
scale and <= 1.5 s at 16,000 nodes / 100,000 queued tasks (issue 13), and an incremental cycle
(20 new tasks on a loaded VDC, a page of the waiting list read) <= 50 ms. Full cycles read every
waiting entry, as the Django service does. A plain first-fit FIFO loop over the same tasks and
nodes (no index, no classes, no quotas) runs in the same process so the ratio is visible.
"""

from __future__ import annotations

import argparse
import gc
import statistics
import time

from apps.queues.engine import Scheduler, schedule

from . import synthetic
from .table import print_table


def reference_first_fit(tasks, nodes) -> int:
    """The naive loop: every task scans every node in order for enough free cards of its model."""
    free_cpu = [n.cpu for n in nodes]
    free_mem = [n.memory_gib for n in nodes]
    free = [[1000] * len(n.devices) for n in nodes]
    model = [n.devices[0].model if n.devices else None for n in nodes]
    started = 0
    for t in sorted(tasks, key=lambda t: t.submit_time):
        req = t.gpu
        count = float(req.count) if req is not None else 0.0
        allowed = set(req.models) if req is not None and req.models else None
        taken = []
        for _ in range(t.instances):
            for i in range(len(nodes)):
                if free_cpu[i] < t.cpu or free_mem[i] < t.memory_gib:
                    continue
                if count and allowed is not None and model[i] not in allowed:
                    continue
                if count >= 1:
                    devs = [j for j, f in enumerate(free[i]) if f == 1000][: int(count)]
                    if len(devs) < count:
                        continue
                    milli = 1000
                elif count > 0:
                    devs = [j for j, f in enumerate(free[i]) if f >= count * 1000][:1]
                    if not devs:
                        continue
                    milli = int(count * 1000)
                else:
                    devs, milli = [], 0
                free_cpu[i] -= t.cpu
                free_mem[i] -= t.memory_gib
                for j in devs:
                    free[i][j] -= milli
                taken.append((i, devs, milli, t))
                break
            else:
                break
        if len(taken) == t.instances:
            started += 1
        else:
            for i, devs, milli, tt in taken:
                free_cpu[i] += tt.cpu
                free_mem[i] += tt.memory_gib
                for j in devs:
                    free[i][j] += milli
    return started


def _timed(fn):
    gc.collect()
    t0 = time.perf_counter()
    result = fn()
    return result, time.perf_counter() - t0


def _full_cycle(snap, reps: int) -> tuple:
    """Median and max seconds of ``schedule(snap)`` with every waiting entry read (as the Django service does),
    the decisions of the last run, and the median share spent computing the waiting entries."""
    times, waits = [], []
    d = None
    for _ in range(reps):
        d, secs = _timed(lambda: schedule(snap))
        _w, wsecs = _timed(lambda d=d: tuple(d.waiting))
        times.append(secs + wsecs)
        waits.append(wsecs)
    return statistics.median(times), max(times), d, statistics.median(waits)


def run(
    nodes: int = 2000,
    queued: int = 10_000,
    new: int = 20,
    scorer: str = "best_fit",
    reps: int = 5,
    large: tuple[int, int] | None = (16_000, 100_000),
) -> list[list]:
    """Build the reference VDC, time the cycles and return the table rows.

    The machine is shared, so engine timings are the median of ``reps`` runs (the slowest
    run is shown too); the reference loop is slow enough to run once. ``large`` = (nodes, queued)
    adds a full cycle at that scale (the reference loop is not run there: it would take many minutes).
    """
    node_list = synthetic.nodes(nodes)
    tasks = synthetic.tasks(queued)
    gpus = sum(len(n.devices) for n in node_list)
    snap = synthetic.snapshot(tasks, node_list, scorer=scorer)
    rows = []
    notes = []

    started, secs = _timed(lambda: reference_first_fit(tasks, node_list))
    rows.append(
        [
            "reference first-fit FIFO loop",
            nodes,
            queued,
            len(tasks),
            started,
            secs * 1000,
            "",
            len(tasks) / secs,
            1.0,
            "",
        ]
    )
    ref = secs

    secs, worst, d, wsecs = _full_cycle(snap, max(1, reps // 2))
    decided = len(d.starts) + len(d.waiting)
    rows.append(
        [
            f"engine full cycle ({scorer}), all waiting read",
            nodes,
            queued,
            decided,
            len(d.starts),
            secs * 1000,
            worst * 1000,
            decided / secs,
            ref / secs,
            1000,
        ]
    )
    notes.append(
        f"full cycle at {nodes} nodes: {wsecs * 1000:.0f} ms of it computing {len(d.waiting):,} waiting entries"
    )

    # Loaded VDC kept by a Scheduler, settled (the backlog's own preemptions done, at most a few
    # cycles); then 20 new tasks arrive and one cycle runs over them and the backlog. Waiting
    # entries are computed as they are read: a page of the queue (the first 50), then all of them.
    sched = Scheduler(snap)
    sched.cycle(snap.now)
    for _ in range(5):
        settle = sched.cycle(snap.now)
        if not settle.starts and not settle.preemptions:
            break
    page_times, all_times, decided, n_started = [], [], 0, 0
    for rep in range(reps):
        for t in synthetic.tasks(new, seed=7 + rep, start=queued + rep * new, t0=snap.now + rep):
            sched.submit(t)
        d2, secs = _timed(lambda rep=rep: sched.cycle(snap.now + 1 + rep))
        _page, psecs = _timed(lambda d2=d2: d2.waiting[:50])
        _all, asecs = _timed(lambda d2=d2: tuple(d2.waiting))
        page_times.append(secs + psecs)
        all_times.append(secs + psecs + asecs)
        decided, n_started = len(d2.starts) + len(d2.waiting), n_started + len(d2.starts)
    for label, times, target in (("first 50 waiting read", page_times, 50), ("all waiting read", all_times, "")):
        secs = statistics.median(times)
        rows.append(
            [
                f"incremental: +{new} tasks, Scheduler kept, {label}",
                nodes,
                queued,
                decided,
                n_started // reps,
                secs * 1000,
                max(times) * 1000,
                decided / secs,
                "",
                target,
            ]
        )

    # The stateless path the Django service takes: snapshot of the loaded VDC, only the new tasks queued.
    extra = synthetic.tasks(new, seed=99, start=queued * 10, t0=snap.now)
    snap2 = synthetic.snapshot(extra, node_list, running=list(_running_of(sched)), now=snap.now + 99, scorer=scorer)
    secs, worst, d3, _w = _full_cycle(snap2, max(1, reps // 2))
    rows.append(
        [
            f"stateless schedule(): {len(sched.running)} running, +{new} queued",
            nodes,
            len(extra),
            len(d3.starts) + len(d3.waiting),
            len(d3.starts),
            secs * 1000,
            worst * 1000,
            (len(d3.starts) + len(d3.waiting)) / secs,
            "",
            "",
        ]
    )

    if large is not None:
        big_nodes, big_queued = large
        big = synthetic.snapshot(synthetic.tasks(big_queued), synthetic.nodes(big_nodes), scorer=scorer)
        secs, worst, d4, wsecs = _full_cycle(big, max(1, reps // 2))
        decided = len(d4.starts) + len(d4.waiting)
        rows.append(
            [
                f"engine full cycle ({scorer}), all waiting read",
                big_nodes,
                big_queued,
                decided,
                len(d4.starts),
                secs * 1000,
                worst * 1000,
                decided / secs,
                "",
                1500,
            ]
        )
        notes.append(
            f"full cycle at {big_nodes} nodes: {wsecs * 1000:.0f} ms of it computing "
            f"{len(d4.waiting):,} waiting entries"
        )
    print(f"VDC: {nodes} nodes, {gpus} GPUs, 4 clusters; {queued} queued tasks; node scorer {scorer}")
    print_table(
        [
            "case",
            "nodes",
            "queued",
            "tasks decided",
            "started",
            "ms (median)",
            "ms (max)",
            "decisions/s",
            "speed-up vs ref",
            "target ms",
        ],
        rows,
    )
    for note in notes:
        print(note)
    return rows


def _running_of(sched):
    from apps.queues.engine import RunningTask

    for r in sched.running.values():
        yield RunningTask(r.task, r.cluster_id, tuple(r.placements), r.started_at, r.window_s)


def main() -> None:
    """Command-line entry point."""
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--nodes", type=int, default=2000)
    p.add_argument("--queued", type=int, default=10_000)
    p.add_argument("--scorer", default="best_fit")
    p.add_argument("--large-nodes", type=int, default=16_000, help="nodes of the large full cycle (0: skip it)")
    p.add_argument("--large-queued", type=int, default=100_000)
    a = p.parse_args()
    run(a.nodes, a.queued, scorer=a.scorer, large=(a.large_nodes, a.large_queued) if a.large_nodes else None)


if __name__ == "__main__":
    main()
