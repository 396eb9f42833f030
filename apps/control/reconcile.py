"""Level-triggered reconciliation: the database holds the desired state, the backends the observed one.

Every job the portal asks a backend for is a :class:`BackendObject`, written in the same transaction as
the placement that wants it. A reconciliation of one cluster lists that cluster's jobs of this installation
once (whatever the number of tasks), matches them to the objects by identity (installation, task uid,
attempt) and acts on each difference idempotently:

- wanted (its task is active on this cluster in this attempt) and not on the backend: submit it (launches
  are retried for as long as the cluster is not declared unavailable; a refusal fails the task);
- wanted and on the backend: follow its phase into the task's status, and its size into the task's replicas;
- not wanted and still running there: cancel it, again at every pass, until the backend confirms it gone;
- on the backend with this installation's label but tracked by no object (a crash, a restored database):
  it belongs to no live attempt, so it is recorded and cancelled;
- a deleted training task's checkpoint directory (a :class:`CheckpointStore`) whose jobs are all gone from
  the cluster: removed, and forgotten once the backend removed it.

Network calls happen outside transactions; every write re-reads its rows under lock and applies only if
they are still in the state the call was made for, so a slow backend never overwrites a newer decision.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from datetime import timedelta

from django.db import transaction
from django.db.models import Exists, OuterRef, Q
from django.utils import timezone

from apps.clusters.backends import executor_for
from apps.clusters.choices import ClusterStatus
from apps.clusters.executors.base import (
    CHECKPOINT_KINDS,
    LABEL_ATTEMPT,
    LABEL_INSTALLATION,
    LABEL_LAUNCH_TOKEN,
    LABEL_TASK_UID,
    Executor,
    ExecutorError,
    JobPhase,
    JobState,
)
from apps.clusters.models import Cluster
from apps.control import outages
from apps.control.devices import follow_devices
from apps.control.jobspec import job_spec
from apps.control.models import HOLDING, BackendObject, CheckpointStore, Installation, ObjectState, shares_of
from apps.control.triggers import request_cycle, request_reconcile
from apps.queues import stats
from apps.tasks import lifecycle, sweeps
from apps.tasks.choices import ACTIVE, FINAL, EventKind, FailureReason, TaskStatus
from apps.tasks.ledger import WHOLE, placement_devices
from apps.tasks.models import Task
from apps.tasks.services import (
    adopt_instances,
    record_event,
    requeue_task,
    retry_failed_run,
)

log = logging.getLogger(__name__)

# While a submit or resize call is in flight, a listing that lacks the object proves nothing.
LEASE = timedelta(seconds=60)
# A checkpoint directory that could not be removed is tried again after this long, not at every pass.
CHECKPOINT_RETRY = timedelta(seconds=60)
# Retryable launch failures wait this long before the next try (doubling up to the maximum).
RETRY_BASE_S, RETRY_MAX_S = 2, 60

_RUNNING_PHASES = (JobPhase.PENDING, JobPhase.RUNNING, JobPhase.UNKNOWN)
PHASE_TO_STATUS = {
    JobPhase.PENDING: TaskStatus.STARTING,
    JobPhase.RUNNING: TaskStatus.RUNNING,
    JobPhase.SUCCEEDED: TaskStatus.COMPLETED,
    JobPhase.FAILED: TaskStatus.FAILED,
    JobPhase.CANCELLED: TaskStatus.STOPPED,
}


@dataclass
class ReconcileResult:
    """What one reconciliation of one cluster did, for logs, metrics and tests."""

    cluster: str
    reachable: bool = True
    listed: int = 0
    launched: int = 0
    adopted: int = 0
    updated: int = 0
    cancelled: int = 0
    ended: int = 0
    untracked: int = 0
    look_alikes: int = 0
    resized: int = 0
    checkpoints_removed: int = 0
    errors: list[str] = field(default_factory=list)


def installation_label() -> dict[str, str]:
    """The label selecting this installation's objects on any backend."""
    return {LABEL_INSTALLATION: Installation.current().uid.hex}


def _identity(state: JobState) -> tuple[str, str]:
    return state.labels.get(LABEL_TASK_UID, ""), state.labels.get(LABEL_ATTEMPT, "")


def _leased(obj: BackendObject, now) -> bool:
    return obj.lease_until is not None and obj.lease_until > now


