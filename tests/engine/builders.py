"""Small builders so each engine test states only what matters to it."""

from __future__ import annotations

from apps.queues.engine import (
    Cluster,
    Device,
    GpuModel,
    GpuRequest,
    InstancePlacement,
    Link,
    Node,
    Queue,
    RunningTask,
    Snapshot,
    Task,
    VdcSettings,
)
from apps.queues.engine.model import DeviceShare

MODELS = (
    GpuModel("A100-80G", "nvidia", 80, 312, 19.5, 1.0, True),
    GpuModel("V100", "nvidia", 32, 125, 15.7, 0.5, False),
    GpuModel("T4", "nvidia", 16, 65, 8.1, 0.25, True),
)


def node(nid, cluster="c1", model="A100-80G", cards=4, cpu=64.0, mem=256.0, health=100, nvlink=None, status="ready"):
    """A node with ``cards`` cards; ``nvlink`` is a list of device-index groups joined by NVLink."""
    links: dict[int, list[Link]] = {i: [] for i in range(cards)}
    for group in nvlink or ():
        for a in group:
            links[a].extend(Link(b, "nvlink") for b in group if b != a)
    devices = tuple(Device(f"{nid}/{i}", i, model, links=tuple(links[i])) for i in range(cards))
    return Node(nid, cluster, cpu, mem, devices, status=status, health=health)


def queues():
    """One fifo queue per class, named after the class."""
    return (
        Queue("high", "high", window_floor_s=50),
        Queue("medium", "medium", window_floor_s=50),
        Queue("low", "low", window_floor_s=50),
    )


def task(tid, queue="high", gpu=1, models=(), project="p1", cpu=1.0, mem=1.0, **kw):
    """A task asking for ``gpu`` cards (a fraction below 1) of ``models`` (any when empty)."""
    return Task(
        tid,
        project,
        queue,
        cpu=cpu,
        memory_gib=mem,
        gpu=GpuRequest(gpu, tuple(models)) if gpu else None,
        **kw,
    )


def running(t, where, started_at=0.0, cluster="c1", window=None, model="A100-80G"):
    """A running task; ``where`` = [(node id, [device index or (index, milli)])] per instance."""
    placements = []
    for nid, devs in where:
        shares = []
        for dv in devs:
            idx, milli = dv if isinstance(dv, tuple) else (dv, 1000)
            shares.append(DeviceShare(f"{nid}/{idx}", milli))
        placements.append(InstancePlacement(nid, tuple(shares), model if shares else None))
    return RunningTask(t, cluster, tuple(placements), started_at, window)


def snap(nodes, queued=(), running=(), quotas=(), now=100.0, clusters=None, qs=None, **settings):
    """A snapshot over one healthy cluster "c1" unless ``clusters`` is given."""
    return Snapshot(
        now,
        tuple(clusters or (Cluster("c1"),)),
        tuple(nodes),
        MODELS,
        tuple(qs or queues()),
        tuple(quotas),
        tuple(running),
        tuple(queued),
        VdcSettings(**settings),
    )


def started(decisions):
    """Ids of the started tasks."""
    return [s.task_id for s in decisions.starts]


def preempted(decisions):
    """Ids of the preempted tasks."""
    return [p.task_id for p in decisions.preemptions]


def waiting(decisions):
    """Waiting entries by task id."""
    return {w.task_id: w for w in decisions.waiting}
