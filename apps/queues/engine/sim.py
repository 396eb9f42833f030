"""Discrete-event simulator that drives the real engine with a simulated clock.

:func:`replay` feeds tasks at their arrival times into a :class:`~.engine.Scheduler`, runs a
cycle at every event time (arrivals and finishes), applies the decisions (starts schedule a
finish event; preemptions cancel it, and the task loses the work done since its last
checkpoint and pays a restart overhead when it runs again) and reports waits, JCT,
slowdown, GPU allocation, preemptions, lost GPU-hours and fairness. :func:`inflation` is
the workload-inflation experiment of Weng et al. (ATC'23): tasks sampled from a trace
arrive one by one and never leave, until the arrived GPU demand reaches a multiple of the
capacity; it reports the GPUs left unallocated.
"""

from __future__ import annotations

import heapq
import random
import time
import warnings
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field, replace

from .engine import Scheduler
from .model import (
    HIGH,
    LOW,
    MEDIUM,
    Cluster,
    GpuModel,
    Node,
    ProjectQuota,
    Queue,
    Snapshot,
    Task,
    VdcSettings,
    WorkloadShape,
    speedup,
)


@dataclass(frozen=True, slots=True)
class SimTask:
    """A task of a simulation: arrives at ``arrival`` and needs ``duration`` seconds of run time (an elastic task:
    at its minimum replicas; with more it runs faster by its speed-up curve, :func:`~.model.speedup`).

    ``checkpoint_s``: the task saves its progress every that many seconds of a run, so a preemption loses only the
    work since the last checkpoint; None (the default) = no checkpoints, a preemption loses the whole run.
    """

    task: Task
    arrival: float
    duration: float
    gpu: float
    checkpoint_s: float | None = None


@dataclass
class SimResult:
    """What one simulation run measured."""

    label: str
    tasks: int
    finished: int
    wait_p50: dict = field(default_factory=dict)
    wait_p99: dict = field(default_factory=dict)
    avg_jct: float = 0.0
    avg_slowdown: float = 0.0
    gpu_allocation: float = 0.0  # allocated GPU-time / capacity-time, first to last arrival
    preemptions: int = 0
    lost_gpu_hours: float = 0.0  # work thrown away by preemptions plus restart overheads, in GPU-hours
    jain: float = 0.0
    cycles: int = 0
    wall_s: float = 0.0
    fgd_default_cycles: int = 0  # cycles FGD ran on the default workload mix (nothing to learn from)
    finish_times: dict = field(default_factory=dict)
    start_times: dict = field(default_factory=dict)  # task id -> its first start


