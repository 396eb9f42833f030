"""JobSpecs and GPU models for the Kubernetes executor tests (plain data, no Django)."""

from __future__ import annotations

import itertools

from apps.clusters.executors.base import DeviceSlot, GPUModelSpec, JobSpec, NodePlacement

A100 = GPUModelSpec("A100-80G", "nvidia", "nvidia.com/gpu", "NVIDIA_VISIBLE_DEVICES")
ASCEND_910B = GPUModelSpec("Ascend910B", "huawei", "huawei.com/Ascend910", "ASCEND_VISIBLE_DEVICES")
HYGON_K100 = GPUModelSpec("K100", "hygon", "hygon.com/dcu", "HIP_VISIBLE_DEVICES")
MLU370 = GPUModelSpec("MLU370", "cambricon", "cambricon.com/mlu", "MLU_VISIBLE_DEVICES")

_task_ids = itertools.count(7000)


def spec(**overrides) -> JobSpec:
    """A training JobSpec with the owner labels the Django layer adds; keywords override fields."""
    task_id = overrides.pop("task_id", next(_task_ids))
    attempt = overrides.pop("attempt", 1)
    values = {
        "task_id": task_id,
        "attempt": attempt,
        "name": f"hcs-task-{task_id}-{attempt}",
        "project": "vision",
        "owner": "alice",
        "kind": "training",
        "image": "busybox:1.36",
        "command": "echo hello",
        "labels": {"hcs/task-id": str(task_id), "hcs/project": "vision"},
    }
    values.update(overrides)
    return JobSpec(**values)


def on_node(node: str, *indices: int, instances: int = 1, **slot) -> tuple[NodePlacement, ...]:
    """The same device choice on one node for each of ``instances`` ranks."""
    devices = tuple(DeviceSlot(index=i, **slot) for i in indices)
    return tuple(NodePlacement(node=node, devices=devices) for _ in range(instances))


def volcano_queue(name: str = "hcs-main-research", **overrides) -> dict:
    """A portal queue's Volcano Queue as ``KubernetesExecutor.ensure_volcano_queue`` takes it."""
    labels = {"app.kubernetes.io/managed-by": "hcs-portal", "hcs.io/installation": "inst-1", "hcs.io/queue-id": "3"}
    values = {
        "name": name,
        "labels": labels,
        "annotations": {},
        "weight": 100,
        "reclaimable": True,
        "capability": {"nvidia.com/gpu": "8"},
        "guarantee": {"nvidia.com/gpu": "2"},
    }
    return {**values, **overrides}
