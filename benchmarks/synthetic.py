"""A deterministic synthetic VDC at the reference scale (docs/rules.md), for the engine speed benchmark."""

from __future__ import annotations

import random

from apps.queues.engine import (
    Cluster,
    Device,
    GpuModel,
    GpuRequest,
    Link,
    Node,
    Queue,
    Snapshot,
    Task,
    VdcSettings,
)

MODELS = (
    GpuModel("A100-80G", "nvidia", 80, 312, 19.5, 1.0, True),
    GpuModel("H100", "nvidia", 80, 990, 67, 2.0, True),
    GpuModel("V100", "nvidia", 32, 125, 15.7, 0.45, False),
    GpuModel("T4", "nvidia", 16, 65, 8.1, 0.2, True),
    GpuModel("Ascend910B", "huawei", 64, 320, 0, 0.9, False),
)
QUEUES_POLICIES = (("high", "fifo"), ("medium", "drf"), ("low", "backfill"))
QUEUES = tuple(Queue(name, name, policy) for name, policy in QUEUES_POLICIES)


def nodes(count: int = 2000, clusters: int = 4, cards: int = 8, seed: int = 1) -> list[Node]:
    """``count`` nodes of ``cards`` cards each, one model per node, NVLink/HCCS pairs of four."""
    rnd = random.Random(seed)
    out = []
    for i in range(count):
        model = rnd.choices([m.name for m in MODELS], weights=[30, 15, 20, 25, 10])[0]
        kind = "hccs" if model == "Ascend910B" else "nvlink"
        devices = []
        for j in range(cards):
            group = range(j - j % 4, j - j % 4 + 4)
            links = tuple(Link(k, kind) for k in group if k != j)
            devices.append(Device(f"n{i}/{j}", j, model, links=links))
        out.append(Node(f"n{i}", f"c{i % clusters}", 128.0, 1024.0, tuple(devices)))
    return out


def task(i: int, rnd: random.Random, submit: float) -> Task:
    """One task of the mixed reference workload: classes, gangs, fractions, model constraints."""
    queue = rnd.choices(["high", "medium", "low"], weights=[2, 4, 4])[0]
    shape = rnd.choices(["cpu", "frac", "1", "2", "4", "8", "gang"], weights=[5, 25, 30, 15, 10, 10, 5])[0]
    models: tuple[str, ...] = ()
    if rnd.random() < 0.5:
        models = (rnd.choice([m.name for m in MODELS]),)
    instances = 1
    if shape == "cpu":
        gpu = None
    elif shape == "frac":
        shareable = [m.name for m in MODELS if m.shareable]
        models = tuple(m for m in models if m in shareable)
        gpu = GpuRequest(rnd.choice([0.25, 0.5]), models)
    elif shape == "gang":
        gpu = GpuRequest(8, models)
        instances = rnd.choice([2, 4])
    else:
        gpu = GpuRequest(int(shape), models)
    return Task(
        f"t{i}",
        f"p{rnd.randrange(16)}",
        queue,
        kind=rnd.choice(["training", "inference", "dev_env"]),
        owner=f"u{rnd.randrange(64)}",
        cpu=float(rnd.choice([1, 2, 4, 8])),
        memory_gib=float(rnd.choice([4, 8, 16, 32])),
        gpu=gpu,
        instances=instances,
        expected_duration_s=float(rnd.randrange(600, 86_400)),
        submit_time=submit,
    )


def tasks(count: int, seed: int = 2, start: int = 0, t0: float = 0.0) -> list[Task]:
    """``count`` tasks with ids from ``start`` submitted one second apart from ``t0``."""
    rnd = random.Random(seed)
    return [task(start + i, rnd, t0 + i) for i in range(count)]


def snapshot(queued, node_list, running=(), now: float = 20_000.0, scorer: str = "best_fit") -> Snapshot:
    """A snapshot of the synthetic VDC."""
    clusters = tuple(Cluster(f"c{i}", priority=i) for i in range(4))
    return Snapshot(
        now,
        clusters,
        tuple(node_list),
        MODELS,
        QUEUES,
        (),
        tuple(running),
        tuple(queued),
        VdcSettings(node_scorer=scorer),
    )