def _locked_task(task_id: int) -> Task:
    return Task.objects.select_for_update(of=("self",)).select_related("queue", "cluster", "project").get(pk=task_id)


def _locked_object(object_id: int) -> BackendObject:
    return BackendObject.objects.select_for_update(of=("self",)).select_related("task", "cluster").get(pk=object_id)


# -- launch ----------------------------------------------------------------------------------------


def device_conflicts(obj: BackendObject) -> list[BackendObject]:
    """Other objects on the cluster whose jobs may still hold so much of one of ``obj``'s cards that ``obj``'s share
    does not fit beside them (shares of one card that fit together launch together)."""
    mine = {share["id"]: share["milli"] for share in obj.shares or ()}
    if not mine:
        return []
    others = BackendObject.objects.filter(cluster_id=obj.cluster_id, state__in=HOLDING).exclude(pk=obj.pk)
    held: dict[int, int] = dict.fromkeys(mine, 0)
    holders: dict[int, list[BackendObject]] = {pk: [] for pk in mine}
    for other in others.select_related("task", "cluster"):
        for share in other.shares or ():
            if share["id"] in mine:
                held[share["id"]] += share["milli"]
                holders[share["id"]].append(other)
    blocking = {o.pk: o for pk, milli in mine.items() if held[pk] + milli > WHOLE for o in holders[pk]}
    return list(blocking.values())


def launch_object(object_id: int) -> int | None:
    """Submit one wanted, pending object's job; returns its cluster id once submitted, None otherwise.

    Safe to call any number of times from anywhere (the launch job, every reconciliation): the submit is
    idempotent per attempt, and a lease keeps two callers from submitting at once. A retryable backend
    error leaves the object pending with a note on the task; the next reconciliation tries again.
    """
    now = timezone.now()
    with transaction.atomic():
        obj = _locked_object(object_id)
        if obj.state != ObjectState.PENDING or _leased(obj, now) or not obj.wanted:
            return None
        if obj.cluster.status == ClusterStatus.UNAVAILABLE:
            return None  # the health check hands the task back to the queue
        conflicts = device_conflicts(obj)
        if conflicts:
            _note_waiting(obj.task, conflicts)
            transaction.on_commit(lambda: request_reconcile(obj.cluster_id))
            return None
        earlier = unfenced_runs(obj)
        if earlier:
            _note_waiting(obj.task, earlier, "to end")
            for cluster_id in {o.cluster_id for o in earlier}:
                transaction.on_commit(lambda cluster_id=cluster_id: request_reconcile(cluster_id))
            return None
        obj.lease_until = now + LEASE
        obj.submit_attempts += 1
        obj.save(update_fields=["lease_until", "submit_attempts"])
        task = obj.task
        if task.kind in CHECKPOINT_KINDS:
            # Recorded before any job can write it, so that deleting the task removes it from every cluster.
            CheckpointStore.objects.get_or_create(
                cluster_id=obj.cluster_id, task_uid=obj.task_uid, defaults={"task": task, "project": task.project.name}
            )
    try:
        executor = executor_for(obj.cluster)
        spec = job_spec(task, Installation.current().uid.hex, launch_token=obj.launch_token)
        external_id = executor.submit(spec, fresh=obj.submit_attempts == 1)
    except ExecutorError as exc:
        _launch_failed(obj.pk, exc)
        return None
    with transaction.atomic():
        obj = _locked_object(object_id)
        obj.external_id, obj.state, obj.lease_until = external_id, ObjectState.ACTIVE, None
        obj.submitted_at = timezone.now()
        obj.message = f"submitted as {external_id}"
        obj.save(update_fields=["external_id", "state", "lease_until", "submitted_at", "message"])
        task = _locked_task(obj.task_id)
        if task.status != TaskStatus.SCHEDULED or task.attempt != obj.attempt:
            # Stopped or preempted while we were submitting: the next reconciliation cancels the job.
            transaction.on_commit(lambda: request_reconcile(obj.cluster_id))
            return None
        _mark_submitted(task, external_id, f"Submitted to {task.cluster.name} as {external_id}")
    return obj.cluster_id


def _mark_submitted(task: Task, external_id: str, message: str) -> None:
    lifecycle.save(lifecycle.submitted_to_backend(task, external_id, message))


