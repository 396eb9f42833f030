"""Scheduling quality of every engine queue policy against reference policies (docs/rules.md#scheduling-quality).

Run: ``python -m benchmarks.policy_quality`` (``--quick`` for a smaller run). Two workloads:

* **openb**: the Alibaba trace as in :mod:`benchmarks.trace_replay` (every ``--node-stride``-th GPU node,
  arrivals compressed ``--compress`` x, durations kept; qos LS/Guaranteed -> high, Burstable -> medium,
  BE -> low; tenants synthetic, crc32(pod name) mod 8). Pods that fit no node of the subset are left out.
* **synthetic**: :func:`synthetic_jobs`, a heavy-tailed workload on 8 nodes x 8 A100: sizes 1/2/4/8 GPUs
  (55/25/12/8 %), lognormal durations (median 10 min, sigma 1.6, clipped to 30 s .. 3 days), four projects
  submitting 40/30/20/10 % of the jobs, classes high/medium/low 10/60/30 %, and bursty arrivals: arrival
  events are Poisson, 15 % of them are a sweep of a geometric number of jobs (mean 8, 2 s apart, same project
  and size); the rate is set for an offered load of ``--load`` x the GPUs. Seeded.

* **generated** (``--generators``, default all; ``--seeds``, default 1,2,3; ``--gen-jobs``, default 300):
  :mod:`benchmarks.generators`, workloads modelled on published trace statistics (Philly, Helios, Alibaba PAI,
  a stream of medium work behind whole-node high tasks, Pollux-like elastic jobs), on 8 nodes x 8 A100.
  ``--skip-classic`` runs only these.

Every engine policy replays each workload through the real engine (:func:`apps.queues.engine.sim.replay`,
three queues, one per class, all with that policy; a cycle at most every ``--interval`` s). The reference
policies run the same jobs in an independent event loop of this module (:func:`reference`), not the engine:

* ``ref:sjf`` oracle shortest-job-first (true durations), non-preemptive, work-conserving;
* ``ref:2d-las`` Tiresias' discretised 2D-LAS: preemptive, attained service (GPUs x seconds run) in levels
  of 1 and 10 GPU-hours, FIFO within a level; a job that waited since its last preemption more than 2x the
  time it has run is promoted to the top level (its service counted from zero again). As in Tiresias a
  preempted job is checkpointed when stopped: it loses no work and pays the restart overhead;
* ``ref:2d-las lossy`` the same, but preemption costs what it costs the engine's tasks (below);
* ``ref:easy`` EASY backfill: FIFO, the blocked head reserves the node it can start on first (true ends),
  later jobs run if they do not delay it.
* ``ref:elastic`` (workloads with elastic jobs): :func:`elastic_reference`, an idealised Pollux-like elastic
  scheduler: jobs admitted at their minimum in arrival order, every spare card to the highest marginal speed-up
  per card, reallocated for free at every arrival and finish, on one pool of cards.

For the generated workloads the verdicts give, per seed: the best engine policy's avg JCT over ref:2d-las
(target <= 1.05x), las over ref:2d-las (target <= 1.1x), the best over ref:elastic where there is one (target
<= 1.2x), and per policy the high tasks whose wait exceeded the longest remaining guaranteed window of the medium
tasks running when they arrived (plus two cycles).

The references are class-blind (one queue) and see each node as a pool of GPU thousandths (no models, cpu,
memory or card boundaries), so they are slightly optimistic relaxations; they decide on the same cycle
interval. The engine and the other references pay the same preemption cost: work since the last checkpoint
(``--checkpoint`` s) is lost and every restart costs ``--restart`` s. Waits are from arrival to first start;
JCT from arrival to finish; utilisation is allocated GPU-time over capacity while jobs arrive; Jain's index is
over projects of (GPU-seconds of work done / GPU-seconds spent in the system).

High-class target (docs/rules.md#scheduling-quality: "high-class p99 wait <= 2 cycles whenever the high task fits the
VDC and its quota"):
``hi fit`` counts the high tasks that fit when they arrive (:func:`high_fits`: their request can be placed on
capacity held by no non-preemptible work, i.e. running high tasks, medium tasks inside their window and tasks
marked not preemptible, after the high tasks that arrived earlier and still wait took theirs; within the
project's enforced quota; in a strict fifo / drf queue, not behind a waiting task of its queue that does not fit
and wants the same models); ``p99 fit hi cyc`` is their 99th-percentile wait in cycles (``--interval``). A wait of
up to one cycle is the coalescing of the cycle loop itself. The references are class-blind and have no such column.
"""

from __future__ import annotations

import argparse
import heapq
import math
import random
import time
from dataclasses import dataclass, replace

from apps.queues.engine import POLICIES, GpuModel, GpuRequest, Queue, Task
from apps.queues.engine.model import CLASS_RANK, DRF, FIFO, HIGH, LOW, MEDIUM, Device, Node, speedup
from apps.queues.engine.policies import LAS_STARVE_FACTOR, LAS_THRESHOLDS_GPU_S
from apps.queues.engine.resources import WHOLE, Demand, fits_under
from apps.queues.engine.sim import SimTask, jain, percentile, replay
from apps.queues.engine.trace import TRACE_MODELS

