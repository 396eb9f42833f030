"""Shared fixtures for the executor tests: plain JobSpecs, no Django."""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable

import pytest

from apps.clusters.executors.base import DeviceSlot, GPUModelSpec, JobSpec, NodePlacement

from .slurm_cluster import SlurmCluster, dev_cluster_for_tests

A100 = GPUModelSpec(
    name="A100-80G",
    vendor="nvidia",
    resource_name="nvidia.com/gpu",
    visible_devices_env="NVIDIA_VISIBLE_DEVICES",
    slurm_gres_type="a100",
)

# Distinct per run: Slurm remembers finished jobs for an hour and submit is idempotent per name.
_task_ids = itertools.count(int(time.time()) % 10_000_000 * 100)


def build_spec(**overrides) -> JobSpec:
    """A JobSpec for task ``task_id`` with owner labels; keyword arguments override any field."""
    task_id = overrides.pop("task_id", next(_task_ids))
    attempt = overrides.pop("attempt", 1)
    labels = {"hcs/task-id": str(task_id), "hcs/project": overrides.get("project", "demo")}
    labels.update(overrides.pop("labels", {}))
    values = {
        "task_id": task_id,
        "attempt": attempt,
        "name": f"hcs-task-{task_id}-{attempt}",
        "project": "demo",
        "owner": "alice",
        "kind": "training",
        "command": "echo hello",
        "labels": labels,
    }
    values.update(overrides)
    return JobSpec(**values)


@pytest.fixture
def make_spec() -> Callable[..., JobSpec]:
    return build_spec


@pytest.fixture
def gpu_placement() -> Callable[..., tuple[NodePlacement, ...]]:
    def placement(node: str, *indices: int) -> tuple[NodePlacement, ...]:
        return (NodePlacement(node=node, devices=tuple(DeviceSlot(index=i) for i in indices)),)

    return placement


@pytest.fixture(scope="session")
def slurm_cluster() -> SlurmCluster:
    """The dev Slurm cluster from scripts/dev_slurm.sh, started once per test session."""
    return dev_cluster_for_tests()
