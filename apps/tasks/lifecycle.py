"""A task's life: the one module that changes a task's status, placement and held capacity, and writes the
timeline entries that say so (docs/rules.md, "A task's life").

Each transition changes the task in memory and returns a :class:`Change` (the fields it changed and the events it
wrote); :func:`save` writes one change, and the scheduling cycle writes thousands at once with bulk statements
(``STATE_FIELDS``). Services, the scheduler, reconciliation, health checks, autoscaling and admin actions all
change tasks through here, so a rule (what leaving a cluster resets, what a placement holds) is written once.
A transition the table :data:`MOVES` does not allow raises :class:`IllegalMove`: a programming error, never a
user's.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from decimal import Decimal

from django.db import transaction
from django.utils import timezone

from apps.queues.choices import PriorityClass
from apps.tasks import ledger
from apps.tasks.choices import FINAL, WAITING, EventKind, FailureReason, TaskStatus
from apps.tasks.models import Task, TaskEvent
from apps.tasks.signals import demand_changed, task_changed

S = TaskStatus
# Which status may follow which. Waiting tasks are placed or stopped; active ones follow their backend, are
# requeued (preempted, suspended, retried, lost) or stopped; a running task whose cluster stops answering is unknown
# until it answers again; a service scaled to zero holds nothing until a request wakes it; a final status is final.
MOVES: dict[str, frozenset[str]] = {
    **{w: frozenset({S.SCHEDULED, S.STOPPED}) for w in WAITING},
    S.SCHEDULED: frozenset({S.STARTING, S.RUNNING, *FINAL, *WAITING}),
    S.STARTING: frozenset({S.RUNNING, *FINAL, *WAITING}),
    # A service that scales to zero releases its cards when idle, and a request wakes it back into its queue.
    S.RUNNING: frozenset({S.UNKNOWN, S.SCALED_TO_ZERO, *FINAL, *WAITING}),
    S.SCALED_TO_ZERO: frozenset({S.QUEUED, S.STOPPED}),
    # Its cluster's API answers again (or accounting tells how the job ended), or the grace period ran out.
    S.UNKNOWN: frozenset({S.STARTING, S.RUNNING, *FINAL, *WAITING}),
    **{f: frozenset() for f in FINAL},
}

# What leaving a cluster resets, and what a placement sets: the ledger and where the task runs.
PLACEMENT_FIELDS = ("cluster", "placement", "allocated_gpu", "held_cpu", "held_memory_gib", "replicas")
# Every field a transition may change; the scheduling cycle's bulk write covers them all.
STATE_FIELDS = (
    "status",
    "status_message",
    "window",
    *PLACEMENT_FIELDS,
    "ready_replicas",
    "external_id",
    "attempt",
    "started_at",
    "finished_at",
    "queue_position",
    "estimated_start",
    "pending_reason",
    "pending_message",
    "updated_at",
    "exit_code",
    "failure_reason",
    "preemption_count",
    "lost_gpu_seconds",
)
WAITING_FIELDS = ("queue_position", "estimated_start", "pending_reason", "pending_message")


class IllegalMove(RuntimeError):
    """A transition from a status that does not allow it (a bug in the caller)."""


@dataclass
class Change:
    """What one transition did to one task: the fields it changed and the timeline entries it wrote."""

    task: Task
    fields: set[str] = field(default_factory=set)
    events: list[TaskEvent] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.fields or self.events)


def event(
    task: Task, kind: str, message: str = "", *, actor=None, previous: str = "", to: str = "", data: dict | None = None
) -> TaskEvent:
    """An unsaved timeline entry of the task (task by id: setting the relation asks the database router)."""
    return TaskEvent(
        task_id=task.pk,
        kind=kind,
        message=message,
        actor=actor if actor is not None and actor.is_authenticated else None,
        from_status=previous,
        to_status=to,
        data=data or {},
    )


def record_event(
    task: Task,
    kind: str,
    message: str = "",
    *,
    actor=None,
    from_status: str = "",
    to_status: str = "",
    data: dict | None = None,
) -> TaskEvent:
    """Append an entry to the task's timeline now and tell live pages once the transaction commits."""
    entry = event(task, kind, message, actor=actor, previous=from_status, to=to_status, data=data)
    entry.save()
    _tell_pages([task.pk], new=kind == EventKind.SUBMITTED)
    return entry


