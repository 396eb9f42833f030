"""Workload generators modelled on published GPU-cluster trace statistics (for :mod:`benchmarks.policy_quality`).

Each generator returns ``(nodes, models, tasks)`` for one seed: simulator tasks (:class:`SimTask`) with classes
high / medium / low (queue ids ``high``, ``medium``, ``low``), projects ``p0``..``p3`` and, for medium work, the
true duration as the expected duration (the estimate the engine is told). The parameters are chosen to follow the
*shapes* the publications report, not fitted to their data; sizes stay within one 8-card node, because the
reference policies of the benchmark place a job on one node.

* ``philly``: Microsoft Philly (Jeon et al., "Analysis of Large-Scale Multi-Tenant GPU Clusters for DNN Training
  Workloads", USENIX ATC 2019): most jobs use one GPU, a few use 8 and take a large share of GPU time; run times
  are heavy-tailed from minutes to days (lognormal, median 15 min, sigma 2.0, up to 5 days); Poisson arrivals.

Every generator sets its arrival rate from its own jobs' total GPU-seconds (each run time counted up to 4 h), so
each seed offers the stated load (0.9 x the GPUs; stream 1.0; pollux 0.6 at the minimum sizes): with a heavy
tail, a rate from the expected mean would leave one seed idle and overload the next.
* ``helios``: SenseTime Helios (Hu et al., "Characterization and Prediction of Deep Learning Workloads in
  Large-Scale GPU Datacenters", SC 2021): a strong diurnal submission cycle (compressed here to an 8-hour "day",
  rate from 0.25x to 1.75x of the mean), many very short jobs (a third under 2 minutes: debugging and failed
  runs), larger jobs rarer but long; bursts of submissions (sweeps of up to 20 jobs 5 s apart).
* ``pai``: Alibaba PAI (Weng et al., "MLaaS in the Wild: Workload Analysis and Scheduling in Large-Scale
  Heterogeneous GPU Clusters", NSDI 2022): many tasks ask for a share of one card (a quarter or a half), most
  run briefly but the tail is long (lognormal, median 8 min, sigma 2.2); gangs of whole cards are a minority.
* ``stream``: the pattern of a production trace's week: a steady stream of one- and two-card medium work
  (median 40 min, each guaranteed its expected duration; a tenth of it low) keeps the cluster busy, and
  whole-node high tasks (8 cards, 6 % of the jobs) arrive among it and find the cards held by medium work
  inside its window.
* ``pollux``: elastic training jobs as in Pollux (Qiao et al., "Pollux: Co-adaptive Cluster Scheduling for
  Goodput-Optimized Deep Learning", OSDI 2021): each job runs between 1 (or 2) and 8 one-card replicas, with
  a speed-up curve of its own (Amdahl parallel fraction 0.5, 0.8, 0.9, 0.95 or 0.99: models that scale poorly to
  almost linearly); its duration is its run time at its minimum; all medium class; Poisson arrivals at a load of
  0.6 at the minimum sizes (growth fills the rest).
"""

from __future__ import annotations

import math
import random

from apps.queues.engine import GpuModel, GpuRequest, Task
from apps.queues.engine.model import HIGH, LOW, MEDIUM, Device, Node
from apps.queues.engine.sim import SimTask

A100S = GpuModel("A100-80G", "nvidia", 80, 312, 19.5, 1.0, True)  # shareable (PAI's fractional requests)
CLASSES = (HIGH, MEDIUM, LOW)
PROJECTS, PROJECT_W = ("p0", "p1", "p2", "p3"), (0.4, 0.3, 0.2, 0.1)
GENERATORS = ("philly", "helios", "pai", "stream", "pollux")


def nodes(count: int = 8, cards: int = 8) -> list[Node]:
    """``count`` nodes of ``cards`` shareable A100 each (128 cores, 1 TiB)."""
    return [
        Node(f"n{i}", "g", 128.0, 1024.0, tuple(Device(f"n{i}/{k}", k, A100S.name) for k in range(cards)))
        for i in range(count)
    ]


def _task(jid: str, project: str, cls: str, size: float, duration: float, arrival: float, **kw) -> Task:
    return Task(
        jid,
        project,
        cls,
        cpu=4.0,
        memory_gib=16.0,
        gpu=GpuRequest(size),
        expected_duration_s=duration,
        submit_time=arrival,
        **kw,
    )


def _lognormal(rnd: random.Random, median: float, sigma: float, lo: float, hi: float) -> float:
    return min(max(rnd.lognormvariate(math.log(median), sigma), lo), hi)


def _rate(n: int, total_gpu_s: float, load: float, gpus: int = 64) -> float:
    """Arrivals per second that offer ``load`` x the GPUs for these jobs (their own total, not an expected one:
    a heavy tail makes a sample's total far from the mean)."""
    return n * load * gpus / total_gpu_s


def _poisson(rnd: random.Random, n: int, rate: float) -> list[float]:
    t, out = 0.0, []
    for _ in range(n):
        t += rnd.expovariate(rate)
        out.append(t)
    return out


def _sim(jobs: list, times: list[float], checkpoint: float | None) -> list[SimTask]:
    """Simulator tasks from (project, class, size, duration, extra task fields) and arrival times."""
    out = []
    for i, ((project, cls, size, dur, kw), t) in enumerate(zip(jobs, times, strict=True)):
        gpu = float(kw.get("min_replicas") or size)
        out.append(SimTask(_task(f"j{i}", project, cls, size, dur, t, **kw), t, dur, gpu, checkpoint))
    return out


