"""What each instance (replica, rank) of a task is doing now, for the monitoring page and the API.

The executor of the task's cluster says what the backend knows (``Executor.instances``: state, node, IP,
restarts, CPU and memory use, Service, Ingress, mounted secret names); this module adds what the portal
knows: what each instance asked for, the cards it holds with the node agent's figures for them (Device rows),
and the names of the task's own secret variables. Values of secrets never appear.

The backend is asked off the request's thread and waited for at most ``INSTANCES_TIMEOUT_S``: a backend that
hangs costs the page its instance table, never the page.
"""

from __future__ import annotations

import concurrent.futures
import logging
from dataclasses import asdict, dataclass, field

from apps.clusters.backends import executor_for
from apps.clusters.executors.base import ExecutorError, InstanceState
from apps.clusters.models import Device
from apps.tasks.choices import ACTIVE
from apps.tasks.models import Task

log = logging.getLogger(__name__)

INSTANCES_TIMEOUT_S = 5.0
# A few workers are enough: each call is bounded by the timeout above (and the backends' own), and a
# hung backend holds one worker, not a request.
_POOL = concurrent.futures.ThreadPoolExecutor(max_workers=4, thread_name_prefix="hcs-instances")
# Statuses in which a task has (or is getting) instances on its backend.
_ASKED = ACTIVE


@dataclass
class TaskInstances:
    """A task's instances as shown: ``rows`` (dicts), or ``error`` when the backend did not answer,
    or ``note`` when there is nothing to ask (waiting, ended)."""

    rows: list[dict] = field(default_factory=list)
    error: str = ""
    note: str = ""


def _devices_by_placement(task: Task) -> list[list[dict]]:
    """For each placement entry (one per instance, rank order): its cards with the node agent's figures."""
    placement = task.placement or []
    ids = [d.get("id") for p in placement for d in p.get("devices", ())]
    rows = {d.pk: d for d in Device.objects.filter(pk__in=ids).select_related("node", "gpu_model")}
    out = []
    for entry in placement:
        cards = []
        for slot in entry.get("devices", ()):
            device = rows.get(slot.get("id"))
            if device is None:
                continue
            cards.append(
                {
                    "node": device.node.name,
                    "index": device.index,
                    "model": device.gpu_model.name if device.gpu_model_id else "",
                    "share_percent": round(slot.get("milli", 1000) / 10, 1),
                    "utilization_percent": device.utilization,
                    "vram_used_gib": float(device.vram_used_gib),
                    "vram_gib": float(device.vram_gib),
                    "temperature_c": device.temperature_c,
                }
            )
        out.append(cards)
    return out


def _cards_of(instance: InstanceState, placement: list[dict], cards: list[list[dict]], taken: set[int]) -> list[dict]:
    """The cards of one instance: those of the first unclaimed placement entry on its node, its rank's first;
    by rank alone when no entry names its node (a backend that names its host otherwise, or does not say)."""
    k = instance.index
    on_node = [j for j, entry in enumerate(placement) if entry.get("node_name") == instance.node]
    candidates = sorted(on_node, key=lambda j: j != k) if on_node else [k]
    for j in candidates:
        if 0 <= j < len(placement) and j not in taken:
            taken.add(j)
            return cards[j]
    return []


def instance_rows(task: Task, instances: list[InstanceState]) -> list[dict]:
    """The instances as dicts (for the API's serializer and the page), with what each asked for, its cards and
    the secret names."""
    placement = task.placement or []
    cards = _devices_by_placement(task)
    taken: set[int] = set()
    task_secrets = list(task.secret_env_names)
    rows = []
    for instance in sorted(instances, key=lambda i: i.index):
        row = asdict(instance)
        row["ports"] = [dict(p) for p in instance.ports]
        row["secrets"] = sorted(set(instance.secrets) | set(task_secrets))
        row["cpu_requested_cores"] = float(task.cpu)
        row["memory_requested_gib"] = float(task.memory_gib)
        row["cpu_percent"] = _percent(instance.cpu_used_cores, task.cpu)
        row["memory_percent"] = _percent(instance.memory_used_gib, task.memory_gib)
        row["devices"] = _cards_of(instance, placement, cards, taken)
        rows.append(row)
    return rows


def _percent(used, requested) -> float | None:
    if used is None or not requested:
        return None
    return round(100 * float(used) / float(requested), 1)


def task_instances(task: Task, timeout: float | None = None) -> TaskInstances:
    """Ask the task's backend for its instances (at most ``timeout`` seconds, ``INSTANCES_TIMEOUT_S`` by default)
    and add the portal's figures."""
    timeout = INSTANCES_TIMEOUT_S if timeout is None else timeout
    if task.status not in _ASKED:
        if task.is_final:
            return TaskInstances(note="The task has ended: its instances are gone.")
        return TaskInstances(note="No instance yet: the task waits for the scheduler.")
    if not task.external_id or task.cluster is None:
        return TaskInstances(note="No instance yet: the task is being started on its backend.")
    try:
        executor = executor_for(task.cluster)
        future = _POOL.submit(executor.instances, task.external_id)
        instances = future.result(timeout=timeout)
    except concurrent.futures.TimeoutError:
        log.warning("instances of task %s: %s did not answer within %s s", task.pk, task.cluster, timeout)
        return TaskInstances(error=f"{task.cluster.name} did not answer within {timeout:g} s")
    except ExecutorError as exc:
        return TaskInstances(error=str(exc))
    if not instances:
        return TaskInstances(note="No instance placed on the backend yet.")
    return TaskInstances(rows=instance_rows(task, instances))
