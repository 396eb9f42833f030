"""What must hold between the backends and the database, whatever failed: checked after every fault test,
and by operators with ``manage.py check_backends``.

1. Every job of this installation running on a backend belongs to exactly one live attempt, or is being
   cancelled (its object records the request).
2. No task has two jobs running at once.
3. No card is held beyond its capacity: neither in the database (live placements) nor on the backends
   (running jobs' shares); shares of one card that fit together are fine.
4. No submission is lost: every unfinished task is waiting for the scheduler, or active with a launch
   intent (pending) or a job (active) on its cluster.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import dataclass

from apps.clusters.backends import executor_for
from apps.clusters.executors.base import ExecutorError, JobPhase
from apps.clusters.models import Cluster
from apps.control.models import BackendObject, ObjectState
from apps.control.reconcile import installation_label
from apps.tasks.choices import ACTIVE, FINAL, WAITING
from apps.tasks.ledger import WHOLE
from apps.tasks.models import Task

_RUNNING = (JobPhase.PENDING, JobPhase.RUNNING, JobPhase.UNKNOWN)


@dataclass(frozen=True)
class Violation:
    """One broken invariant, said so that an operator knows where to look."""

    rule: str
    detail: str

    def __str__(self) -> str:
        return f"{self.rule}: {self.detail}"


def check(clusters=None) -> list[Violation]:
    """Every violation found now; an empty list when backends and database agree."""
    clusters = list(clusters if clusters is not None else Cluster.objects.filter(enabled=True))
    problems: list[Violation] = []
    running_devices: Counter = Counter()
    running_per_task: Counter = Counter()
    label = installation_label()
    for cluster in clusters:
        objects = {
            (o.task_uid.hex, str(o.attempt)): o
            for o in BackendObject.objects.filter(cluster=cluster).select_related("task")
        }
        try:
            observed = executor_for(cluster).list_by_owner(label)
        except ExecutorError as exc:
            problems.append(Violation("unreachable", f"{cluster.name}: {exc}"))
            continue
        for state in observed:
            if state.phase not in _RUNNING:
                continue
            identity = (state.labels.get("hcs.io/task-uid", ""), state.labels.get("hcs.io/attempt", ""))
            obj = objects.get(identity)
            where = f"job {state.name or state.external_id} on {cluster.name}"
            if obj is None:
                problems.append(Violation("untracked job", f"{where} is tracked by no backend object"))
                continue
            if obj.state == ObjectState.ENDED:
                problems.append(Violation("untracked job", f"{where} runs although its object ended ({obj.message})"))
            elif not obj.wanted and obj.cancel_requested_at is None:
                problems.append(Violation("orphan job", f"{where} belongs to no live attempt, not being cancelled"))
            if obj.wanted:
                running_per_task[obj.task_id] += 1
            for share in obj.shares or ():
                running_devices[share["id"]] += share["milli"]
    for task_id, count in running_per_task.items():
        if count > 1:
            problems.append(Violation("duplicate job", f"task #{task_id} has {count} jobs running"))
    for device, milli in running_devices.items():
        if milli > WHOLE:
            problems.append(
                Violation("device held twice", f"device {device} is held {milli / WHOLE:g} times over by running jobs")
            )
    problems += _database_invariants(clusters)
    return problems


def _database_invariants(clusters: list[Cluster]) -> list[Violation]:
    problems = []
    share: dict[int, int] = defaultdict(int)
    holders: dict[int, list[int]] = defaultdict(list)
    active = Task.objects.filter(status__in=ACTIVE, cluster__in=clusters)
    objects = {
        (o.task_id, o.attempt): o
        for o in BackendObject.objects.filter(task__in=active).exclude(state=ObjectState.ENDED)
    }
    for task in active:
        for instance in task.placement or []:
            for device in instance.get("devices", ()):
                share[device["id"]] += device.get("milli", 1000)
                holders[device["id"]].append(task.pk)
        if (task.pk, task.attempt) not in objects:
            problems.append(
                Violation("lost submission", f"task #{task.pk} is {task.status} without a job or launch intent")
            )
    for device, milli in share.items():
        if milli > WHOLE:
            problems.append(Violation("device held twice", f"device {device} is given to tasks {holders[device]}"))
    unknown = Task.objects.exclude(status__in=(*WAITING, *ACTIVE, *FINAL))
    for task in unknown:
        problems.append(Violation("lost submission", f"task #{task.pk} has unknown status {task.status!r}"))
    return problems