def save(change: Change) -> Change:
    """Write one change: the task's changed fields, its events, and the live pages told on commit."""
    if change.fields:
        change.task.save(update_fields=sorted({*change.fields, "updated_at"}))
    if change.events:
        TaskEvent.objects.bulk_create(change.events)
    if change:
        _tell_pages([change.task.pk], new=any(e.kind == EventKind.SUBMITTED for e in change.events))
    return change


def _tell_pages(task_ids: list[int], new: bool = False) -> None:
    transaction.on_commit(lambda: task_changed.send(sender=Task, task_ids=task_ids, new=new))


def demand_changes() -> None:
    """On commit, tell the control plane that waiting or running work changed (it runs a cycle soon)."""
    transaction.on_commit(lambda: demand_changed.send(sender=Task))


def _move(task: Task, to: str, change: Change) -> str:
    previous = task.status
    if to != previous and to not in MOVES.get(previous, frozenset()):
        raise IllegalMove(f"task #{task.pk} cannot go from {previous} to {to}")
    task.status = to
    change.fields.add("status")
    return previous


def _set(task: Task, change: Change, **values) -> None:
    for name, value in values.items():
        setattr(task, name, value)
    change.fields.update(values)


def _hold(task: Task, placement: list[dict], change: Change, rates: Mapping | None = None) -> None:
    """The task holds ``placement`` now: the placement and the ledger columns change together."""
    held = ledger.held_by(task, placement, rates)
    _set(
        task,
        change,
        placement=placement,
        replicas=len(placement),
        allocated_gpu=held.gpu,
        held_cpu=held.cpu,
        held_memory_gib=held.memory_gib,
    )


def _leave_cluster(task: Task, change: Change) -> None:
    """The task no longer runs anywhere: where it ran, its job, its replicas and its held capacity are cleared."""
    _set(task, change, cluster=None, external_id="", ready_replicas=None)
    _hold(task, [], change)


# -- submission and the scheduler ------------------------------------------------------------------------


def submitted(task: Task, actor, message: str) -> Change:
    """A new task (not saved yet) enters its queue: saved as queued with its ``submitted`` entry."""
    task.status = TaskStatus.QUEUED
    task.save()
    change = Change(task, events=[event(task, EventKind.SUBMITTED, message, actor=actor, to=task.status)])
    TaskEvent.objects.bulk_create(change.events)
    _tell_pages([task.pk], new=True)
    demand_changes()
    return change


def placed(
    task: Task,
    cluster_id: int,
    placement: list[dict],
    message: str,
    now: datetime,
    *,
    rates: Mapping | None = None,
    window_s: float | None = None,
) -> Change:
    """The scheduler placed a waiting task: a new attempt, scheduled on ``cluster_id`` with ``placement``."""
    change = Change(task)
    previous = _move(task, TaskStatus.SCHEDULED, change)
    task.cluster_id = cluster_id
    change.fields.add("cluster")
    _set(
        task,
        change,
        attempt=task.attempt + 1,
        external_id="",
        started_at=now,
        finished_at=None,
        exit_code=None,
        failure_reason="",
        queue_position=None,
        estimated_start=None,
        pending_reason="",
        pending_message="",
        status_message="",
        ready_replicas=None,
    )
    if window_s is not None:
        _set(task, change, window=timedelta(seconds=window_s))
    _hold(task, placement, change, rates)
    data = {"cluster": cluster_id, "placement": placement, "attempt": task.attempt}
    change.events.append(event(task, EventKind.SCHEDULED, message, previous=previous, to=task.status, data=data))
    return change


def preempted(task: Task, message: str, data: dict, *, new_window_s: float | None, lost_gpu_s: float) -> Change:
    """The scheduler took the task's resources: low tasks are suspended, others preempted; both wait again."""
    change = Change(task)
    low = task.queue.priority_class == PriorityClass.LOW
    previous = _move(task, TaskStatus.SUSPENDED if low else TaskStatus.PREEMPTED, change)
    _set(
        task,
        change,
        status_message=message,
        preemption_count=task.preemption_count + 1,
        lost_gpu_seconds=task.lost_gpu_seconds + Decimal(f"{lost_gpu_s:.1f}"),
    )
    if new_window_s is not None:
        _set(task, change, window=timedelta(seconds=new_window_s))
    _leave_cluster(task, change)
    kind = EventKind.SUSPENDED if low else EventKind.PREEMPTED
    change.events.append(event(task, kind, message, previous=previous, to=task.status, data=data))
    return change


