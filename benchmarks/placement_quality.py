"""Placement quality on the openb trace in inflation mode (Weng et al., ATC'23).

Run: ``python -m benchmarks.placement_quality``. Tasks sampled (with replacement) from
openb_pod_list_default.csv arrive one by one on the nodes of openb_node_list_gpu_node.csv and
never leave; a task that does not fit is dropped. At each level of arrived GPU demand (as a
share of the 6,212 GPUs) the table shows the GPUs left unallocated, averaged over seeds.
FGD's target workload is the trace's own task-shape distribution. Issue target: at 100%,
FGD leaves >= 40% fewer unallocated GPUs than best-fit.

Scorers: ``first_fit`` (lowest node), ``best_fit`` (the engine's default: tightest whole-card
bucket / tightest shared card), ``best_fit_weighted`` (classic least-remaining cpu + memory +
GPU, the paper's "BestFit" baseline), ``fgd``.
"""

from __future__ import annotations

import argparse
import time
from collections import Counter

from apps.queues.engine import WorkloadShape
from apps.queues.engine.sim import inflation
from apps.queues.engine.trace import TRACE_DIR, TRACE_MODELS, load_nodes, load_pods, to_task

from .table import print_table

SCORERS = ("first_fit", "best_fit", "best_fit_weighted", "fgd")
LEVELS = (0.8, 0.9, 1.0, 1.1)


def run(seeds: int = 3, scorers=SCORERS, node_list: str = "openb_node_list_gpu_node.csv") -> dict:
    """Run the inflation experiment per scorer and seed; print and return unallocated GPUs at 100%."""
    nodes = load_nodes(TRACE_DIR / node_list)
    pods = load_pods()
    queue_of = {"high": "q", "medium": "q", "low": "q"}
    shapes = [to_task(p, p.name, queue_of, 0.0, None) for p in pods]
    counts = Counter((p.cpu, p.memory_gib, p.gpu, p.models) for p in pods)
    workload = tuple(WorkloadShape(c, cpu, mem, g, m) for (cpu, mem, g, m), c in counts.items())
    capacity = sum(len(n.devices) for n in nodes)
    print(
        f"inflation: {node_list}: {len(nodes)} nodes / {capacity} GPUs; "
        f"tasks sampled from {len(pods)} pods of openb_pod_list_default.csv; {seeds} seeds"
    )
    rows = []
    at_100 = {}
    for scorer in scorers:
        t0 = time.perf_counter()
        per_level = {lv: [] for lv in LEVELS}
        failed = []
        for seed in range(seeds):
            for point in inflation(nodes, TRACE_MODELS, shapes, scorer, seed, LEVELS, workload):
                per_level[point.arrived_pct / 100].append(point.unallocated_gpus)
                if point.arrived_pct == 100:
                    failed.append(point.failed_tasks)
        means = {lv: sum(v) / len(v) for lv, v in per_level.items()}
        at_100[scorer] = means[1.0]
        rows.append(
            [scorer]
            + [means[lv] for lv in LEVELS]
            + [f"{means[1.0] / capacity:.1%}", sum(failed) / len(failed), (time.perf_counter() - t0) / seeds]
        )
    print_table(
        ["node scorer"]
        + [f"unalloc @{lv:.0%}" for lv in LEVELS]
        + ["unalloc % @100%", "dropped tasks @100%", "s per run"],
        rows,
    )
    if "fgd" in at_100:
        for base in ("best_fit", "best_fit_weighted"):
            if base in at_100 and at_100[base] > 0:
                gain = 1 - at_100["fgd"] / at_100[base]
                verdict = "meets" if gain >= 0.40 else "misses"
                print(f"FGD vs {base}: {gain:.1%} fewer unallocated GPUs at 100% ({verdict} the 40% target)")
        print()
    return at_100


def main() -> None:
    """Command-line entry point."""
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--seeds", type=int, default=3)
    p.add_argument(
        "--node-list",
        default="openb_node_list_gpu_node.csv",
        help="openb_node_list_all_node.csv adds the trace's CPU-only nodes",
    )
    a = p.parse_args()
    run(a.seeds, node_list=a.node_list)


if __name__ == "__main__":
    main()
