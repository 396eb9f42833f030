"""Loaders for the Alibaba "openb" GPU-sharing trace (cluster-trace-gpu-v2023).

Mapping used everywhere in this project (printed by the benchmarks):

* qos LS and Guaranteed -> high, Burstable -> medium, BE -> low;
* ``num_gpu == 1`` with ``gpu_milli < 1000`` -> a fraction of one card; else ``num_gpu`` cards;
* ``gpu_spec`` ``A|B`` -> any of those models; empty -> any model;
* tenants are **synthetic**: ``syn-p<crc32(pod name) mod 8>`` (the trace has no tenant column);
* duration = ``deletion_time - scheduled_time``; pods never scheduled (``Pending``) have no
  duration and are left out of time replays;
* the expected duration the engine sees is the real one (an oracle, as in backfill studies).

The trace's undisclosed models G1-G3 and the others get assumed exchange rates (relative
to A100-80G = 1.0); every model is shareable, as in the production cluster the trace is from.
"""

from __future__ import annotations

import csv
import zlib
from dataclasses import dataclass
from pathlib import Path

from .model import HIGH, LOW, MEDIUM, Device, GpuModel, GpuRequest, Node, Task

TRACE_DIR = Path("/work/shared/traces")
QOS_CLASS = {"LS": HIGH, "Guaranteed": HIGH, "Burstable": MEDIUM, "BE": LOW}
TENANTS = 8

# Assumed exchange rates (fp16 throughput relative to A100-80G, rounded); G1-G3 undisclosed.
TRACE_MODELS = (
    GpuModel("T4", "nvidia", 16, 65, 8.1, 0.2, True),
    GpuModel("P100", "nvidia", 16, 19, 9.3, 0.15, True),
    GpuModel("V100M16", "nvidia", 16, 125, 15.7, 0.4, True),
    GpuModel("V100M32", "nvidia", 32, 125, 15.7, 0.45, True),
    GpuModel("A10", "nvidia", 24, 125, 31.2, 0.4, True),
    GpuModel("G1", "undisclosed", 32, 125, 15, 0.4, True),
    GpuModel("G2", "undisclosed", 32, 125, 15, 0.4, True),
    GpuModel("G3", "undisclosed", 32, 125, 15, 0.4, True),
)


@dataclass(frozen=True, slots=True)
class TracePod:
    """One row of the pod list, with times in seconds from the trace start."""

    name: str
    cpu: float
    memory_gib: float
    num_gpu: int
    gpu_milli: int
    models: tuple[str, ...]
    qos: str
    phase: str
    creation: float
    deletion: float
    scheduled: float | None

    @property
    def gpu(self) -> float:
        """GPU demand in cards (a fraction for shared pods)."""
        if self.num_gpu == 1 and self.gpu_milli < 1000:
            return self.gpu_milli / 1000
        return float(self.num_gpu)

    @property
    def duration(self) -> float | None:
        """Run time, or None for pods that were never scheduled."""
        return None if self.scheduled is None else max(0.0, self.deletion - self.scheduled)

    @property
    def tenant(self) -> str:
        """Synthetic tenant derived from the pod name."""
        return f"syn-p{zlib.crc32(self.name.encode()) % TENANTS}"

    @property
    def priority_class(self) -> str:
        """Class by the qos mapping above."""
        return QOS_CLASS.get(self.qos, LOW)


def load_nodes(path: Path | str = TRACE_DIR / "openb_node_list_gpu_node.csv", cluster_id: str = "openb") -> list[Node]:
    """The trace's nodes as engine nodes of one cluster (cpu cores, memory GiB, cards)."""
    nodes = []
    with open(path, newline="") as f:
        for row in csv.DictReader(f):
            sn = row["sn"]
            count = int(row["gpu"])
            model = row["model"]
            devices = tuple(Device(f"{sn}/{i}", i, model) for i in range(count)) if count else ()
            nodes.append(Node(sn, cluster_id, int(row["cpu_milli"]) / 1000, int(row["memory_mib"]) / 1024, devices))
    return nodes


def load_pods(path: Path | str = TRACE_DIR / "openb_pod_list_default.csv") -> list[TracePod]:
    """All pods of a pod list, in file order."""
    pods = []
    with open(path, newline="") as f:
        for row in csv.DictReader(f):
            spec = row["gpu_spec"].strip()
            pods.append(
                TracePod(
                    row["name"],
                    int(row["cpu_milli"]) / 1000,
                    int(row["memory_mib"]) / 1024,
                    int(row["num_gpu"]),
                    int(row["gpu_milli"] or 0),
                    tuple(m for m in spec.split("|") if m) if spec else (),
                    row["qos"],
                    row["pod_phase"],
                    float(row["creation_time"]),
                    float(row["deletion_time"]),
                    float(row["scheduled_time"]) if row["scheduled_time"] else None,
                )
            )
    return pods


def to_task(pod: TracePod, task_id: str, queue_of: dict[str, str], submit: float, duration: float | None) -> Task:
    """An engine task for a pod; ``queue_of`` maps a class to the queue id to use."""
    gpu = pod.gpu
    return Task(
        task_id,
        pod.tenant,
        queue_of[pod.priority_class],
        kind="training",
        owner=pod.tenant,
        cpu=pod.cpu,
        memory_gib=pod.memory_gib,
        gpu=GpuRequest(gpu, pod.models) if gpu > 0 else None,
        expected_duration_s=duration,
        submit_time=submit,
    )