def unfenced_runs(obj: BackendObject) -> list[BackendObject]:
    """Earlier attempts of the object's task whose jobs their backend has not confirmed ended: a rerun waits for them,
    so that the task's work never runs twice at once (docs/control.md, "Fencing"). A cluster unavailable past its
    grace period is not waited for (its job is cancelled once it answers)."""
    earlier = BackendObject.objects.filter(task_uid=obj.task_uid, attempt__lt=obj.attempt, state__in=HOLDING)
    return list(earlier.exclude(cluster__status=ClusterStatus.UNAVAILABLE).select_related("cluster"))


def _note_waiting(task: Task, conflicts: list[BackendObject], what: str = "to release its devices") -> None:
    """Say on the task which jobs it waits for (once per change, not at every pass)."""
    holders = ", ".join(f"{o.name}" + (f" (task #{o.task_id})" if o.task_id else "") for o in conflicts[:3])
    message = f"Waiting for {holders} {what} on {conflicts[0].cluster.name}"
    lifecycle.save(lifecycle.noted(_locked_task(task.pk), message, data={"waiting_for": [o.name for o in conflicts]}))


def _launch_failed(object_id: int, exc: ExecutorError) -> None:
    with transaction.atomic():
        obj = _locked_object(object_id)
        if not exc.retryable:
            obj.state, obj.ended_at, obj.lease_until = ObjectState.ENDED, timezone.now(), None
            obj.message = f"refused: {exc}"
            obj.save(update_fields=["state", "ended_at", "lease_until", "message"])
            if obj.wanted:
                _fail_task(obj.task_id, obj.attempt, f"{obj.cluster.name} refused the job: {exc}")
            return
        delay = min(RETRY_BASE_S * 2 ** (obj.submit_attempts - 1), RETRY_MAX_S)
        obj.lease_until = timezone.now() + timedelta(seconds=delay)  # also: the call may have reached the backend
        obj.message = f"submit failed ({exc}); retrying in {delay} s"
        obj.save(update_fields=["lease_until", "message"])
        task = _locked_task(obj.task_id)
        note = f"Waiting for {obj.cluster.name}: {exc}"
        if obj.wanted and task.status_message != note:
            first = not task.status_message.startswith(f"Waiting for {obj.cluster.name}:")
            change = lifecycle.noted(task, note, kind=None)
            if first:
                said = f"{note}; the launch is retried until the cluster answers or is declared unavailable"
                change.events.append(lifecycle.event(task, EventKind.BACKEND_ERROR, said, data={"retryable": True}))
            lifecycle.save(change)


def _fail_task(task_id: int, attempt: int, message: str) -> None:
    """Mark a task attempt failed with the backend's message in its timeline (caller is in a transaction)."""
    task = _locked_task(task_id)
    if task.attempt != attempt or task.status not in ACTIVE:
        return
    lifecycle.save(lifecycle.launch_failed(task, message))
    transaction.on_commit(request_cycle)


# -- reconciliation --------------------------------------------------------------------------------


def reconcile_cluster(cluster_id: int) -> ReconcileResult:
    """Compare one cluster's backend with the database and act on every difference."""
    cluster = Cluster.objects.get(pk=cluster_id)
    result = ReconcileResult(cluster=cluster.name)
    objects = list(
        BackendObject.objects.filter(cluster=cluster)
        .exclude(state=ObjectState.ENDED)
        .select_related("task", "task__queue", "task__cluster", "cluster")
    )
    try:
        executor = executor_for(cluster)
        observed = executor.list_by_owner(installation_label())
    except ExecutorError as exc:
        result.reachable = False
        result.errors.append(str(exc))
        outages.unreachable(cluster, f"cannot list the backend: {exc}")
        return result
    outages.answered(cluster)
    result.listed = len(observed)
    by_id = {state.external_id: state for state in observed}
    claimed: set[str] = set()
    now = timezone.now()
    for obj in objects:
        state = _followed_job(obj, observed, by_id)
        if state is not None:
            claimed.add(state.external_id)
        try:
            _reconcile_object(obj, state, executor, result, now)
        except ExecutorError as exc:
            result.errors.append(f"{obj.name}: {exc}")
            log.warning("reconcile %s: %s: %s", cluster.name, obj.name, exc)
    live = {(o.task_uid.hex, str(o.attempt)): o for o in objects}
    for state in observed:
        if state.external_id in claimed or state.phase not in _RUNNING_PHASES:
            continue
        owner = live.get(_identity(state))
        if owner is not None:
            _look_alike(owner, state, result)
            continue
        try:
            _untracked(cluster, state, executor, result)
        except ExecutorError as exc:
            result.errors.append(f"{state.name}: {exc}")
    remove_deleted_checkpoints(cluster, executor, result)
    if result.cancelled or result.ended:
        transaction.on_commit(request_cycle)
    return result