def resized(task: Task, placement: list[dict], message: str, data: dict, rates: Mapping | None = None) -> Change:
    """The task's instances changed (an elastic resize, a shrink confirmed, a backend's own scaling)."""
    change = Change(task)
    _hold(task, placement, change, rates)
    change.events.append(event(task, EventKind.RESIZED, message, previous=task.status, to=task.status, data=data))
    return change


def cards_reported(task: Task, placement: list[dict], message: str, data: dict) -> Change:
    """The backend says which cards the task's instances hold (a device plugin's own choice): the placement and the
    ledger follow; nodes, models and counts stay (apps/control/devices.py)."""
    change = Change(task)
    _hold(task, placement, change)
    change.events.append(event(task, EventKind.STATUS, message, previous=task.status, to=task.status, data=data))
    return change


def waiting(task: Task, position: int | None, start: datetime | None, reason: str, message: str) -> Change:
    """Where a waiting task stands in its queue and why it waits (no event: positions move every cycle)."""
    change = Change(task)
    new = (position, start, reason[:32], message)
    if (task.queue_position, task.estimated_start, task.pending_reason, task.pending_message) != new:
        _set(
            task, change, queue_position=position, estimated_start=start, pending_reason=new[2], pending_message=message
        )
    return change


# -- the backend ---------------------------------------------------------------------------------------------


def submitted_to_backend(task: Task, external_id: str, message: str) -> Change:
    """The backend accepted the task's job: the task is starting, known there as ``external_id``."""
    change = Change(task)
    previous = _move(task, TaskStatus.STARTING, change)
    _set(task, change, external_id=external_id, status_message="")
    change.events.append(
        event(task, EventKind.STATUS, message, previous=previous, to=task.status, data={"external_id": external_id})
    )
    return change


def launch_failed(task: Task, message: str) -> Change:
    """The backend refused the task's job: the attempt failed with the backend's message."""
    change = Change(task)
    previous = _move(task, TaskStatus.FAILED, change)
    _set(task, change, status_message=message, failure_reason=FailureReason.LAUNCH, finished_at=timezone.now())
    change.events.append(event(task, EventKind.BACKEND_ERROR, message, previous=previous, to=task.status))
    return change


_FOLLOW_KINDS = {
    TaskStatus.RUNNING: EventKind.STARTED,
    TaskStatus.COMPLETED: EventKind.COMPLETED,
    TaskStatus.FAILED: EventKind.FAILED,
    TaskStatus.STOPPED: EventKind.STOPPED,
}


def followed(
    task: Task,
    new: str,
    message: str,
    *,
    note: str = "",
    external_id: str = "",
    finished_at: datetime | None = None,
    exit_code: int | None = None,
    failure: str = "",
    ran_from: datetime | None = None,
    cluster_name: str = "",
) -> Change:
    """The task's job reached ``new`` on its backend (starting, running or an end): ``message`` goes on the
    timeline, ``note`` (what the backend said, if anything) on the task.

    ``ran_from``: the job ran from then and ended between two looks, so the run is on the timeline too.
    """
    change = Change(task)
    previous = task.status
    _move(task, new, change)
    if previous == TaskStatus.UNKNOWN:
        ran_from = None  # it was running before its cluster stopped answering: its start is on the timeline
    if previous == TaskStatus.SCHEDULED and not task.external_id and external_id:
        _set(task, change, external_id=external_id)
    _set(task, change, status_message=note)
    if new in FINAL:
        _set(task, change, finished_at=finished_at or timezone.now(), exit_code=exit_code)
    if new == TaskStatus.FAILED:
        _set(task, change, failure_reason=failure)
    if new in FINAL and previous != TaskStatus.RUNNING and ran_from is not None:
        change.events.append(
            event(
                task,
                EventKind.STARTED,
                f"Ran on {cluster_name} from {ran_from:%H:%M:%S}",
                previous=previous,
                to=TaskStatus.RUNNING,
            )
        )
        previous = TaskStatus.RUNNING
    kind = EventKind.STATUS if previous == TaskStatus.UNKNOWN and new == TaskStatus.RUNNING else None
    entry = event(
        task,
        kind or _FOLLOW_KINDS.get(new, EventKind.STATUS),
        message,
        previous=previous,
        to=new,
        data={"exit_code": exit_code},
    )
    change.events.append(entry)
    return change


def unknown(task: Task, message: str) -> Change:
    """Its cluster's API stopped answering: the running task is unknown, keeps its placement, held capacity and job,
    and is neither requeued nor cancelled until the backend answers or the cluster's grace period ends."""
    change = Change(task)
    previous = _move(task, TaskStatus.UNKNOWN, change)
    _set(task, change, status_message=message)
    change.events.append(
        event(
            task, EventKind.STATUS, message, previous=previous, to=task.status, data={"external_id": task.external_id}
        )
    )
    return change