# When the arrival rate is set, a run time counts up to this much: one multi-day job would otherwise stretch the
# arrivals so far apart that the rest of the run sees an idle cluster.
RATE_CAP_S = 4 * 3600.0


def _gpu_s(jobs: list) -> float:
    return sum((kw.get("min_replicas") or size) * min(dur, RATE_CAP_S) for _p, _c, size, dur, kw in jobs)


def philly(n: int, seed: int, load: float = 0.9, checkpoint: float | None = None) -> list[SimTask]:
    rnd = random.Random(seed)
    jobs = []
    for _ in range(n):
        size = rnd.choices((1, 2, 4, 8), (0.70, 0.12, 0.10, 0.08))[0]
        dur = _lognormal(rnd, 900.0, 2.0, 30.0, 5 * 86400.0)
        jobs.append((rnd.choices(PROJECTS, PROJECT_W)[0], rnd.choices(CLASSES, (0.1, 0.6, 0.3))[0], size, dur, {}))
    return _sim(jobs, _poisson(rnd, n, _rate(n, _gpu_s(jobs), load)), checkpoint)


def helios(n: int, seed: int, load: float = 0.9, checkpoint: float | None = None, day_s: float = 8 * 3600.0):
    rnd = random.Random(seed)
    jobs, sweeps = [], []
    while len(jobs) < n:
        batch = min(1 if rnd.random() < 0.9 else rnd.randint(2, 20), n - len(jobs))
        project = rnd.choices(PROJECTS, PROJECT_W)[0]
        size = rnd.choices((1, 2, 4, 8), (0.55, 0.15, 0.15, 0.15))[0]
        sweeps.append(batch)
        for _ in range(batch):
            if rnd.random() < 0.33:
                dur = rnd.uniform(20.0, 120.0)  # debugging runs and early failures
            else:
                dur = _lognormal(rnd, 1800.0 * (1 + size / 8), 1.5, 120.0, 3 * 86400.0)
            jobs.append((project, rnd.choices(CLASSES, (0.1, 0.6, 0.3))[0], size, dur, {}))
    rate = _rate(len(sweeps), _gpu_s(jobs), load)
    times, t = [], 0.0
    for batch in sweeps:
        # Diurnal: thinning of a Poisson process at the peak rate (the mean rate over a day is ``rate``).
        while True:
            t += rnd.expovariate(rate * 1.75)
            if rnd.random() <= (1 + 0.75 * math.sin(2 * math.pi * t / day_s)) / 1.75:
                break
        times.extend(t + 5.0 * b for b in range(batch))
    return sorted(_sim(jobs, times, checkpoint), key=lambda s: s.arrival)


def pai(n: int, seed: int, load: float = 0.9, checkpoint: float | None = None) -> list[SimTask]:
    rnd = random.Random(seed)
    jobs = []
    for _ in range(n):
        size = rnd.choices((0.25, 0.5, 1, 2, 4, 8), (0.25, 0.25, 0.25, 0.1, 0.1, 0.05))[0]
        dur = _lognormal(rnd, 480.0, 2.2, 10.0, 3 * 86400.0)
        jobs.append((rnd.choices(PROJECTS, PROJECT_W)[0], rnd.choices(CLASSES, (0.15, 0.55, 0.3))[0], size, dur, {}))
    return _sim(jobs, _poisson(rnd, n, _rate(n, _gpu_s(jobs), load)), checkpoint)


def stream(n: int, seed: int, load: float = 1.0, checkpoint: float | None = None) -> list[SimTask]:
    rnd = random.Random(seed)
    jobs = []
    for _ in range(n):
        if rnd.random() < 0.06:
            jobs.append(("p0", HIGH, 8, _lognormal(rnd, 1800.0, 0.8, 120.0, 6 * 3600.0), {}))
        else:
            cls = MEDIUM if rnd.random() < 0.9 else LOW
            project = rnd.choices(PROJECTS[1:], (0.5, 0.3, 0.2))[0]
            jobs.append((project, cls, rnd.choice((1, 2)), _lognormal(rnd, 2400.0, 1.0, 60.0, 86400.0), {}))
    return _sim(jobs, _poisson(rnd, n, _rate(n, _gpu_s(jobs), load)), checkpoint)


SCALINGS = (0.5, 0.8, 0.9, 0.95, 0.99)


def pollux(n: int, seed: int, load: float = 0.6, checkpoint: float | None = None) -> list[SimTask]:
    rnd = random.Random(seed)
    jobs = []
    for _ in range(n):
        lo = 2 if rnd.random() < 0.25 else 1
        dur = _lognormal(rnd, 3600.0, 1.3, 120.0, 2 * 86400.0)
        kw = {"min_replicas": lo, "max_replicas": 8, "scaling": rnd.choice(SCALINGS)}
        jobs.append((rnd.choices(PROJECTS, PROJECT_W)[0], MEDIUM, 1, dur, kw))
    return _sim(jobs, _poisson(rnd, n, _rate(n, _gpu_s(jobs), load)), checkpoint)


def build(name: str, n: int, seed: int, checkpoint: float | None = None):
    """``(nodes, models, tasks)`` of generator ``name`` (one of :data:`GENERATORS`)."""
    make = {"philly": philly, "helios": helios, "pai": pai, "stream": stream, "pollux": pollux}[name]
    return nodes(), (A100S,), make(n, seed, checkpoint=checkpoint)