def _followed_job(obj: BackendObject, observed: list[JobState], by_id: dict[str, JobState]) -> JobState | None:
    """The job an object follows: exactly the one whose id it recorded at launch; for a launch whose answer was lost
    (no id yet), the job carrying its launch token, the first submitted if a copy carries it too. Never a job found by
    name and labels alone (docs/control.md, "Identity by id")."""
    if obj.external_id:
        state = by_id.get(obj.external_id)
        if state is not None and obj.backend_uid and state.uid and state.uid != obj.backend_uid:
            return None  # another object under the same name (the one it followed was replaced): not ours
        return state
    mine = [s for s in observed if s.labels.get(LABEL_LAUNCH_TOKEN) == obj.launch_token]
    return min(mine, key=lambda s: (len(s.external_id), s.external_id)) if mine else None


def _look_alike(owner: BackendObject, state: JobState, result: ReconcileResult) -> None:
    """A job that carries a live attempt's identity but is not the job that attempt follows (a copy of its name and
    labels, a second submit of the same attempt): reported on the task's timeline once and in the log, never followed
    and never cancelled (it is not the portal's to judge)."""
    result.look_alikes += 1
    log.warning(
        "%s: job %s carries the identity of %s but is not its job %s: not followed",
        owner.cluster.name,
        state.external_id,
        owner.name,
        owner.external_id or "(not submitted yet)",
    )
    if owner.task_id is None:
        return
    message = (
        f"Job {state.external_id} on {owner.cluster.name} carries this task's name and labels but is not its "
        f"job{f' {owner.external_id}' if owner.external_id else ''}: reported, not followed"
    )
    task = Task.objects.get(pk=owner.task_id)
    if not task.events.filter(kind=EventKind.BACKEND_ERROR, message=message).exists():
        record_event(task, EventKind.BACKEND_ERROR, message, data={"look_alike": state.external_id})


def remove_deleted_checkpoints(cluster: Cluster, executor: Executor, result: ReconcileResult) -> None:
    """Remove the checkpoint directories of deleted tasks once none of their jobs is left on the cluster
    (a job being cancelled may still write); a failure is kept on the store and retried a minute later."""
    running = BackendObject.objects.filter(cluster=cluster, task_uid=OuterRef("task_uid")).exclude(
        state=ObjectState.ENDED
    )
    now = timezone.now()
    due = Q(failed_at__isnull=True) | Q(failed_at__lt=now - CHECKPOINT_RETRY)
    for store in CheckpointStore.objects.filter(due, cluster=cluster, task__isnull=True).exclude(Exists(running)):
        try:
            executor.remove_checkpoints(store.task_uid.hex, store.project)
        except ExecutorError as exc:
            CheckpointStore.objects.filter(pk=store.pk).update(message=str(exc)[:2000], failed_at=now)
            result.errors.append(f"checkpoints of {store.task_uid.hex}: {exc}")
            continue
        store.delete()
        result.checkpoints_removed += 1