def noted(task: Task, message: str, *, kind: str | None = EventKind.STATUS, data: dict | None = None) -> Change:
    """Say on the task what it waits for (a launch waiting for cards, a backend that does not answer); the
    timeline gets an entry of ``kind`` unless it is None. Nothing is written when the note is already there."""
    change = Change(task)
    if task.status_message == message:
        return change
    _set(task, change, status_message=message)
    if kind is not None:
        change.events.append(event(task, kind, message, data=data))
    return change


def ready(task: Task, replicas: int | None) -> Change:
    """An inference service's replicas passing their readiness check, as its backend reports them."""
    change = Change(task)
    if task.ready_replicas != replicas:
        _set(task, change, ready_replicas=replicas)
    return change


def requeued(task: Task, message: str, data: dict | None = None, *, status: str | None = None) -> Change:
    """An active task goes back to its queue (its cluster failed, its job was lost, a retry after a failure):
    low tasks are suspended, others preempted, unless ``status`` says otherwise. Its job, if any, no longer
    belongs to a live attempt: the control plane cancels it."""
    change = Change(task)
    low = task.queue.priority_class == PriorityClass.LOW
    data = {"cluster": task.cluster_id, "external_id": task.external_id, **(data or {})}
    previous = _move(task, status or (TaskStatus.SUSPENDED if low else TaskStatus.PREEMPTED), change)
    _set(task, change, status_message=message)
    _leave_cluster(task, change)
    change.events.append(event(task, EventKind.REQUEUED, message, previous=previous, to=task.status, data=data))
    return change


# -- scale to zero ----------------------------------------------------------------------------------------


def scaled_to_zero(task: Task, message: str, data: dict) -> Change:
    """An idle service that scales to zero releases its cards: it leaves its cluster (the control plane cancels its
    job and keeps the cards from others until the backend confirms it gone) and waits for a request."""
    change = Change(task)
    data = {"cluster": task.cluster_id, "external_id": task.external_id, **data}
    previous = _move(task, TaskStatus.SCALED_TO_ZERO, change)
    _set(
        task,
        change,
        status_message=message,
        autoscale_desired=None,
        queue_position=None,
        estimated_start=None,
        pending_reason="",
        pending_message="",
    )
    _leave_cluster(task, change)
    change.events.append(event(task, EventKind.SCALED_TO_ZERO, message, previous=previous, to=task.status, data=data))
    return change


def woken(task: Task, message: str) -> Change:
    """A request reached a service scaled to zero: it goes back to its queue, where the scheduler places it as any
    waiting task of its class."""
    change = Change(task)
    previous = _move(task, TaskStatus.QUEUED, change)
    _set(task, change, status_message=message)
    change.events.append(event(task, EventKind.WOKEN, message, previous=previous, to=task.status))
    return change


def cold_started(task: Task, seconds: float, message: str) -> Change:
    """The request that woke the service got its first answer after ``seconds``."""
    change = Change(task)
    _set(task, change, last_cold_start_s=round(seconds, 3))
    change.events.append(event(task, EventKind.COLD_START, message, data={"seconds": round(seconds, 3)}))
    return change


# -- people --------------------------------------------------------------------------------------------------


def stopped(task: Task, actor, message: str, now: datetime | None = None) -> Change:
    """Someone stopped the task: stopped at once, out of the queue; a job it has is cancelled by the control
    plane, which keeps its cards from anyone else until the backend confirms it gone."""
    change = Change(task)
    previous = _move(task, TaskStatus.STOPPED, change)
    _set(
        task,
        change,
        finished_at=now or timezone.now(),
        queue_position=None,
        estimated_start=None,
        pending_reason="",
        pending_message="",
    )
    change.events.append(event(task, EventKind.STOPPED, message, actor=actor, previous=previous, to=task.status))
    return change


def set_aside(task: Task, message: str) -> Change:
    """A waiting task the scheduler cannot take: it keeps waiting, out of the line, with the reason on it."""
    change = Change(task)
    if task.status in WAITING and (task.pending_reason, task.pending_message) != ("invalid_request", message):
        _set(
            task,
            change,
            pending_reason="invalid_request",
            pending_message=message,
            queue_position=None,
            estimated_start=None,
        )
    return change
