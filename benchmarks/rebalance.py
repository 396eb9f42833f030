"""The inter-project rebalancer on a two-project replay (docs/rules.md#rebalancing): what loans buy and what they cost.

Run: ``python -m benchmarks.rebalance`` (``--hours``, ``--seed``). Driven through the real code: the engine
(:class:`apps.queues.engine.Scheduler`, a cycle every ``--cycle`` s) and the rebalancer's rules
(:func:`apps.queues.engine.rebalance.plan`, a tick every ``--tick`` s, new loans every ``--interval`` s, loans
applied to the engine's quotas with :func:`~apps.queues.engine.rebalance.quota_adjustments`, as the Django
snapshot does). Waiting demand and "blocked by the limit" come from the engine's own waiting reasons.

Workload (seeded): 2 nodes x 8 A100, one medium FIFO queue (reclaim after 5 min of run, as the default queue).
Project *lender* and project *starved* are each guaranteed 8 GPUs and limited to 8 (a hard split: without loans
neither may use the other's idle half). *starved* submits 1-, 2- and 4-GPU jobs all day at an offered load of
``--load`` x its 8 GPUs (Poisson arrivals, lognormal durations, median 20 min); *lender* is idle except in two
busy phases (hours 3-5 and 8-10 of a 12-hour day) where it submits work of its own at ~7 GPUs of load.

The starved project's work is all medium, all low, or mixed (every other job low, the rest medium).
Modes: **no loans** (the split as configured), **loans** (the rebalancer, threshold 20 %, loans up to 4 h,
min lifetime 10 min, cool-down 15 min; any class may run on a loan), **loans, low only** (the same with
``loans_low_class_only``: only low-class work runs on borrowed capacity and asks for loans), and **free
borrowing** for reference (limits raised to 16, guarantees 8: the existing borrow-and-reclaim with no admin
limit at all). Reported: waits of the starved project (arrival to first start; in all and per class), the
lender's reclaim delay (arrival to start of its jobs that fit its guarantee), GPU utilisation, the starved
project's preemptions and the loans opened and returned.
"""

from __future__ import annotations

import argparse
import heapq
import random
from collections import Counter
from dataclasses import dataclass, field, replace

from apps.queues.engine import GpuModel, GpuRequest, Queue, Task
from apps.queues.engine.engine import Scheduler
from apps.queues.engine.model import (
    LOW,
    MEDIUM,
    Cluster,
    Device,
    Node,
    ProjectQuota,
    Reason,
    Resources,
    Snapshot,
    VdcSettings,
)
from apps.queues.engine.rebalance import (
    Loan,
    PastLoan,
    Policy,
    ProjectState,
    apply_adjustment,
    plan,
    quota_adjustments,
)
from apps.queues.engine.sim import percentile

from .table import print_table

A100 = GpuModel("A100-80G", "nvidia", 80, 312, 19.5, 1.0, False)
LENDER, STARVED = "lender", "starved"
GUARANTEE = 8.0
QUEUES = (Queue("medium", MEDIUM, min_run_before_reclaim_s=300.0), Queue("low", LOW, min_run_before_reclaim_s=300.0))
POLICY = Policy(threshold=0.20, max_duration_s=4 * 3600, min_lifetime_s=600, cooldown_s=900)
MIXED = "mixed"
MODES = ("no loans", "loans", "loans, low only", "free borrowing")


@dataclass(frozen=True)
class Job:
    id: str
    project: str
    arrival: float
    duration: float
    gpus: int


@dataclass
class Outcome:
    mode: str
    starved_waits: list = field(default_factory=list)
    waits_by_class: dict = field(default_factory=dict)
    starved_done: int = 0
    lender_delays: list = field(default_factory=list)
    gpu_hours: Counter = field(default_factory=Counter)
    preempted: Counter = field(default_factory=Counter)
    loans_opened: int = 0
    returns: Counter = field(default_factory=Counter)
    horizon: float = 0.0


def workload(hours: float, load: float, seed: int) -> list[Job]:
    """The starved project's all-day stream and the lender's two busy phases."""
    rng = random.Random(seed)
    sizes, weights = (1, 2, 4), (0.5, 0.3, 0.2)
    mean_gpus = sum(s * w for s, w in zip(sizes, weights, strict=True))
    median = 20 * 60.0
    mean_duration = median * 2.718281828 ** (0.8**2 / 2)

    def stream(project: str, start: float, end: float, gpus_of_load: float) -> list[Job]:
        rate = gpus_of_load / (mean_gpus * mean_duration)
        jobs, t = [], start
        while True:
            t += rng.expovariate(rate)
            if t >= end:
                return jobs
            duration = min(6 * 3600.0, max(60.0, rng.lognormvariate(0, 0.8) * median))
            size = rng.choices(sizes, weights)[0]
            jobs.append(Job(f"{project}-{len(jobs)}", project, t, duration, size))

    horizon = hours * 3600
    jobs = stream(STARVED, 0.0, horizon, load * GUARANTEE)
    for start_h, end_h in ((0.25, 5 / 12), (8 / 12, 10 / 12)):
        jobs += [replace(j, id=f"{j.id}@{start_h}") for j in stream(LENDER, start_h * horizon, end_h * horizon, 7)]
    return sorted(jobs, key=lambda j: (j.arrival, j.id))