def _reconcile_object(obj: BackendObject, state: JobState | None, executor: Executor, result, now) -> None:
    if state is None:
        if _leased(obj, now):
            return
        if obj.state == ObjectState.PENDING and obj.wanted:
            if launch_object(obj.pk) is not None:
                result.launched += 1
            return
        final = _final_state(obj, executor)
        if final is not None:
            # It ended while nobody looked, and the listing has forgotten it: follow how it ended, not "lost".
            if apply_state(obj, final, executor.retries_failed_jobs):
                result.updated += 1
            if _end(obj.pk, f"ended on the backend ({final.phase.value}; from its accounting records)", state=final):
                result.ended += 1
            return
        why = "never reached the backend" if obj.state == ObjectState.PENDING else "no longer on the backend"
        if _end(obj.pk, why, require_unleased=True):
            result.ended += 1
            if obj.state == ObjectState.ACTIVE:
                _lost(obj, f"lost by the backend: {executor_name(obj)} no longer knows job {obj.external_id}")
        return
    if not obj.wanted:
        if state.phase in _RUNNING_PHASES:
            _cancel(obj, state, executor)
            result.cancelled += 1
        elif _end(obj.pk, f"ended on the backend ({state.phase.value})", state=state):
            result.ended += 1
        return
    if obj.state == ObjectState.PENDING:
        if _adopt(obj, state):
            result.adopted += 1
        obj.refresh_from_db()
    if state.uid and not obj.backend_uid:
        BackendObject.objects.filter(pk=obj.pk, backend_uid="").update(backend_uid=state.uid)
        obj.backend_uid = state.uid
    if state.restarts > 0:
        # Slurm requeued the job by itself after a node failure: the portal's rules decide what happens next.
        _lost(
            obj,
            f"the backend restarted job {state.external_id} by itself (node failure); requeued as a new "
            "attempt by the portal's rules",
        )
        if state.phase in _RUNNING_PHASES:
            _cancel(obj, state, executor)
            result.cancelled += 1
        elif _end(obj.pk, f"ended on the backend after a restart ({state.phase.value})", state=state):
            result.ended += 1
        return
    if apply_state(obj, state, executor.retries_failed_jobs):
        result.updated += 1
    if state.phase not in _RUNNING_PHASES:
        if _end(obj.pk, f"ended on the backend ({state.phase.value})", state=state):
            result.ended += 1
        return
    if _follow_size(obj, state, executor):
        result.resized += 1
    _follow_readiness(obj, state)
    follow_devices(obj, state)


def _final_state(obj: BackendObject, executor: Executor) -> JobState | None:
    """How a submitted job the listing no longer shows ended, where the backend keeps such records (ExecutorError
    when they cannot be read now: the object waits for the next pass rather than be called lost)."""
    if obj.state != ObjectState.ACTIVE or not obj.external_id:
        return None
    submitted = obj.submitted_at.timestamp() if obj.submitted_at else None
    return executor.final_state(obj.external_id, obj.name, submitted)


def prune_ended_objects(older_than: timedelta) -> int:
    """Forget backend objects the backend confirmed gone more than ``older_than`` ago; returns how many.

    Only ended objects go: a job still listed for an object that is gone counts as untracked and is
    cancelled, so forgetting never lets a job run unseen.
    """
    cutoff = timezone.now() - older_than
    deleted, _ = BackendObject.objects.filter(state=ObjectState.ENDED, ended_at__lt=cutoff).delete()
    return deleted


def executor_name(obj: BackendObject) -> str:
    return obj.cluster.name


def _adopt(obj: BackendObject, state: JobState) -> bool:
    """The job exists but its launch's write was lost (a worker died after submitting): record it."""
    with transaction.atomic():
        locked = _locked_object(obj.pk)
        if locked.state != ObjectState.PENDING:
            return False
        locked.external_id, locked.state, locked.lease_until = state.external_id, ObjectState.ACTIVE, None
        locked.submitted_at = locked.submitted_at or timezone.now()
        locked.message = f"found on the backend as {state.external_id} by reconciliation"
        locked.save(update_fields=["external_id", "state", "lease_until", "submitted_at", "message"])
        task = _locked_task(locked.task_id)
        if task.status == TaskStatus.SCHEDULED and task.attempt == locked.attempt and not task.external_id:
            _mark_submitted(
                task, state.external_id, f"Found on {task.cluster.name} as {state.external_id} by reconciliation"
            )
    return True


def _end(object_id: int, message: str, *, state: JobState | None = None, require_unleased: bool = False) -> bool:
    """The backend holds nothing for this object any more: stop tracking it."""
    with transaction.atomic():
        obj = _locked_object(object_id)
        now = timezone.now()
        if obj.state == ObjectState.ENDED or (require_unleased and _leased(obj, now)):
            return False
        obj.state, obj.ended_at, obj.lease_until, obj.message = ObjectState.ENDED, now, None, message
        if state is not None:
            obj.phase = state.phase.value
            obj.external_id = obj.external_id or state.external_id
        obj.save(update_fields=["state", "ended_at", "lease_until", "message", "phase", "external_id"])
    return True