from . import generators
from .table import print_table
from .trace_replay import build as build_openb

CLASSES = (HIGH, MEDIUM, LOW)
A100 = GpuModel("A100-80G", "nvidia", 80, 312, 19.5, 1.0, False)
HEADERS = [
    "workload",
    "policy",
    "jobs",
    "done",
    "avg JCT s",
    "p50 wait hi",
    "p99 hi",
    "p50 med",
    "p99 med",
    "p50 low",
    "p99 low",
    "util",
    "preempt",
    "lost GPU-h",
    "Jain",
    "hi fit",
    "p99 fit hi cyc",
    "wall s",
]
# Target: a high task that fits (see high_fits) starts within this many cycles, at the 99th percentile.
HIGH_FIT_CYCLES = 2.0


# -- workloads ------------------------------------------------------------------------------


def synthetic_nodes(count: int = 8, cards: int = 8) -> list[Node]:
    """``count`` nodes of ``cards`` A100 each (128 cores, 1 TiB)."""
    return [
        Node(f"n{i}", "syn", 128.0, 1024.0, tuple(Device(f"n{i}/{k}", k, A100.name) for k in range(cards)))
        for i in range(count)
    ]


def synthetic_jobs(n: int, gpus: int, load: float = 0.95, seed: int = 13, checkpoint: float | None = None):
    """The heavy-tailed, bursty workload of the module docstring as simulator tasks (deterministic per seed)."""
    rnd = random.Random(seed)
    sizes, size_w = (1, 2, 4, 8), (0.55, 0.25, 0.12, 0.08)
    projects, project_w = ("p0", "p1", "p2", "p3"), (0.4, 0.3, 0.2, 0.1)
    classes, class_w = CLASSES, (0.1, 0.6, 0.3)
    mu, sigma = math.log(600.0), 1.6
    mean_size = sum(s * w for s, w in zip(sizes, size_w, strict=True))
    mean_dur = math.exp(mu + sigma * sigma / 2)
    mean_batch = 0.85 + 0.15 * 8
    event_rate = load * gpus / (mean_size * mean_dur) / mean_batch
    out: list[SimTask] = []
    t = 0.0
    while len(out) < n:
        t += rnd.expovariate(event_rate)
        batch = 1 if rnd.random() < 0.85 else 1 + min(int(rnd.expovariate(1 / 7)), 40)
        project = rnd.choices(projects, project_w)[0]
        size = rnd.choices(sizes, size_w)[0]
        for b in range(batch):
            if len(out) >= n:
                break
            arrival = t + 2.0 * b
            duration = min(max(rnd.lognormvariate(mu, sigma), 30.0), 3 * 86400.0)
            cls = rnd.choices(classes, class_w)[0]
            task = Task(
                f"j{len(out)}",
                project,
                cls,
                cpu=4.0,
                memory_gib=16.0,
                gpu=GpuRequest(size),
                expected_duration_s=duration,
                submit_time=arrival,
            )
            out.append(SimTask(task, arrival, duration, float(size), checkpoint))
    return out


def openb_jobs(node_stride: int, compress: float, sample: int, checkpoint: float | None):
    """The openb replay's nodes and tasks, without pods no node of the subset can hold."""
    nodes, tasks = build_openb(node_stride, compress, sample)
    fits = []
    for s in tasks:
        models = set(s.task.gpu.models) if s.task.gpu is not None and s.task.gpu.models else None
        cards = max(
            (len(n.devices) for n in nodes if models is None or (n.devices and n.devices[0].model in models)),
            default=0,
        )
        if s.gpu <= cards:
            fits.append(replace(s, checkpoint_s=checkpoint))
    return nodes, fits


# -- the engine ------------------------------------------------------------------------------