def class_of(job: Job, starved_class: str) -> str:
    """The job's queue: the lender's work is medium; the starved project's is its class, or every other job low
    when mixed."""
    if job.project != STARVED:
        return MEDIUM
    if starved_class == MIXED:
        return LOW if int(job.id.rsplit("-", 1)[1]) % 2 else MEDIUM
    return starved_class


def run(
    mode: str,
    jobs: list[Job],
    horizon: float,
    cycle_s: float,
    tick_s: float,
    interval_s: float,
    starved_class: str = MEDIUM,
) -> Outcome:
    nodes = tuple(
        Node(f"n{i}", "c", 64, 512, tuple(Device(f"n{i}-{k}", k, A100.name) for k in range(8))) for i in range(2)
    )
    limit = 16.0 if mode == "free borrowing" else GUARANTEE
    own = {p: ProjectQuota(p, Resources(64, 512, GUARANTEE), Resources(128, 1024, limit)) for p in (LENDER, STARVED)}
    low_only = mode == "loans, low only"
    settings = VdcSettings(loans_low_class_only=low_only)
    sched = Scheduler(Snapshot(0.0, (Cluster("c"),), nodes, (A100,), QUEUES, tuple(own.values()), settings=settings))
    out = Outcome(mode, horizon=horizon)
    by_id = {j.id: j for j in jobs}
    arrivals = list(jobs)
    finishes: list = []  # (time, job id, run version)
    version: Counter = Counter()
    remaining = {j.id: j.duration for j in jobs}
    started: dict[str, float] = {}
    first_start: dict[str, float] = {}
    held: Counter = Counter()  # GPUs per project now
    entitled: dict[str, bool] = {}  # a lender job that fitted its guarantee when it arrived
    waiting_reason: dict[str, str] = {}
    loans: list[Loan] = []
    past: list[PastLoan] = []
    last_open = -interval_s
    next_tick = 0.0
    loan_seq = 0
    t = 0.0
    while t <= horizon or started:
        while finishes and finishes[0][0] <= t:
            _when, jid, ver = heapq.heappop(finishes)
            if version[jid] == ver and jid in started:
                sched.finish(jid)
                out.gpu_hours[by_id[jid].project] += by_id[jid].gpus * _within(started.pop(jid), t, horizon) / 3600
                held[by_id[jid].project] -= by_id[jid].gpus
                if by_id[jid].project == STARVED:
                    out.starved_done += 1
        while arrivals and arrivals[0].arrival <= t:
            j = arrivals.pop(0)
            queued_own = sum(by_id[q].gpus for q in sched.queued if by_id[q].project == j.project)
            entitled[j.id] = held[j.project] + queued_own + j.gpus <= GUARANTEE
            queue = class_of(j, starved_class)
            # A medium job's expected duration is its true one: its guaranteed window is the whole run.
            sched.submit(
                Task(
                    j.id,
                    j.project,
                    queue,
                    cpu=1,
                    memory_gib=4,
                    gpu=GpuRequest(count=j.gpus),
                    submit_time=j.arrival,
                    expected_duration_s=j.duration,
                )
            )
        if mode.startswith("loans") and t >= next_tick:
            next_tick = t + tick_s
            states = []
            for p in (LENDER, STARVED):
                mine = [q for q in sched.queued if by_id[q].project == p]
                # As apps.control.rebalance: with low only, only low-class work asks for (and keeps) a loan.
                usable = [q for q in mine if not low_only or class_of(by_id[q], starved_class) == LOW]
                blocked = [q for q in usable if waiting_reason.get(q) == Reason.QUOTA_EXCEEDED]
                states.append(
                    ProjectState(
                        p,
                        Resources(gpu=GUARANTEE),
                        Resources(gpu=GUARANTEE),
                        Resources(gpu=held[p]),
                        Resources(gpu=sum(by_id[q].gpus for q in mine)),
                        Resources(gpu=sum(by_id[q].gpus for q in blocked)),
                        name=p,
                        loanable=Resources(gpu=sum(by_id[q].gpus for q in usable)),
                    )
                )
            due = t - last_open >= interval_s
            decided = plan(states, loans, past, t, POLICY, open_new=due)
            if due:
                last_open = t
            gone = {r.loan_id: r.reason for r in decided.returned}
            past += [PastLoan(x.lender_id, x.borrower_id, t) for x in loans if x.id in gone]
            out.returns.update(gone.values())
            loans = [x for x in loans if x.id not in gone]
            for new in decided.opened:
                loan_seq += 1
                loans.append(Loan(loan_seq, new.lender_id, new.borrower_id, new.amount, t, new.expires_at))
            out.loans_opened += len(decided.opened)
            adjust = quota_adjustments(loans)
            for p, q in own.items():
                g, lim = adjust.get(p, (Resources(), Resources()))
                sched.quotas[p] = replace(
                    q, guaranteed=apply_adjustment(q.guaranteed, g), limit=apply_adjustment(q.limit, lim)
                )
            sched.set_loans(loans)
        d = sched.cycle(t)
        for p in d.preemptions:
            j = by_id[p.task_id]
            version[j.id] += 1
            out.gpu_hours[j.project] += j.gpus * _within(started.pop(j.id), t, horizon) / 3600
            held[j.project] -= j.gpus
            out.preempted[j.project] += 1  # no checkpoints: the run's work is lost, the job starts over
        for s in d.starts:
            j = by_id[s.task_id]
            started[j.id] = t
            first_start.setdefault(j.id, t)
            held[j.project] += j.gpus
            heapq.heappush(finishes, (t + remaining[j.id], j.id, version[j.id]))
        waiting_reason = {w.task_id: w.reason for w in d.waiting}
        t += cycle_s
        if t > horizon * 3:
            break
    for j in jobs:
        if j.id not in first_start:
            continue
        wait = first_start[j.id] - j.arrival
        if j.project == STARVED:
            out.starved_waits.append(wait)
            out.waits_by_class.setdefault(class_of(j, starved_class), []).append(wait)
        elif entitled[j.id]:
            out.lender_delays.append(wait)
    return out