def _cancel(obj: BackendObject, state: JobState, executor: Executor) -> None:
    """Ask the backend to end a job no live attempt wants; repeated at every pass until it is gone."""
    external_id = obj.external_id or state.external_id
    executor.stop(external_id)
    with transaction.atomic():
        locked = _locked_object(obj.pk)
        first = locked.cancel_requested_at is None
        locked.external_id = external_id
        locked.state = ObjectState.ACTIVE
        locked.phase = state.phase.value
        locked.observed_at = locked.cancel_requested_at = timezone.now()
        locked.message = f"cancel requested ({state.phase.value} on the backend)"
        locked.save(update_fields=["external_id", "state", "phase", "observed_at", "cancel_requested_at", "message"])
        if first and locked.task_id:
            task = Task.objects.get(pk=locked.task_id)
            why = (
                "its task is no longer active there"
                if task.attempt == locked.attempt
                else ("it belongs to no live attempt of the task")
            )
            record_event(
                task,
                EventKind.STATUS,
                f"Cancelling job {external_id} on {locked.cluster.name}: {why}",
                data={"external_id": external_id, "attempt": locked.attempt},
            )


def _untracked(cluster: Cluster, state: JobState, executor: Executor, result: ReconcileResult) -> None:
    """A running job of this installation that no object tracks: it belongs to no live attempt."""
    uid, attempt = _identity(state)
    task = Task.objects.filter(uid=uid).first() if uid else None
    try:
        attempt_number = int(attempt)
    except ValueError:
        attempt_number = 0
    obj, _created = BackendObject.objects.get_or_create(
        cluster=cluster,
        task_uid=uid or "0" * 32,
        attempt=attempt_number,
        defaults={
            "task": task,
            "name": state.name or state.external_id,
            "external_id": state.external_id,
            "state": ObjectState.ACTIVE,
        },
    )
    if obj.external_id and obj.external_id != state.external_id:
        _look_alike(obj, state, result)  # the attempt's own job was another one: this one is not the portal's
        return
    if obj.state == ObjectState.ENDED:
        BackendObject.objects.filter(pk=obj.pk).update(state=ObjectState.ACTIVE, ended_at=None)
        obj.refresh_from_db()
    if obj.wanted:
        return  # tracked after all (a concurrent launch recorded it meanwhile)
    result.untracked += 1
    _cancel(obj, state, executor)
    result.cancelled += 1


def _lost(obj: BackendObject, message: str) -> None:
    """The job of a live attempt is gone or unusable: requeue its task by its class rules."""
    if obj.task_id is None:
        return
    with transaction.atomic():
        task = _locked_task(obj.task_id)
        if task.attempt != obj.attempt or task.status not in ACTIVE or task.cluster_id != obj.cluster_id:
            return
        requeue_task(task, message, {"object": obj.name})


def apply_state(obj: BackendObject, state: JobState, backend_retries: bool = False) -> int:
    """Follow one backend state into the object's task; 1 when the task changed.

    A failed run is retried by the task's retry setting, as a new attempt, unless ``backend_retries`` (the
    backend restarts failed jobs itself).
    """
    with transaction.atomic():
        BackendObject.objects.filter(pk=obj.pk).update(phase=state.phase.value, observed_at=timezone.now())
        task = _locked_task(obj.task_id)
        if task.attempt != obj.attempt or task.status not in ACTIVE or task.cluster_id != obj.cluster_id:
            return 0
        previous = task.status
        if state.phase in (JobPhase.PREEMPTED, JobPhase.LOST):
            why = "preempted by the backend" if state.phase == JobPhase.PREEMPTED else "lost by the backend"
            requeue_task(task, f"{why}: {state.message}".rstrip(": "))
            return 1
        new = PHASE_TO_STATUS.get(state.phase)
        if new is None or new == previous:
            return 0
        if previous == TaskStatus.RUNNING and new == TaskStatus.STARTING:
            return 0  # an older observation (a listing taken before a status call): never step back
        retry = new == TaskStatus.FAILED and not backend_retries
        if retry and retry_failed_run(task, state.exit_code, _failure_of(state), state.message):
            transaction.on_commit(request_cycle)
            return 1
        message = state.message or f"{task.cluster.name} reports {state.phase.value}"
        if new == TaskStatus.STOPPED:
            message = f"Cancelled on {task.cluster.name}" + (f": {state.message}" if state.message else "")
        if previous == TaskStatus.UNKNOWN and new == TaskStatus.RUNNING:
            message = f"{task.cluster.name} answers again: job {obj.external_id} is still running"
        ran = new == TaskStatus.RUNNING or (new in FINAL and state.started_at is not None)
        reached_running = previous not in (TaskStatus.RUNNING, TaskStatus.UNKNOWN) and ran
        change = lifecycle.followed(
            task,
            new,
            message,
            note=state.message,
            external_id=state.external_id,
            finished_at=state.finished_at,
            exit_code=state.exit_code,
            failure=_failure_of(state),
            ran_from=state.started_at,
            cluster_name=task.cluster.name,
        )
        lifecycle.save(change)
        if reached_running:
            _observe_start(task, state.started_at or timezone.now())
        if new in FINAL:
            transaction.on_commit(request_cycle)
            if task.sweep_id:
                task_id, cluster_id, external_id = task.pk, obj.cluster_id, state.external_id or obj.external_id
                transaction.on_commit(lambda: record_metric(task_id, cluster_id, external_id))
    return 1