def high_fits(sched, task, now: float) -> bool:
    """Whether a high task "fits" when it arrives (the high-class target's condition), from the scheduler's state.

    It fits when its request can be placed on capacity that no non-preemptible work holds (running high tasks,
    medium tasks inside their window, tasks marked not preemptible) nor the high tasks that arrived before it and
    still wait (placed first, in arrival order, on the same capacity), and its project's enforced quota limit and
    concurrency cap allow it. Everything else (low work, medium work past its window) the high task may preempt
    under docs/rules.md#priority-classes, so a fitting high task has nothing legitimate to wait for but the next cycle.
    In a strict queue
    (fifo, drf) a task behind an earlier waiting task that does not fit and wants the same GPU models does not fit
    either: waiting behind the head is what the admin chose that policy for.
    """
    high_rank = CLASS_RANK[HIGH]
    medium_rank = CLASS_RANK[MEDIUM]
    # Per schedulable node: [free cpu, free memory, [(model, free milli) per usable card]].
    free = {}
    for ns in sched.nodes:
        cv = sched.clusters.get(ns.cluster_id)
        if ns.schedulable and cv is not None and cv.usable:
            cards = [[m, WHOLE] for m, ok in zip(ns.dev_model, ns.dev_ok, strict=True) if ok]
            free[ns.pos] = [float(ns.node.cpu), float(ns.node.memory_gib), cards]
    for run in sched.running.values():
        in_window = run.rank == medium_rank and run.window_s is not None and now < run.started_at + run.window_s
        if run.rank != high_rank and run.task.preemptible and not in_window:
            continue
        for ns, cpu, mem, devs in run.claims:
            f = free.get(ns.pos)
            if f is None:
                continue
            f[0] -= cpu
            f[1] -= mem
            cards = [i for i, ok in enumerate(ns.dev_ok) if ok]
            for i, milli in devs:
                if i in cards:
                    f[2][cards.index(i)][1] -= milli

    failed: set = set()  # request shapes that did not fit: capacity only shrinks, so they never will

    def take(t) -> bool:
        d = sched.demand(t)
        if not isinstance(d, Demand) or d.key in failed:
            return False
        for alt in d.alternatives:
            model, cards, milli = alt[0], alt[1], alt[2]
            taken = []
            for _ in range(d.instances):
                best = None
                for pos, (cpu, mem, devs) in free.items():
                    if cpu + 1e-9 < d.cpu or mem + 1e-9 < d.memory_gib:
                        continue
                    if model is None:
                        fit = []
                    elif cards:
                        fit = [k for k, (m, f) in enumerate(devs) if m == model and f >= WHOLE][:cards]
                        if len(fit) < cards:
                            continue
                    else:
                        fit = sorted((f, k) for k, (m, f) in enumerate(devs) if m == model and f >= milli)[:1]
                        if not fit:
                            continue
                        fit = [fit[0][1]]
                    left = sum(f for _m, f in devs)
                    if best is None or left < best[0]:
                        best = (left, pos, fit)
                if best is None:
                    break
                _left, pos, fit = best
                f = free[pos]
                f[0] -= d.cpu
                f[1] -= d.memory_gib
                for k in fit:
                    f[2][k][1] -= WHOLE if cards else milli
                taken.append((pos, fit))
            if len(taken) == d.instances:
                return True
            for pos, fit in taken:  # put back a partly placed gang, try the next alternative
                f = free[pos]
                f[0] += d.cpu
                f[1] += d.memory_gib
                for k in fit:
                    f[2][k][1] += WHOLE if cards else milli
        failed.add(d.key)
        return False

    quota = sched.quotas.get(task.project_id)
    if quota is not None and quota.enforce:
        d = sched.demand(task)
        if quota.max_concurrent is not None and sched.proj_count.get(task.project_id, 0) >= quota.max_concurrent:
            return False
        if isinstance(d, Demand) and quota.limit is not None:
            usage = sched.proj_usage.get(task.project_id)
            if usage is not None and not any(fits_under(usage, d.vector(a), quota.limit) for a in d.alternatives):
                return False
    high_queues = {q.id for q in sched.queues.values() if q.priority_class == HIGH}
    ahead = sorted(
        (t for t in sched.queued.values() if t.queue_id in high_queues and t.id != task.id and t.submit_time < now),
        key=lambda t: t.submit_time,
    )
    strict = sched.queues[task.queue_id].policy in (FIFO, DRF)
    d = sched.demand(task)
    models = d.models if isinstance(d, Demand) else frozenset()
    for t in ahead:
        if not take(t) and strict and t.queue_id == task.queue_id:
            other = sched.demand(t)
            if isinstance(other, Demand) and (other.models & models or not (other.models or models)):
                return False
    return take(task)


def engine_row(
    workload: str, policy: str, nodes, models, tasks, interval: float, restart: float, windows: dict | None = None
) -> list:
    """Replay through the engine with every queue on ``policy``. ``windows``, when given, receives per high task
    (wait, the longest remaining guaranteed window of the medium tasks running when it arrived)."""
    queues = tuple(Queue(c, c, policy, window_floor_s=60) for c in CLASSES)
    fits: dict = {}
    window_left: dict = {}
    measuring = [0.0]  # seconds spent in high_fits: not the engine's time, taken out of "wall s"
    medium_rank = CLASS_RANK[MEDIUM]

    def observe(sched, task, now: float) -> None:
        if task.queue_id == HIGH:
            t = time.perf_counter()
            fits[task.id] = high_fits(sched, task, now)
            window_left[task.id] = max(
                (
                    run.started_at + run.window_s - now
                    for run in sched.running.values()
                    if run.rank == medium_rank and run.window_s is not None
                ),
                default=0.0,
            )
            measuring[0] += time.perf_counter() - t

    r = replay(
        policy, nodes, models, queues, tasks, cycle_interval=interval, restart_overhead_s=restart, on_submit=observe
    )
    arrival = {s.task.id: s.arrival for s in tasks}
    waits = [r.start_times.get(t, math.inf) - arrival[t] for t, ok in fits.items() if ok]
    if windows is not None:
        for t, left in window_left.items():
            windows[t] = (r.start_times.get(t, math.inf) - arrival[t], max(0.0, left))
    p99_fit = percentile(waits, 99) / interval if waits and interval > 0 else 0.0
    return [
        workload,
        policy,
        r.tasks,
        r.finished,
        r.avg_jct,
        r.wait_p50[HIGH],
        r.wait_p99[HIGH],
        r.wait_p50[MEDIUM],
        r.wait_p99[MEDIUM],
        r.wait_p50[LOW],
        r.wait_p99[LOW],
        f"{r.gpu_allocation:.1%}",
        r.preemptions,
        r.lost_gpu_hours,
        r.jain,
        f"{len(waits)}/{len(fits)}",
        p99_fit,
        r.wall_s - measuring[0],
    ]