def _within(start: float, end: float, horizon: float) -> float:
    """Seconds of [start, end) inside the day (utilisation is measured over the day, not the tail after it)."""
    return max(0.0, min(end, horizon) - min(start, horizon))


def main(argv: list[str] | None = None) -> list[list]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--hours", type=float, default=12.0)
    parser.add_argument("--load", type=float, default=1.6, help="the starved project's offered load / its 8 GPUs")
    parser.add_argument("--seed", type=int, default=3)
    parser.add_argument("--cycle", type=float, default=5.0, help="scheduling cycle, s")
    parser.add_argument("--tick", type=float, default=10.0, help="rebalancer tick (returns), s")
    parser.add_argument("--interval", type=float, default=60.0, help="rebalancer interval (new loans), s")
    parser.add_argument("--classes", default=f"{MEDIUM},{LOW},{MIXED}", help="the starved project's classes to run")
    args = parser.parse_args(argv)
    classes = [c.strip() for c in args.classes.split(",") if c.strip()]
    bad = [c for c in classes if c not in (MEDIUM, LOW, MIXED)]
    if bad or not classes:
        parser.error(f"--classes: expected some of {MEDIUM}, {LOW}, {MIXED}; got {args.classes!r}")
    jobs = workload(args.hours, args.load, args.seed)
    horizon = args.hours * 3600
    headers = [
        "starved class",
        "mode",
        "starved jobs",
        "started",
        "wait p50 min",
        "wait p95 min",
        "mean wait min",
        "medium mean",
        "low mean",
        "lender delay p50 s",
        "p95 s",
        "max s",
        "GPU util %",
        "preempted",
        "loans",
        "returned",
    ]
    rows = []
    for starved_class, mode in [(c, m) for c in classes for m in MODES]:
        o = run(mode, jobs, horizon, args.cycle, args.tick, args.interval, starved_class)
        starved = [j for j in jobs if j.project == STARVED]
        util = 100 * sum(o.gpu_hours.values()) / (16 * horizon / 3600)
        returned = ", ".join(f"{k} {v}" for k, v in sorted(o.returns.items())) or "-"
        by_class = [_mean_min(o.waits_by_class.get(c)) for c in (MEDIUM, LOW)]
        rows.append(
            [
                starved_class,
                mode,
                len(starved),
                len(o.starved_waits),
                percentile(o.starved_waits, 50) / 60,
                percentile(o.starved_waits, 95) / 60,
                _mean_min(o.starved_waits),
                *by_class,
                percentile(o.lender_delays, 50),
                percentile(o.lender_delays, 95),
                max(o.lender_delays, default=0.0),
                util,
                o.preempted[STARVED],
                o.loans_opened,
                returned,
            ]
        )
    lender_jobs = sum(1 for j in jobs if j.project == LENDER)
    print(
        f"two-project replay: {args.hours:g} h, 16 x A100, starved load {args.load:g} x 8 GPUs, "
        f"{lender_jobs} lender jobs in two busy phases; cycle {args.cycle:g} s, rebalancer tick {args.tick:g} s, "
        f"interval {args.interval:g} s, seed {args.seed}"
    )
    print_table(headers, rows)
    return rows


def _mean_min(waits: list | None):
    """Mean wait in minutes, "-" when there is none."""
    return sum(waits) / len(waits) / 60 if waits else "-"


if __name__ == "__main__":
    main()