def record_metric(task_id: int, cluster_id: int, external_id: str) -> None:
    """A sweep element's run ended: its metric is the last ``HCS_METRIC name=value`` line at the end of its log
    (docs/tasks.md, "Parameter sweeps"). A log that cannot be read now leaves the metric as it was."""
    cluster = Cluster.objects.filter(pk=cluster_id).first()
    if cluster is None or not external_id:
        return
    try:
        text = executor_for(cluster).logs(external_id, tail=sweeps.METRIC_TAIL_LINES)
    except ExecutorError as exc:
        log.warning("task %s: no metric read from the log of %s: %s", task_id, external_id, exc)
        return
    found = sweeps.last_metric(text)
    if found is not None:
        Task.objects.filter(pk=task_id).update(metric_name=found[0], metric_value=found[1])


def _observe_start(task: Task, running_at) -> None:
    """A run reached running: add its waits to the latency histograms once the transaction commits.

    Submit to running counts the first run only; queue wait is every run's time in the queue, from its
    submission or requeue to its placement (the timeline's entries).
    """
    entries = list(
        task.events.filter(kind__in=(EventKind.SUBMITTED, EventKind.REQUEUED, EventKind.SCHEDULED))
        .order_by("-created_at", "-id")
        .values_list("kind", "created_at")[:4]
    )
    placed = next((at for kind, at in entries if kind == EventKind.SCHEDULED), None)
    queued = next((at for kind, at in entries if kind != EventKind.SCHEDULED and placed and at <= placed), None)
    vdc, klass, first = task.vdc.name, task.queue.priority_class, task.attempt == 1
    submit_wait = (running_at - task.submitted_at).total_seconds()
    queue_wait = (placed - queued).total_seconds() if placed and queued else None

    def record() -> None:
        if first:
            stats.record_latency("submit_to_running", vdc, klass, submit_wait)
        if queue_wait is not None:
            stats.record_latency("queue_wait", vdc, klass, queue_wait)

    transaction.on_commit(record)


def _follow_readiness(obj: BackendObject, state: JobState) -> None:
    """Keep an inference service's ready replicas (those passing its readiness probe) as its backend reports them."""
    if state.ready_replicas is None or obj.task_id is None or obj.task.ready_replicas == state.ready_replicas:
        return
    with transaction.atomic():
        task = _locked_task(obj.task_id)
        if task.attempt == obj.attempt and task.status in ACTIVE:
            lifecycle.save(lifecycle.ready(task, state.ready_replicas))


def _failure_of(state: JobState) -> str:
    """Why a failed run failed, as the task's ``failure_reason`` says it."""
    return state.failure or (FailureReason.EXIT_CODE if state.exit_code else FailureReason.BACKEND)