# -- the reference policies (independent of the engine) ---------------------------------------


@dataclass
class Job:
    """A job of the reference loop: GPU demand in thousandths of a card on one node."""

    id: str
    project: object
    cls: str
    arrival: float
    duration: float
    gpu: float
    milli: int
    checkpoint: float | None


def _best_fit(free: list[int], milli: int, exclude: int = -1) -> int:
    """The node with the least free capacity that still holds ``milli`` (-1: none)."""
    best, best_free = -1, None
    for i, f in enumerate(free):
        if f >= milli and i != exclude and (best_free is None or f < best_free):
            best, best_free = i, f
    return best


def reference(
    policy: str, node_cards: list[int], sim_tasks, interval: float, restart: float, suspend: bool = False
) -> tuple[list, float]:
    """Run ``sim_tasks`` under reference ``policy`` (sjf, las, easy); returns the metric values of a row and the
    average JCT. ``suspend``: a preempted job is checkpointed as it is stopped (Tiresias), so it loses no work and
    pays only the restart overhead; otherwise it loses the work since its last periodic checkpoint."""
    wall = time.perf_counter()
    jobs = [
        Job(
            s.task.id,
            s.task.project_id,
            s.task.queue_id,
            s.arrival,
            s.duration,
            s.gpu,
            round(s.gpu * 1000),
            s.checkpoint_s,
        )
        for s in sim_tasks
    ]
    by_id = {j.id: j for j in jobs}
    free = [c * 1000 for c in node_cards]
    capacity = sum(node_cards)
    events: list = []
    seq = 0
    for j in jobs:
        heapq.heappush(events, (j.arrival, 1, seq, "arrive", j.id, 0))
        seq += 1
    waiting: list[Job] = []
    running: dict = {}  # id -> [node, start, end, version]
    remaining = {j.id: j.duration for j in jobs}
    attained = dict.fromkeys(remaining, 0.0)
    waiting_since = {j.id: j.arrival for j in jobs}
    executed = dict.fromkeys(remaining, 0.0)
    version: dict = {}
    restarting: set = set()
    first_start: dict = {}
    finish: dict = {}
    preemptions = 0
    lost = 0.0
    alloc = gpu_time = 0.0
    t0 = min(j.arrival for j in jobs)
    t_end = max(j.arrival for j in jobs)
    last = t0
    next_cycle = t0
    tick_at = None

    def start(j: Job, node: int, now: float) -> None:
        nonlocal seq, alloc
        free[node] -= j.milli
        alloc += j.gpu
        run = remaining[j.id] + (restart if j.id in restarting else 0.0)
        v = version.get(j.id, 0)
        running[j.id] = [node, now, now + run, v]
        first_start.setdefault(j.id, now)
        heapq.heappush(events, (now + run, 0, seq, "finish", j.id, v))
        seq += 1

    def preempt(j: Job, now: float) -> None:
        nonlocal preemptions, lost, alloc
        node, began, _end, _v = running.pop(j.id)
        free[node] += j.milli
        alloc -= j.gpu
        version[j.id] = version.get(j.id, 0) + 1
        ran = now - began
        worked = max(0.0, ran - restart) if j.id in restarting else ran
        if suspend:
            kept = worked
        else:
            kept = (worked // j.checkpoint) * j.checkpoint if j.checkpoint else 0.0
        remaining[j.id] -= kept
        lost += (ran - kept) * j.gpu
        attained[j.id] += ran * j.gpu
        executed[j.id] += ran
        waiting_since[j.id] = now
        restarting.add(j.id)
        preemptions += 1
        waiting.append(j)

    def level(j: Job, now: float) -> int:
        got = attained[j.id]
        if j.id in running:
            got += (now - running[j.id][1]) * j.gpu
        lv = sum(1 for th in LAS_THRESHOLDS_GPU_S if got >= th)
        if lv and j.id not in running and now - waiting_since[j.id] > LAS_STARVE_FACTOR * executed[j.id]:
            # Tiresias' guard: waited since its last preemption longer than a multiple of the time it has run.
            # The promotion resets its service, so it sinks again only as it runs.
            attained[j.id] = 0.0
            return 0
        return lv

    def schedule(now: float) -> None:
        nonlocal tick_at
        if policy == "sjf":
            waiting.sort(key=lambda j: (j.duration, j.arrival))
            top = max(free)
            keep = []
            for j in waiting:
                node = _best_fit(free, j.milli) if j.milli <= top else -1
                if node < 0:
                    keep.append(j)
                    continue
                start(j, node, now)
                top = max(free)
            waiting[:] = keep
        elif policy == "easy":
            waiting.sort(key=lambda j: j.arrival)
            keep = []
            shadow, rnode = None, -1
            for j in waiting:
                if shadow is None:
                    node = _best_fit(free, j.milli)
                    if node >= 0:
                        start(j, node, now)
                        continue
                    shadow, rnode = _reservation(j, now)
                    keep.append(j)
                    continue
                node = _best_fit(free, j.milli, exclude=rnode)
                if node < 0 and rnode >= 0 and now + remaining[j.id] <= shadow and free[rnode] >= j.milli:
                    node = rnode
                if node >= 0:
                    start(j, node, now)
                else:
                    keep.append(j)
            waiting[:] = keep
        else:  # las
            active = waiting + [by_id[i] for i in running]
            active.sort(key=lambda j: (level(j, now), j.arrival))
            virt = [c * 1000 for c in node_cards]
            top = max(virt)
            want: dict = {}
            for j in active:
                if j.milli > top:
                    continue
                node = running[j.id][0] if j.id in running else -1
                if node < 0 or virt[node] < j.milli:
                    # Prefer a node with room now (no preemption needed), then any the plan leaves room on.
                    node = -1
                    best = None
                    for i, v in enumerate(virt):
                        if v >= j.milli:
                            key = (free[i] < j.milli, v)
                            if best is None or key < best:
                                node, best = i, key
                if node >= 0:
                    virt[node] -= j.milli
                    want[j.id] = node
                    top = max(virt)
            for jid in [i for i in running if i not in want or want[i] != running[i][0]]:
                preempt(by_id[jid], now)
            keep = []
            for j in waiting:
                if j.id in want and j.id not in running:
                    start(j, want[j.id], now)
                else:
                    keep.append(j)
            waiting[:] = keep
            # The next time a running job crosses a level threshold, the order may change.
            nxt = None
            for jid, (_node, began, _end, _v) in running.items():
                j = by_id[jid]
                if j.gpu <= 0:
                    continue
                got = attained[jid] + (now - began) * j.gpu
                for th in LAS_THRESHOLDS_GPU_S:
                    if got < th:
                        at = now + (th - got) / j.gpu
                        nxt = at if nxt is None or at < nxt else nxt
                        break
            if nxt is not None and (tick_at is None or nxt < tick_at or tick_at <= now):
                _push_tick(nxt)

    def _reservation(head: Job, now: float):
        """EASY: the earliest time (from true expected ends) and node at which the head fits."""
        ends: dict = {}
        for jid, (node, _b, end, _v) in running.items():
            ends.setdefault(node, []).append((end, by_id[jid].milli))
        best = (math.inf, -1)
        for node, lst in ends.items():
            f = free[node]
            for end, milli in sorted(lst):
                f += milli
                if f >= head.milli:
                    best = min(best, (end, node))
                    break
        return best

    def _push_tick(at: float) -> None:
        nonlocal seq, tick_at
        tick_at = at
        heapq.heappush(events, (at, 2, seq, "tick", None, 0))
        seq += 1

    pending_tick = False
    while events:
        now = events[0][0]
        gpu_time += alloc * max(0.0, min(now, t_end) - min(last, t_end))
        last = now
        while events and events[0][0] == now:
            _t, _o, _s, kind, jid, ver = heapq.heappop(events)
            if kind == "arrive":
                waiting.append(by_id[jid])
            elif kind == "finish" and jid in running and running[jid][3] == ver:
                node = running.pop(jid)[0]
                j = by_id[jid]
                free[node] += j.milli
                alloc -= j.gpu
                finish[jid] = now
            elif kind == "cycle":
                pending_tick = False
        if now < next_cycle:
            if not pending_tick:
                heapq.heappush(events, (next_cycle, 3, seq, "cycle", None, 0))
                seq += 1
                pending_tick = True
            continue
        next_cycle = now + interval
        schedule(now)

    waits = {c: [first_start[j.id] - j.arrival for j in jobs if j.id in first_start and j.cls == c] for c in CLASSES}
    jcts = [finish[j.id] - j.arrival for j in jobs if j.id in finish]
    done: dict = {}
    spent: dict = {}
    for j in jobs:
        if j.id in finish:
            w = max(j.gpu, 0.01)
            done[j.project] = done.get(j.project, 0.0) + j.duration * w
            spent[j.project] = spent.get(j.project, 0.0) + (finish[j.id] - j.arrival) * w
    lost += restart * sum(by_id[i].gpu for i in finish if i in restarting)
    horizon = t_end - t0
    util = gpu_time / (capacity * horizon) if capacity and horizon > 0 else 0.0
    avg = sum(jcts) / len(jcts) if jcts else 0.0
    return [
        len(jobs),
        len(finish),
        avg,
        percentile(waits[HIGH], 50),
        percentile(waits[HIGH], 99),
        percentile(waits[MEDIUM], 50),
        percentile(waits[MEDIUM], 99),
        percentile(waits[LOW], 50),
        percentile(waits[LOW], 99),
        f"{util:.1%}",
        preemptions,
        lost / 3600,
        jain(done[p] / spent[p] for p in done if spent[p] > 0),
        time.perf_counter() - wall,
    ], avg


def elastic_reference(sim_tasks, gpus: int) -> tuple[list, float]:
    """An idealised elastic scheduler (Pollux-like, without batch-size tuning), independent of the engine.

    Class-blind; the cluster is one pool of ``gpus`` cards (no node boundaries); a job is admitted at its minimum
    size in arrival order whenever the minimums fit (later jobs may pass one that does not); then every card left
    goes, one at a time, to the running job whose marginal speed-up per card is highest (:func:`speedup`), up to its
    maximum. It reallocates at every arrival and finish, for free (no restart cost, no cycle interval): an
    optimistic bound on what elastic scheduling can reach. A job of fixed size has minimum = maximum = its size.
    """
    wall = time.perf_counter()
    jobs = sorted(sim_tasks, key=lambda s: s.arrival)
    lo = {s.task.id: int(s.task.min_replicas or round(s.gpu) or 1) for s in jobs}
    hi = {s.task.id: int(s.task.max_replicas or lo[s.task.id]) for s in jobs}
    base = {s.task.id: speedup(s.task, lo[s.task.id]) for s in jobs}
    left = {s.task.id: s.duration for s in jobs}  # work, in seconds at the minimum size
    by_id = {s.task.id: s for s in jobs}
    waiting: list = []
    alloc: dict = {}
    first: dict = {}
    finish: dict = {}
    i, now = 0, jobs[0].arrival if jobs else 0.0
    t_end = jobs[-1].arrival if jobs else 0.0
    busy = 0.0

    def rate(jid: str) -> float:
        return speedup(by_id[jid].task, alloc[jid]) / base[jid]

    while i < len(jobs) or waiting or alloc:
        while i < len(jobs) and jobs[i].arrival <= now:
            waiting.append(jobs[i].task.id)
            i += 1
        free = gpus - sum(lo[j] for j in alloc)
        for jid in list(waiting):
            if lo[jid] <= free:
                waiting.remove(jid)
                alloc[jid] = lo[jid]
                first.setdefault(jid, now)
                free -= lo[jid]
        for jid in alloc:
            alloc[jid] = lo[jid]
        heap = [(-_gain(by_id[j].task, alloc[j]), by_id[j].arrival, j) for j in alloc if alloc[j] < hi[j]]
        heapq.heapify(heap)
        while free > 0 and heap:
            _g, _a, jid = heapq.heappop(heap)
            alloc[jid] += 1
            free -= 1
            if alloc[jid] < hi[jid]:
                heapq.heappush(heap, (-_gain(by_id[jid].task, alloc[jid]), by_id[jid].arrival, jid))
        nxt = jobs[i].arrival if i < len(jobs) else math.inf
        done_at = min((now + left[j] / rate(j) for j in alloc), default=math.inf)
        step = min(nxt, done_at)
        if step == math.inf:
            break
        used = sum(alloc.values())
        busy += used * max(0.0, min(step, t_end) - min(now, t_end))
        for jid in list(alloc):
            left[jid] -= (step - now) * rate(jid)
            if left[jid] <= 1e-6:
                finish[jid] = step
                del alloc[jid]
        now = step
    waits = {
        c: [first[s.task.id] - s.arrival for s in jobs if s.task.id in first and s.task.queue_id == c] for c in CLASSES
    }
    jcts = [finish[j] - by_id[j].arrival for j in finish]
    avg = sum(jcts) / len(jcts) if jcts else 0.0
    done: dict = {}
    spent: dict = {}
    for j, end in finish.items():
        s = by_id[j]
        w = max(s.gpu, 0.01)
        done[s.task.project_id] = done.get(s.task.project_id, 0.0) + s.duration * w
        spent[s.task.project_id] = spent.get(s.task.project_id, 0.0) + (end - s.arrival) * w
    horizon = t_end - (jobs[0].arrival if jobs else 0.0)
    return [
        len(jobs),
        len(finish),
        avg,
        percentile(waits[HIGH], 50),
        percentile(waits[HIGH], 99),
        percentile(waits[MEDIUM], 50),
        percentile(waits[MEDIUM], 99),
        percentile(waits[LOW], 50),
        percentile(waits[LOW], 99),
        f"{busy / (gpus * horizon) if horizon > 0 else 0.0:.1%}",
        0,
        0.0,
        jain(done[p] / spent[p] for p in done if spent[p] > 0),
        time.perf_counter() - wall,
    ], avg


def _gain(task, n: int) -> float:
    return speedup(task, n + 1) - speedup(task, n)


# -- the benchmark ----------------------------------------------------------------------------


def run_workload(name: str, nodes, models, tasks, interval: float, restart: float) -> tuple[list[list], list[str]]:
    """Every engine policy and every reference on one workload; returns the rows and the verdicts."""
    rows = []
    best = None
    slow_high = []
    for policy in POLICIES:
        row = engine_row(name, policy, nodes, models, tasks, interval, restart)
        rows.append(row)
        if row[3] == row[2] and (best is None or row[4] < best[1]):
            best = (policy, row[4])
        if row[-2] > HIGH_FIT_CYCLES:
            slow_high.append(f"{policy} {row[-2]:.1f}")
    high = (
        f"{name}: p99 wait of fitting high tasks (column hi fit) <= {HIGH_FIT_CYCLES:g} cycles for every policy: "
        + ("met" if not slow_high else f"NOT met ({', '.join(slow_high)} cycles)")
    )
    cards = [len(n.devices) for n in nodes]
    las = las_lossy = None
    for ref, label, suspend in (
        ("sjf", "ref:sjf", False),
        ("las", "ref:2d-las", True),
        ("las", "ref:2d-las lossy", False),
        ("easy", "ref:easy", False),
    ):
        values, avg = reference(ref, cards, tasks, interval, restart, suspend)
        rows.append([name, label, *values[:-1], "-", "-", values[-1]])
        if label == "ref:2d-las":
            las = avg
        else:
            las_lossy = avg if ref == "las" else las_lossy
    if best is None or not las:
        return rows, [f"{name}: no engine policy finished every job", high]
    ratio = best[1] / las
    verdict = "met" if ratio <= 1.05 else "NOT met"
    return rows, [
        f"{name}: best engine policy {best[0]} avg JCT = {ratio:.2f}x ref:2d-las (target <= 1.05x: {verdict}); "
        f"{best[1] / las_lossy:.2f}x ref:2d-las lossy",
        high,
    ]


def run_generated(name: str, seed: int, n: int, interval: float, restart: float, ckpt: float | None):
    """Every engine policy and every reference on one generated workload (:mod:`benchmarks.generators`).

    Returns the rows and a summary: avg JCT per policy and reference, and per policy the high tasks whose wait
    exceeded the longest remaining guaranteed window of the medium tasks they found running (plus two cycles)."""
    nodes, models, tasks = generators.build(name, n, seed, ckpt)
    label = f"{name}/{seed}"
    rows, avg, late = [], {}, {}
    for policy in POLICIES:
        windows: dict = {}
        row = engine_row(label, policy, nodes, models, tasks, interval, restart, windows)
        rows.append(row)
        avg[policy] = row[4] if row[3] == row[2] else math.inf
        over = [wait - left for wait, left in windows.values() if wait > left + 2 * interval]
        late[policy] = (
            len(over),
            len(windows),
            max(over, default=0.0),
            max((w for w, _l in windows.values()), default=0.0),
        )
    cards = [len(nd.devices) for nd in nodes]
    refs = [("sjf", "ref:sjf", False), ("las", "ref:2d-las", True), ("easy", "ref:easy", False)]
    for ref, ref_label, suspend in refs:
        values, a = reference(ref, cards, tasks, interval, restart, suspend)
        rows.append([label, ref_label, *values[:-1], "-", "-", values[-1]])
        avg[ref_label] = a
    if any(s.task.max_replicas is not None for s in tasks):
        values, a = elastic_reference(tasks, sum(cards))
        rows.append([label, "ref:elastic", *values[:-1], "-", "-", values[-1]])
        avg["ref:elastic"] = a
    return rows, {"avg": avg, "late": late}


def _verdicts(name: str, seed: int, summary: dict) -> list[str]:
    avg, late = summary["avg"], summary["late"]
    best = min(POLICIES, key=lambda p: avg[p])
    las_ref = avg["ref:2d-las"]
    out = []
    r = avg[best] / las_ref
    out.append(
        f"{name}/{seed}: best engine policy {best} {r:.2f}x ref:2d-las (<= 1.05x: {'met' if r <= 1.05 else 'NOT met'})"
        f"; las {avg['las'] / las_ref:.2f}x ref:2d-las (<= 1.1x: {'met' if avg['las'] / las_ref <= 1.1 else 'NOT met'})"
        f"; best vs ref:sjf {avg[best] / avg['ref:sjf']:.2f}x, vs ref:easy {avg[best] / avg['ref:easy']:.2f}x"
    )
    if "ref:elastic" in avg:
        e = avg[best] / avg["ref:elastic"]
        verdict = "met" if e <= 1.2 else "NOT met"
        out.append(f"{name}/{seed}: best engine policy {best} {e:.2f}x ref:elastic (<= 1.2x: {verdict})")
    highs = late[best][1]
    if highs:
        parts = ", ".join(
            f"{p} {late[p][0]}/{late[p][1]} (max over {late[p][2]:,.0f} s, longest wait {late[p][3]:,.0f} s)"
            for p in POLICIES
        )
        out.append(f"{name}/{seed}: high tasks waiting past the longest remaining medium window (+2 cycles): {parts}")
    return out


def main() -> None:
    """Command-line entry point."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="a smaller run (fewer jobs, a sample of the trace)")
    p.add_argument("--jobs", type=int, default=None, help="synthetic jobs (default 1500, quick 400)")
    p.add_argument("--load", type=float, default=0.95, help="synthetic offered load, x the GPUs")
    p.add_argument("--seed", type=int, default=13)
    p.add_argument("--node-stride", type=int, default=16)
    p.add_argument("--compress", type=float, default=200.0)
    p.add_argument("--sample", type=int, default=None, help="every n-th openb pod (default 2, quick 8)")
    p.add_argument("--interval", type=float, default=30.0, help="seconds between scheduling cycles")
    p.add_argument("--checkpoint", type=float, default=1800.0, help="checkpoint interval s (0: none)")
    p.add_argument("--restart", type=float, default=60.0, help="restart overhead s after a preemption")
    p.add_argument("--skip-openb", action="store_true")
    p.add_argument("--skip-classic", action="store_true", help="only the generated workloads")
    p.add_argument(
        "--generators",
        default=",".join(generators.GENERATORS),
        help=f"generated workloads to run, comma-separated (of {', '.join(generators.GENERATORS)}; '' for none)",
    )
    p.add_argument("--seeds", default="1,2,3", help="seeds of the generated workloads, comma-separated")
    p.add_argument("--gen-jobs", type=int, default=None, help="jobs per generated workload (default 300, quick 120)")
    p.add_argument(
        "--one-class", action="store_true", help="every synthetic job medium (as class-blind as the references)"
    )
    a = p.parse_args()
    jobs = a.jobs or (400 if a.quick else 1500)
    sample = a.sample or (8 if a.quick else 2)
    ckpt = a.checkpoint or None
    for name, value in (("--jobs", jobs), ("--sample", sample), ("--node-stride", a.node_stride)):
        if value < 1:
            p.error(f"{name} must be >= 1, got {value}")
    if a.interval < 0 or a.restart < 0 or a.compress <= 0 or a.load <= 0:
        p.error("--interval and --restart must be >= 0, --compress and --load > 0")
    verdicts = []
    rows = []
    gens = [g for g in a.generators.split(",") if g]
    unknown = set(gens) - set(generators.GENERATORS)
    if unknown:
        p.error(f"unknown generators {', '.join(sorted(unknown))}; expected some of {', '.join(generators.GENERATORS)}")
    seeds = [int(x) for x in a.seeds.split(",") if x]
    gen_jobs = a.gen_jobs or (120 if a.quick else 300)
    if not a.skip_classic:
        rows, verdicts = _classic(a, p, jobs, sample, ckpt)
    for g in gens:
        for seed in seeds:
            r, summary = run_generated(g, seed, gen_jobs, a.interval, a.restart, ckpt)
            rows += r
            verdicts += _verdicts(g, seed, summary)
    if gens:
        print(
            f"generated: {', '.join(gens)} (benchmarks/generators.py), seeds {', '.join(map(str, seeds))}, "
            f"{gen_jobs} jobs each on 8 nodes x 8 A100"
        )
    print()
    print_table(HEADERS, rows)
    for v in verdicts:
        print(v)


def _classic(a, p, jobs: int, sample: int, ckpt):
    """The synthetic and openb workloads (rows, verdicts)."""
    verdicts = []
    rows = []
    nodes = synthetic_nodes()
    tasks = synthetic_jobs(jobs, sum(len(n.devices) for n in nodes), a.load, a.seed, ckpt)
    if a.one_class:
        tasks = [replace(s, task=replace(s.task, queue_id=MEDIUM)) for s in tasks]
    print(
        f"synthetic: {len(tasks)} jobs on {len(nodes)} nodes x 8 A100, offered load {a.load:g}, seed {a.seed}; "
        f"checkpoint every {ckpt or 'never'} s, restart {a.restart:g} s, a cycle at most every {a.interval:g} s"
    )
    r, v = run_workload("synthetic", nodes, (A100,), tasks, a.interval, a.restart)
    rows += r
    verdicts += v
    if not a.skip_openb:
        onodes, otasks = openb_jobs(a.node_stride, a.compress, sample, ckpt)
        print(
            f"openb: {len(otasks)} pods (every {sample}th) on {len(onodes)} nodes / "
            f"{sum(len(n.devices) for n in onodes)} GPUs (every {a.node_stride}th GPU node), arrivals compressed "
            f"{a.compress:g}x; LS/Guaranteed->high, Burstable->medium, BE->low; tenants synthetic"
        )
        r, v = run_workload("openb", onodes, TRACE_MODELS, otasks, a.interval, a.restart)
        rows += r
        verdicts += v
    return rows, verdicts


if __name__ == "__main__":
    main()
