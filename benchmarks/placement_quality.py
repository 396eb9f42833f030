"""Placement quality on the openb trace in inflation mode (Weng et al., ATC'23).

Run: ``python -m benchmarks.placement_quality``. Tasks arrive one by one on the nodes of
openb_node_list_gpu_node.csv and never leave; a task that does not fit is dropped. The
arrival order is the paper's artifact's (kubernetes-scheduler-simulator, ``--shuffle-pod``
with workload tuning): the trace's own 8,152 pods of openb_pod_list_default.csv in a random
order (their GPU demand is 98% of the 6,212 GPUs), then pods sampled from the trace with
replacement. At each level of arrived GPU demand (failed tasks included, as a share of the
GPUs) the table shows the GPUs left unallocated (capacity minus the allocated shares),
averaged over seeds; every scorer sees the same arrivals for a seed.

FGD's target workload is the trace's task-type distribution: types by cpu and GPU request
(share or whole cards, accepted models), weighted by pod count, CPU-only pods included.
``fgd`` compares fragmentation growths at the resolution of the paper's Kubernetes score
plugin (ties: lowest node), ``fgd_exact`` compares exact growths. Issue target: at 100%,
FGD leaves >= 40% fewer unallocated GPUs than best-fit.

Scorers: ``first_fit`` (lowest node), ``best_fit`` (the engine's default: tightest whole-card
bucket / tightest shared card), ``best_fit_weighted`` (classic least-remaining cpu + memory +
GPU), ``fgd``, ``fgd_exact``.
"""

from __future__ import annotations

import argparse
import random
import time
from collections import Counter

from apps.queues.engine import WorkloadShape
from apps.queues.engine.engine import Scheduler
from apps.queues.engine.fragmentation import FragmentationModel
from apps.queues.engine.model import HIGH, Cluster, Queue, Snapshot, Task, VdcSettings
from apps.queues.engine.trace import TRACE_DIR, TRACE_MODELS, load_nodes, load_pods, to_task

from .table import print_table

SCORERS = ("first_fit", "best_fit", "best_fit_weighted", "fgd", "fgd_exact")
LEVELS = (0.8, 0.9, 1.0, 1.1)


def arrivals(tasks: list[Task], seed: int):
    """The trace's tasks in a random order, then tasks sampled with replacement (endless)."""
    rnd = random.Random(seed)
    order = list(tasks)
    rnd.shuffle(order)
    yield from order
    while True:
        yield rnd.choice(tasks)


def inflation(nodes, tasks: list[Task], scorer: str, seed: int, workload) -> dict[float, tuple[float, int]]:
    """One inflation run: level -> (unallocated GPUs, dropped tasks) when arrived demand reached it."""
    exact = scorer == "fgd_exact"
    settings = VdcSettings(node_scorer="fgd" if exact else scorer, fgd_workload=workload)
    saved = FragmentationModel.score_levels
    if exact:
        FragmentationModel.score_levels = None
    try:
        return _inflation(nodes, tasks, settings, seed)
    finally:
        FragmentationModel.score_levels = saved


def _inflation(nodes, tasks: list[Task], settings: VdcSettings, seed: int) -> dict[float, tuple[float, int]]:
    clusters = (Cluster(nodes[0].cluster_id),)
    sched = Scheduler(Snapshot(0.0, clusters, tuple(nodes), TRACE_MODELS, (Queue("q", HIGH),), settings=settings))
    capacity = sum(len(n.devices) for n in nodes)
    arrived = allocated = 0.0
    dropped = 0
    marks = sorted(LEVELS)
    out = {}
    for i, base in enumerate(arrivals(tasks, seed)):
        if not marks:
            break
        t = Task(**{**{f: getattr(base, f) for f in Task.__slots__}, "id": i})
        sched.submit(t)
        d = sched.cycle(0.0)
        arrived += float(t.gpu.count) if t.gpu is not None else 0.0
        if d.starts:
            allocated += sum(s.milli for p in d.starts[0].placements for s in p.devices) / 1000
        else:
            sched.finish(t.id)
            dropped += 1
        while marks and arrived >= marks[0] * capacity:
            out[marks.pop(0)] = (capacity - allocated, dropped)
    return out


def run(seeds: int = 3, scorers=SCORERS, node_list: str = "openb_node_list_gpu_node.csv") -> dict:
    """Run the inflation experiment per scorer and seed; print and return unallocated GPUs at 100%."""
    nodes = load_nodes(TRACE_DIR / node_list)
    pods = load_pods()
    queue_of = {"high": "q", "medium": "q", "low": "q"}
    tasks = [to_task(p, p.name, queue_of, 0.0, None) for p in pods]
    counts = Counter((p.cpu, p.gpu, p.models) for p in pods)
    workload = tuple(WorkloadShape(c, cpu, 0.0, g, m) for (cpu, g, m), c in counts.items())
    capacity = sum(len(n.devices) for n in nodes)
    print(
        f"inflation: {node_list}: {len(nodes)} nodes / {capacity} GPUs; the {len(pods)} pods of "
        f"openb_pod_list_default.csv shuffled, then sampled with replacement; {seeds} seeds; "
        f"FGD workload: {len(counts)} task types"
    )
    rows = []
    at_100 = {}
    for scorer in scorers:
        t0 = time.perf_counter()
        runs = [inflation(nodes, tasks, scorer, seed, workload) for seed in range(seeds)]
        means = {lv: sum(r[lv][0] for r in runs) / seeds for lv in LEVELS}
        at_100[scorer] = means[1.0]
        rows.append(
            [scorer]
            + [means[lv] for lv in LEVELS]
            + [
                f"{means[1.0] / capacity:.1%}",
                sum(r[1.0][1] for r in runs) / seeds,
                (time.perf_counter() - t0) / seeds,
            ]
        )
    print_table(
        ["node scorer"]
        + [f"unalloc @{lv:.0%}" for lv in LEVELS]
        + ["unalloc % @100%", "dropped tasks @100%", "s per run"],
        rows,
    )
    for fgd in ("fgd", "fgd_exact"):
        for base in ("best_fit", "best_fit_weighted"):
            if fgd in at_100 and base in at_100 and at_100[base] > 0:
                gain = 1 - at_100[fgd] / at_100[base]
                verdict = "meets" if gain >= 0.40 else "misses"
                print(f"{fgd} vs {base}: {gain:.1%} fewer unallocated GPUs at 100% ({verdict} the 40% target)")
    print()
    return at_100


def main() -> None:
    """Command-line entry point."""
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--seeds", type=int, default=3)
    p.add_argument("--scorers", default=",".join(SCORERS), help="comma-separated subset of " + ", ".join(SCORERS))
    p.add_argument(
        "--node-list",
        default="openb_node_list_gpu_node.csv",
        help="openb_node_list_all_node.csv adds the trace's CPU-only nodes",
    )
    a = p.parse_args()
    run(a.seeds, tuple(a.scorers.split(",")), node_list=a.node_list)


if __name__ == "__main__":
    main()