def percentile(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile (0 for an empty list)."""
    if not values:
        return 0.0
    s = sorted(values)
    k = max(0, min(len(s) - 1, round(q / 100 * len(s) + 0.5) - 1))
    return s[k]


def jain(values: Iterable[float]) -> float:
    """Jain's fairness index: 1 when all equal, 1/n when one gets everything."""
    xs = list(values)
    if not xs or not any(xs):
        return 0.0
    return sum(xs) ** 2 / (len(xs) * sum(x * x for x in xs))


def _gpu_of(placements) -> float:
    return sum(share.milli for p in placements for share in p.devices) / 1000


def _rate(task: Task, replicas: int) -> float:
    """How fast a task runs on ``replicas`` replicas relative to its duration: 1 for a task of fixed size; an
    elastic task's duration is its run time at its minimum, and it runs faster by its speed-up curve."""
    if task.max_replicas is None:
        return 1.0
    return speedup(task, replicas) / speedup(task, task.min_replicas or 1)


def replay(
    label: str,
    nodes: Sequence[Node],
    models: Sequence[GpuModel],
    queues: Sequence[Queue],
    tasks: Sequence[SimTask],
    settings: VdcSettings | None = None,
    quotas: Sequence[ProjectQuota] = (),
    cycle_interval: float = 0.0,
    restart_overhead_s: float = 0.0,
    on_submit: Callable[[Scheduler, Task, float], None] | None = None,
) -> SimResult:
    """Replay ``tasks`` on ``nodes`` through the engine.

    A cycle runs at an event time unless one ran less than ``cycle_interval`` seconds ago;
    then the events wait for a tick at the end of the interval (a coalescing scheduler
    loop, as the Celery beat task does). A preempted task keeps the work up to its last
    checkpoint (:class:`SimTask`) and needs ``restart_overhead_s`` more when it starts again;
    its ``attained_gpu_s`` grows by the GPU-seconds of every run (policy "las" reads it).
    ``on_submit(scheduler, task, now)`` is called after each arrival is submitted (for measurements that need
    the state the task arrives into); it must not change the scheduler.
    """
    if restart_overhead_s < 0:
        raise ValueError(f"restart_overhead_s must be >= 0, got {restart_overhead_s!r}")
    wall = time.perf_counter()
    clusters = tuple(Cluster(cid) for cid in dict.fromkeys(n.cluster_id for n in nodes))
    t0 = min((s.arrival for s in tasks), default=0.0)
    sched = Scheduler(
        Snapshot(
            t0, clusters, tuple(nodes), tuple(models), tuple(queues), tuple(quotas), settings=settings or VdcSettings()
        )
    )
    capacity = sum(len(n.devices) for n in nodes)
    cls = {q.id: q.priority_class for q in queues}
    by_id = {s.task.id: s for s in tasks}
    events: list = []
    for i, s in enumerate(tasks):
        heapq.heappush(events, (s.arrival, 1, i, "arrive", s.task.id, 0))
    seq = len(tasks)
    remaining = {s.task.id: s.duration for s in tasks}
    version: dict = {}
    started_at: dict = {}
    held: dict = {}
    first_start: dict = {}
    finish: dict = {}
    alloc = 0.0
    gpu_time = 0.0
    last = t0
    preemptions = 0
    lost_gpu_s = 0.0
    restarting: set = set()
    progress: dict = {}
    cycles = 0
    next_cycle = t0
    tick_pending = False
    t_end = max((s.arrival for s in tasks), default=t0)
    while events:
        now = events[0][0]
        # Allocation is measured while tasks arrive: the long tail of a few long tasks
        # after the last arrival would otherwise dominate the average.
        gpu_time += alloc * max(0.0, min(now, t_end) - min(last, t_end))
        last = now
        while events and events[0][0] == now:
            _t, _o, _s, kind, tid, ver = heapq.heappop(events)
            if kind == "tick":
                tick_pending = False
            elif kind == "arrive":
                sched.submit(by_id[tid].task)
                if on_submit is not None:
                    on_submit(sched, by_id[tid].task, now)
            elif version.get(tid, 0) == ver and tid in started_at:
                sched.finish(tid)
                alloc -= held.pop(tid)
                progress.pop(tid, None)
                del started_at[tid]
                finish[tid] = now
        if now < next_cycle:
            if not tick_pending:
                seq += 1
                heapq.heappush(events, (next_cycle, 2, seq, "tick", None, 0))
                tick_pending = True
            continue
        next_cycle = now + cycle_interval
        d = sched.cycle(now)
        cycles += 1
        for p in d.preemptions:
            tid = p.task_id
            preemptions += 1
            version[tid] = version.get(tid, 0) + 1
            ran = now - started_at.pop(tid)
            g = held.pop(tid)
            alloc -= g
            done = progress.pop(tid)
            done[0] += max(0.0, now - done[1]) * done[2]
            # A restart first repeats its overhead, then the work from the checkpoint on.
            worked = max(0.0, ran - restart_overhead_s) if tid in restarting else ran
            ckpt = by_id[tid].checkpoint_s
            kept = 0.0 if not ckpt or ckpt <= 0 else (worked // ckpt) * ckpt
            # Work is counted at the task's speed (an elastic task's depends on its replicas); the checkpoints keep
            # the share of it done by the last one.
            remaining[tid] -= done[0] * (kept / worked) if worked > 0 else 0.0
            lost_gpu_s += (ran - kept) * g
            restarting.add(tid)
            requeued = sched.queued.get(tid)
            if requeued is not None:
                sched.queued[tid] = replace(requeued, attained_gpu_s=requeued.attained_gpu_s + ran * g)
        for r in d.resizes:
            tid = r.task_id
            delta = _gpu_of(r.added) - _gpu_of(r.removed)
            held[tid] += delta
            alloc += delta
            # The work done so far at the old speed, then the rest at the new one: a new finish time.
            done = progress[tid]
            if now > done[1]:
                done[0] += (now - done[1]) * done[2]
                done[1] = now
            done[2] = _rate(by_id[tid].task, r.replicas)
            version[tid] = version.get(tid, 0) + 1
            seq += 1
            end = done[1] + max(remaining[tid] - done[0], 0.0) / done[2]
            heapq.heappush(events, (end, 0, seq, "finish", tid, version[tid]))
        for st in d.starts:
            tid = st.task_id
            started_at[tid] = now
            first_start.setdefault(tid, now)
            g = _gpu_of(st.placements)
            held[tid] = g
            alloc += g
            seq += 1
            begin = now + (restart_overhead_s if tid in restarting else 0.0)
            rate = _rate(by_id[tid].task, len(st.placements))
            progress[tid] = [0.0, begin, rate]  # work done in this run, since when it accrues, at what speed
            run_time = begin - now + max(remaining[tid], 0.0) / rate
            heapq.heappush(events, (now + run_time, 0, seq, "finish", tid, version.get(tid, 0)))

    res = SimResult(label, len(tasks), len(finish), preemptions=preemptions, cycles=cycles)
    res.lost_gpu_hours = (lost_gpu_s + restart_overhead_s * sum(by_id[t].gpu for t in finish if t in restarting)) / 3600
    res.finish_times = dict(finish)
    res.start_times = dict(first_start)
    res.fgd_default_cycles = sched.fgd_default_cycles
    if res.fgd_default_cycles:
        warnings.warn(
            f"{label}: FGD scored {res.fgd_default_cycles} of {cycles} cycles against its default workload mix "
            "(no valid request to learn from and no VdcSettings.fgd_workload)",
            UserWarning,
            stacklevel=2,
        )
    for c in (HIGH, MEDIUM, LOW):
        waits = [first_start[t] - by_id[t].arrival for t in first_start if cls[by_id[t].task.queue_id] == c]
        res.wait_p50[c] = percentile(waits, 50)
        res.wait_p99[c] = percentile(waits, 99)
    jcts = [finish[t] - by_id[t].arrival for t in finish]
    res.avg_jct = sum(jcts) / len(jcts) if jcts else 0.0
    slow = [(finish[t] - by_id[t].arrival) / max(by_id[t].duration, 10.0) for t in finish]
    res.avg_slowdown = sum(slow) / len(slow) if slow else 0.0
    horizon = t_end - t0
    res.gpu_allocation = gpu_time / (capacity * horizon) if capacity and horizon > 0 else 0.0
    # Fairness: per project, GPU-seconds of work done over GPU-seconds spent in the system.
    done: dict = {}
    spent: dict = {}
    for t in finish:
        s = by_id[t]
        w = max(s.gpu, 0.01)
        done[s.task.project_id] = done.get(s.task.project_id, 0.0) + s.duration * w
        spent[s.task.project_id] = spent.get(s.task.project_id, 0.0) + (finish[t] - s.arrival) * w
    res.jain = jain(done[p] / spent[p] for p in done if spent[p] > 0)
    res.wall_s = time.perf_counter() - wall
    return res


@dataclass
class InflationPoint:
    """State of an inflation run when the arrived GPU demand reached ``arrived_pct`` of capacity."""

    arrived_pct: float
    arrived_gpus: float
    allocated_gpus: float
    unallocated_gpus: float
    failed_tasks: int


def inflation(
    nodes: Sequence[Node],
    models: Sequence[GpuModel],
    shapes: Sequence[Task],
    scorer: str,
    seed: int = 0,
    checkpoints: Sequence[float] = (0.5, 0.7, 0.8, 0.9, 1.0),
    workload: tuple[WorkloadShape, ...] | None = None,
) -> list[InflationPoint]:
    """Workload inflation: sample ``shapes`` (with replacement) until demand passes capacity.

    Every sampled task is offered to the engine once; a task that does not fit is dropped
    (no queueing, no departures), as in the paper. Returns one point per checkpoint.
    """
    clusters = tuple(Cluster(cid) for cid in dict.fromkeys(n.cluster_id for n in nodes))
    queue = Queue("q", HIGH)
    settings = VdcSettings(node_scorer=scorer, fgd_workload=workload)
    sched = Scheduler(Snapshot(0.0, clusters, tuple(nodes), tuple(models), (queue,), settings=settings))
    capacity = sum(len(n.devices) for n in nodes)
    rnd = random.Random(seed)
    arrived = allocated = 0.0
    failed = 0
    points = []
    marks = sorted(checkpoints)
    i = 0
    while marks:
        base = rnd.choice(shapes)
        t = Task(**{**{f: getattr(base, f) for f in Task.__slots__}, "id": i, "queue_id": "q"})
        i += 1
        sched.submit(t)
        d = sched.cycle(0.0)
        gpu = float(t.gpu.count) if t.gpu is not None else 0.0
        arrived += gpu
        if d.starts:
            allocated += _gpu_of(d.starts[0].placements)
        else:
            sched.finish(t.id)
            failed += 1
        while marks and arrived >= marks[0] * capacity:
            points.append(InflationPoint(marks[0] * 100, arrived, allocated, capacity - allocated, failed))
            marks.pop(0)
    return points