def _follow_size(obj: BackendObject, state: JobState, executor: Executor) -> bool:
    """Keep the task's size and its backend's in line: push an elastic task's size to its backend (and settle
    released devices once it confirms), and read back a size the backend chose itself (an HPA)."""
    task = obj.task
    portal_scaled = task is not None and task.autoscale_desired is not None and executor.scales_services
    if task is None or not (executor.supports_resize or portal_scaled):
        return False
    if task.is_elastic or portal_scaled:
        wanted = len(task.placement or [])
        released = set(obj.device_ids) - set(placement_devices(task.placement))
        # A portal-scaled service's replica process that died is started again (resize is idempotent).
        died = portal_scaled and state.replicas is not None and state.replicas < wanted and not released
        if obj.replicas != wanted or died:
            if portal_scaled:
                executor.resize(obj.external_id, wanted, spec=job_spec(task, Installation.current().uid.hex))
            else:
                executor.resize(obj.external_id, wanted, tuple(p["node_name"] for p in task.placement))
            BackendObject.objects.filter(pk=obj.pk).update(replicas=wanted, message=f"resize to {wanted} requested")
            return True
        if state.replicas == wanted and released:
            with transaction.atomic():
                locked = _locked_object(obj.pk)
                if locked.task_id and locked.attempt == obj.attempt:
                    locked.shares = shares_of(_locked_task(locked.task_id).placement)
                    locked.save(update_fields=["shares"])
                    record_event(
                        locked.task,
                        EventKind.RESIZED,
                        f"{obj.cluster.name} runs {wanted} replicas: the cards it gave back are free",
                        data={"released": sorted(released)},
                    )
        return False
    settled = state.replicas is not None and state.replicas == state.desired_replicas
    if state.desired_replicas is not None and state.desired_replicas != obj.replicas and settled:
        _adopt_backend_size(obj, state)
        return True
    return False


def _adopt_backend_size(obj: BackendObject, state: JobState) -> None:
    """The backend scaled the task itself (a Kubernetes HPA): its replicas, where they run, become the task's
    placement, so quotas, the engine and billing count what really runs."""
    with transaction.atomic():
        task = _locked_task(obj.task_id)
        if task.attempt != obj.attempt or task.status not in ACTIVE:
            return
        before = len(task.placement or [])
        placement, unplaced = adopt_instances(task, list(state.nodes))
        message = f"{obj.cluster.name} runs {state.desired_replicas} replicas (was {before}), as its autoscaler chose"
        if unplaced:
            message += f"; {unplaced} on nodes or devices the portal does not know as free"
        data = {"replicas": state.desired_replicas, "from": before, "by": "backend", "unplaced": unplaced}
        lifecycle.save(lifecycle.resized(task, placement, message, data))
        BackendObject.objects.filter(pk=obj.pk).update(replicas=state.desired_replicas, shares=shares_of(placement))


# Up to this many starting jobs are looked at one by one; more are read with one listing of the cluster.
FOLLOW_ONE_BY_ONE = 5


def follow_cluster(cluster_id: int) -> int:
    """Follow a cluster's submitted jobs whose tasks wait to run; returns how many still wait.

    Up to ``FOLLOW_ONE_BY_ONE`` jobs get a status call each; more are read with one listing of the cluster
    (then the caller should look again less often: a listing costs the backend more).
    """
    starting = list(
        BackendObject.objects.filter(
            cluster_id=cluster_id,
            state=ObjectState.ACTIVE,
            task__status__in=(TaskStatus.SCHEDULED, TaskStatus.STARTING),
        ).select_related("task", "cluster")
    )
    starting = [o for o in starting if o.wanted]
    if not starting:
        return 0
    if len(starting) > FOLLOW_ONE_BY_ONE:
        reconcile_cluster(cluster_id)
    else:
        executor = executor_for(starting[0].cluster)
        for obj in starting:
            try:
                state = executor.status(obj.external_id)
            except ExecutorError as exc:
                log.info("status of %s on %s: %s", obj.name, obj.cluster.name, exc)
                continue
            if state.phase == JobPhase.LOST:
                continue  # a listing decides what is gone, not one status call racing a fresh submit
            apply_state(obj, state, executor.retries_failed_jobs)
            if state.phase not in _RUNNING_PHASES:
                _end(obj.pk, f"ended on the backend ({state.phase.value})", state=state)
    return Task.objects.filter(
        pk__in=[o.task_id for o in starting], status__in=(TaskStatus.SCHEDULED, TaskStatus.STARTING)
    ).count()
