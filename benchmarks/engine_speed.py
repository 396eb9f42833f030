"""Engine speed at the reference scale (docs/rules.md): 2,000 nodes, 16,000 GPUs, 10,000 queued tasks.

Run: ``python -m benchmarks.engine_speed``. Targets: a full cycle <= 1.0 s at that
scale and <= 1.5 s at 16,000 nodes / 100,000 queued tasks (docs/rules.md#performance-targets), and an incremental cycle
(20 new tasks on a loaded VDC kept by a ``Scheduler``, a page of the waiting list read) <= 50 ms, and <= 100 ms at
16,000 nodes / 100,000 queued tasks (with 2,000 new tasks a cycle shown beside it). Full cycles compute
every waiting entry, as the Django service needs them. A plain first-fit FIFO loop over the same
tasks and nodes (no index, no classes, no quotas) runs in the same process so the ratio is
visible. Times are CPU time of the benchmark process (see ``_timed``).
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
    """``fn()`` and the CPU seconds it took. The development machine is shared: CPU time moves far less than
    wall time under other people's load, and the engine is single-threaded, so on an idle machine they agree."""
    gc.collect()
    t0 = time.process_time()
    result = fn()
    return result, time.process_time() - t0


def _full_cycle(snap, reps: int) -> tuple:
    """Median and max seconds of ``schedule(snap)`` (which computes every waiting entry, as the Django service
    needs them all) and the decisions of the last run."""
    times = []
    d = None
    for _ in range(reps):
        d, secs = _timed(lambda: schedule(snap))
        times.append(secs)
    return statistics.median(times), max(times), d


def _row(case, nodes, queued, decided, started, times_or_secs, ref, target) -> list:
    """A table row from a list of timings or a (median, max) pair; ``ref`` = the reference loop's seconds."""
    if isinstance(times_or_secs, list):
        secs, worst = statistics.median(times_or_secs), max(times_or_secs)
    else:
        secs, worst = times_or_secs
    return [
        case,
        nodes,
        queued,
        decided,
        started,
        secs * 1000,
        worst * 1000 if worst is not None else "",
        decided / secs,
        ref / secs if ref else "",
        target,
    ]


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

    started, ref = _timed(lambda: reference_first_fit(tasks, node_list))
    rows.append(_row("reference first-fit FIFO loop", nodes, queued, len(tasks), started, (ref, None), ref, ""))

    secs, worst, d = _full_cycle(snap, max(1, reps // 2))
    decided = len(d.starts) + len(d.waiting)
    rows.append(
        _row(f"full cycle: schedule() ({scorer})", nodes, queued, decided, len(d.starts), (secs, worst), ref, 1000)
    )

    # Loaded VDC kept by a Scheduler, settled; then 20 new tasks arrive and one cycle runs over them and the
    # backlog. Waiting entries are computed as they are read: a page of the queue (the first 50), then all of them.
    sched = _settled(snap)
    page_times, all_times, decided, n_started = _incremental(sched, snap, queued, new, reps, read_all=True)
    case = f"incremental: +{new} tasks, Scheduler kept"
    rows.append(_row(f"{case}, first 50 waiting read", nodes, queued, decided, n_started, page_times, 0, 50))
    rows.append(_row(f"{case}, all waiting read", nodes, queued, decided, n_started, all_times, 0, ""))

    # The stateless path the Django service takes: snapshot of the loaded VDC, only the new tasks queued.
    extra = synthetic.tasks(new, seed=99, start=queued * 10, t0=snap.now)
    snap2 = synthetic.snapshot(extra, node_list, running=list(_running_of(sched)), now=snap.now + 99, scorer=scorer)
    secs, worst, d3 = _full_cycle(snap2, max(1, reps // 2))
    case = f"stateless schedule(): {len(sched.running)} running, +{new} queued"
    rows.append(_row(case, nodes, len(extra), len(d3.starts) + len(d3.waiting), len(d3.starts), (secs, worst), 0, ""))

    if large is not None:
        big_nodes, big_queued = large
        big = synthetic.snapshot(synthetic.tasks(big_queued), synthetic.nodes(big_nodes), scorer=scorer)
        secs, worst, d4 = _full_cycle(big, max(1, reps // 2))
        case = f"full cycle: schedule() ({scorer})"
        rows.append(
            _row(case, big_nodes, big_queued, len(d4.starts) + len(d4.waiting), len(d4.starts), (secs, worst), 0, 1500)
        )
        # The steady state at that scale: a kept Scheduler, settled, then 20 (and 2,000) new tasks per cycle.
        del d4
        big_sched = _settled(big)
        first_id, t_first = big_queued, 0
        for big_new, big_reps, target in ((new, reps, 100), (2000, max(1, reps // 2 + 1), "")):
            page, _all, decided, n_started = _incremental(big_sched, big, first_id, big_new, big_reps, t_first=t_first)
            first_id, t_first = first_id + big_new * big_reps, t_first + big_reps
            case = f"incremental: +{big_new} tasks, Scheduler kept, first 50 waiting read"
            rows.append(_row(case, big_nodes, big_queued, decided, n_started, page, 0, target))
    print(f"VDC: {nodes} nodes, {gpus} GPUs, 4 clusters; {queued} queued tasks; node scorer {scorer}")
    headers = [
        "case",
        "nodes",
        "queued",
        "tasks decided",
        "started",
        "CPU ms (median)",
        "CPU ms (max)",
        "decisions/s",
        "speed-up vs ref",
        "target ms",
    ]
    print_table(headers, rows)
    return rows


def _settled(snap):
    """A Scheduler kept over ``snap`` after its first cycles (the backlog's own preemptions done, at most a few)."""
    sched = Scheduler(snap)
    sched.cycle(snap.now)
    for _ in range(5):
        settle = sched.cycle(snap.now)
        if not settle.starts and not settle.preemptions:
            break
    return sched


def _incremental(sched, snap, first_id: int, new: int, reps: int, read_all: bool = False, t_first: int = 0) -> tuple:
    """``reps`` cycles of the kept ``sched``, each after ``new`` tasks (ids from ``first_id``) arrive, the first at
    ``snap.now + t_first``: CPU seconds until the first 50 waiting entries are read, until all are (``read_all``),
    tasks decided in the last cycle and mean starts per cycle."""
    page_times, all_times, decided, n_started = [], [], 0, 0
    for rep in range(reps):
        t0_rep = snap.now + t_first + rep
        for t in synthetic.tasks(new, seed=7 + rep, start=first_id + rep * new, t0=t0_rep):
            sched.submit(t)
        # One collection before, none in between: reading right after the cycle, as a caller would.
        gc.collect()
        t0 = time.process_time()
        d = sched.cycle(t0_rep + 1)
        d.waiting[:50]
        page_times.append(time.process_time() - t0)
        if read_all:
            tuple(d.waiting)
            all_times.append(time.process_time() - t0)
        decided, n_started = len(d.starts) + len(d.waiting), n_started + len(d.starts)
    return page_times, all_times, decided, n_started // reps


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
