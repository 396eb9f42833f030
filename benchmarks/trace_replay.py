"""Time replay of the openb trace through the engine: fifo vs drf vs backfill.

Run: ``python -m benchmarks.trace_replay``. Class mapping: qos LS/Guaranteed -> high,
Burstable -> medium, BE -> low; tenants are synthetic (crc32 of the pod name mod 8).
The trace is light for its 6,212 GPUs, so to see queueing the replay uses every
``--node-stride``-th GPU node and compresses arrival times by ``--compress`` (durations are
kept); pods never scheduled in the trace are left out. The same three queues (one per
class) run with each policy in turn; everything else is equal.
"""

from __future__ import annotations

import argparse

from apps.queues.engine import Queue
from apps.queues.engine.model import HIGH, LOW, MEDIUM
from apps.queues.engine.sim import SimTask, replay
from apps.queues.engine.trace import TRACE_MODELS, load_nodes, load_pods, to_task

from .table import print_table


def build(node_stride: int, compress: float, sample: int):
    """Nodes and tasks of the replay (deterministic)."""
    nodes = load_nodes()[::node_stride]
    pods = [p for p in load_pods() if p.duration is not None][::sample]
    t0 = min(p.creation for p in pods)
    queue_of = {HIGH: "high", MEDIUM: "medium", LOW: "low"}
    tasks = []
    for p in pods:
        arrival = (p.creation - t0) / compress
        task = to_task(p, p.name, queue_of, arrival, max(p.duration, 1.0))
        tasks.append(SimTask(task, arrival, max(p.duration, 1.0), p.gpu))
    return nodes, tasks


def run(node_stride: int = 16, compress: float = 100.0, sample: int = 1, interval: float = 30.0) -> list[list]:
    """Replay once per policy and print the table."""
    nodes, tasks = build(node_stride, compress, sample)
    gpus = sum(len(n.devices) for n in nodes)
    print(
        f"openb replay: {len(tasks)} tasks on {len(nodes)} nodes / {gpus} GPUs (every {node_stride}th GPU node), "
        f"arrivals compressed {compress:g}x, a cycle at most every {interval:g} s\n"
        "mapping: LS/Guaranteed->high, Burstable->medium, BE->low; tenants synthetic (crc32(name) mod 8)"
    )
    rows = []
    for policy in ("fifo", "drf", "backfill"):
        queues = (
            Queue("high", HIGH, policy, window_floor_s=60),
            Queue("medium", MEDIUM, policy, window_floor_s=60),
            Queue("low", LOW, policy, window_floor_s=60),
        )
        r = replay(policy, nodes, TRACE_MODELS, queues, tasks, cycle_interval=interval)
        rows.append(
            [
                policy,
                r.tasks,
                r.finished,
                r.wait_p50[HIGH],
                r.wait_p99[HIGH],
                r.wait_p50[MEDIUM],
                r.wait_p99[MEDIUM],
                r.wait_p50[LOW],
                r.wait_p99[LOW],
                r.avg_jct,
                r.avg_slowdown,
                f"{r.gpu_allocation:.1%}",
                r.preemptions,
                r.jain,
                r.cycles,
                r.wall_s,
            ]
        )
    print_table(
        [
            "policy",
            "tasks",
            "done",
            "wait p50 high s",
            "p99 high",
            "p50 med",
            "p99 med",
            "p50 low",
            "p99 low",
            "avg JCT s",
            "slowdown",
            "GPU alloc",
            "preempt",
            "Jain",
            "cycles",
            "wall s",
        ],
        rows,
    )
    return rows


def main() -> None:
    """Command-line entry point."""
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--node-stride", type=int, default=16)
    p.add_argument("--compress", type=float, default=100.0)
    p.add_argument("--sample", type=int, default=1)
    p.add_argument("--interval", type=float, default=30.0)
    a = p.parse_args()
    run(a.node_stride, a.compress, a.sample, a.interval)


if __name__ == "__main__":
    main()
