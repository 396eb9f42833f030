"""Running tasks on their clusters: launch, status sync, stop, reconciliation and cluster health.

Backends are reached only through executors (``apps.clusters.backends.executor_for``). Network calls
happen outside transactions; every state change re-reads the task under a row lock and applies only
if the task is still in the state the call was made for, so a slow backend never overwrites a
newer decision of the scheduler or a user.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import timedelta

from django.db import transaction
from django.utils import timezone

from apps.clusters.backends import executor_for
from apps.clusters.choices import ClusterStatus
from apps.clusters.executors.base import (
    LABEL_ATTEMPT,
    LABEL_PROJECT,
    LABEL_TASK_ID,
    DeviceSlot,
    ExecutorError,
    GPUModelSpec,
    JobPhase,
    JobSpec,
    JobState,
    NodePlacement,
)
from apps.clusters.models import Cluster, GPUModel
from apps.queues.choices import PriorityClass
from apps.tasks.choices import ACTIVE, FINAL, EventKind, TaskStatus
from apps.tasks.models import Task
from apps.tasks.services import record_event, request_cycle

log = logging.getLogger(__name__)

# Health: degraded after one missed check, unavailable after three.
UNAVAILABLE_AFTER = 3
# A scheduled task without an external id this long after its start is reconciled by label.
RECONCILE_AFTER = timedelta(seconds=60)


def job_name(task: Task) -> str:
    """Unique per attempt, carries the task id, valid as a Kubernetes name and a Slurm job name."""
    return f"hcs-{task.pk}-{task.uid.hex[:8]}-a{task.attempt}"


def owner_labels(task: Task) -> dict[str, str]:
    return {LABEL_TASK_ID: str(task.pk), LABEL_PROJECT: task.project.name, LABEL_ATTEMPT: str(task.attempt)}


def job_spec(task: Task) -> JobSpec:
    """Map a scheduled task and its placement onto the backend-neutral JobSpec."""
    placements = task.placement or []
    model_name = next((p.get("gpu_model") for p in placements if p.get("gpu_model")), None)
    gpu_model = None
    if model_name:
        m = GPUModel.objects.get(name=model_name)
        # A Slurm site names its gres types itself; the cluster label slurm-gres.<MODEL> overrides the catalog's.
        gres = (task.cluster.labels or {}).get(f"slurm-gres.{m.name}") or m.slurm_gres_type
        gpu_model = GPUModelSpec(
            name=m.name, vendor=m.vendor, resource_name=m.resource_name, visible_devices_env=m.visible_devices_env,
            slurm_gres_type=gres, shareable=m.shareable,
        )  # fmt: skip
    first = placements[0]["devices"] if placements else []
    gpus = sum(d.get("milli", 1000) for d in first) / 1000
    settings = {
        "ide": task.ide_type, "framework": task.framework, "model_path": task.model_path, "epochs": task.epochs,
        "batch_size": task.batch_size, "checkpoint_path": task.checkpoint_path, "retries": task.max_retries,
        "port": task.port, "max_tokens": task.max_tokens,
        "temperature": float(task.temperature) if task.temperature is not None else None,
        "autoscale_min": task.autoscale_min, "autoscale_max": task.autoscale_max,
        "autoscale_cpu_percent": task.autoscale_cpu_percent, "autoscale_gpu_percent": task.autoscale_gpu_percent,
        "queue": task.queue.name,
    }  # fmt: skip
    return JobSpec(
        task_id=task.pk,
        attempt=task.attempt,
        name=job_name(task),
        project=task.project.name,
        owner=task.owner.username,
        kind=task.kind,
        image=task.image,
        command=task.command,
        env={str(k): str(v) for k, v in (task.env or {}).items()},
        volumes=tuple(task.volumes or ()),
        cpu=float(task.cpu),
        memory_gib=float(task.memory_gib),
        gpus_per_instance=gpus,
        gpu_model=gpu_model,
        instances=max(task.replicas, 1),
        placements=tuple(
            NodePlacement(
                node=p["node_name"],
                devices=tuple(DeviceSlot(index=d["index"], fraction=d.get("milli", 1000) / 1000) for d in p["devices"]),
            )
            for p in placements
        ),
        namespace=task.cluster.namespace,
        time_limit_s=int(task.expected_duration.total_seconds()) if task.expected_duration else None,
        labels=owner_labels(task),
        settings={k: v for k, v in settings.items() if v not in (None, "")},
        backend_flavour=task.queue.backend_flavour,
    )


def _locked(task_id: int) -> Task:
    return Task.objects.select_for_update(of=("self",)).select_related("queue", "cluster", "project").get(pk=task_id)


def launch(task_id: int, attempt: int) -> str | None:
    """Submit a scheduled task to its cluster (idempotent per attempt); returns the external id.

    Raises ExecutorError when the backend failed in a way worth retrying; a non-retryable error
    marks the task failed with the backend's message.
    """
    task = Task.objects.select_related("queue", "cluster", "project", "owner").filter(pk=task_id).first()
    if task is None or task.status != TaskStatus.SCHEDULED or task.attempt != attempt or task.cluster is None:
        return None  # stale: stopped, preempted or relaunched since
    try:
        executor = executor_for(task.cluster)
        external_id = executor.submit(job_spec(task))
    except ExecutorError as exc:
        if exc.retryable:
            raise
        fail(task_id, attempt, f"{task.cluster.name} refused the job: {exc}")
        return None
    with transaction.atomic():
        task = _locked(task_id)
        if task.status != TaskStatus.SCHEDULED or task.attempt != attempt:
            # Stopped or preempted while we were submitting: do not leave the job running.
            transaction.on_commit(lambda: _stop_quietly(executor, external_id))
            return None
        task.external_id = external_id
        task.status = TaskStatus.STARTING
        task.save(update_fields=["external_id", "status", "updated_at"])
        message = f"Submitted to {task.cluster.name} as {external_id}"
        record_event(task, EventKind.STATUS, message, from_status=TaskStatus.SCHEDULED, to_status=task.status,
                     data={"external_id": external_id})  # fmt: skip
    return external_id


def _stop_quietly(executor, external_id: str) -> None:
    try:
        executor.stop(external_id)
    except ExecutorError as exc:
        log.warning("could not stop orphaned job %s: %s", external_id, exc)


def fail(task_id: int, attempt: int, message: str) -> None:
    """Mark a task attempt failed with the backend's message in its timeline."""
    with transaction.atomic():
        task = _locked(task_id)
        if task.attempt != attempt or task.status not in ACTIVE:
            return
        previous = task.status
        task.status = TaskStatus.FAILED
        task.status_message = message
        task.finished_at = timezone.now()
        task.allocated_gpu = 0
        task.save()
        record_event(task, EventKind.BACKEND_ERROR, message, from_status=previous, to_status=task.status)
    request_cycle()


def stop_job(cluster_id: int | None, external_id: str) -> None:
    """Stop a job on its backend (after a user stop or a preemption)."""
    cluster = Cluster.objects.filter(pk=cluster_id).first()
    if cluster is None or not external_id:
        return
    executor_for(cluster).stop(external_id)


@dataclass
class SyncResult:
    checked: int = 0
    changed: int = 0
    reconciled: int = 0
    errors: int = 0


PHASE_TO_STATUS = {
    JobPhase.PENDING: TaskStatus.STARTING,
    JobPhase.RUNNING: TaskStatus.RUNNING,
    JobPhase.SUCCEEDED: TaskStatus.COMPLETED,
    JobPhase.FAILED: TaskStatus.FAILED,
    JobPhase.CANCELLED: TaskStatus.STOPPED,
}


def sync_statuses() -> SyncResult:
    """Bring every active task's status in line with its backend; reconcile launches that lost their write."""
    result = SyncResult()
    tasks = Task.objects.filter(status__in=ACTIVE, cluster__isnull=False).select_related("cluster", "project", "queue")
    executors: dict[int, object] = {}
    now = timezone.now()
    for task in tasks:
        result.checked += 1
        try:
            executor = executors.get(task.cluster_id) or executor_for(task.cluster)
            executors[task.cluster_id] = executor
            if not task.external_id:
                if task.status == TaskStatus.SCHEDULED and task.started_at and now - task.started_at > RECONCILE_AFTER:
                    result.reconciled += _reconcile(task, executor)
                continue
            state = executor.status(task.external_id)
        except ExecutorError as exc:
            result.errors += 1
            log.warning("status of task %s on %s: %s", task.pk, task.cluster.name, exc)
            continue
        result.changed += apply_state(task.pk, task.attempt, state)
    return result


def sync_one(task_id: int) -> str | None:
    """Check one task's backend state now (right after its launch); returns its status, None when not active."""
    task = Task.objects.select_related("cluster").filter(pk=task_id, status__in=ACTIVE).first()
    if task is None or not task.external_id or task.cluster is None:
        return None
    try:
        state = executor_for(task.cluster).status(task.external_id)
    except ExecutorError as exc:
        log.info("status of task %s on %s: %s", task.pk, task.cluster.name, exc)
        return task.status
    apply_state(task.pk, task.attempt, state)
    return Task.objects.values_list("status", flat=True).get(pk=task_id)


def _reconcile(task: Task, executor) -> int:
    """Adopt the job a launch created before dying, or launch again (submit is idempotent per attempt)."""
    found = executor.list_by_owner({LABEL_TASK_ID: str(task.pk), LABEL_ATTEMPT: str(task.attempt)})
    if not found:
        from celery_app.jobs import launch_task  # noqa: PLC0415 - Celery is the outer layer

        launch_task.delay(task.pk, task.attempt)
        return 0
    with transaction.atomic():
        locked = _locked(task.pk)
        if locked.status != TaskStatus.SCHEDULED or locked.attempt != task.attempt or locked.external_id:
            return 0
        locked.external_id = found[0].external_id
        locked.status = TaskStatus.STARTING
        locked.save(update_fields=["external_id", "status", "updated_at"])
        message = f"Found on {locked.cluster.name} as {locked.external_id} by reconciliation"
        record_event(locked, EventKind.STATUS, message, from_status=TaskStatus.SCHEDULED, to_status=locked.status)
    return 1


def apply_state(task_id: int, attempt: int, state: JobState) -> int:
    """Apply one backend state to a task; 1 when the task changed."""
    with transaction.atomic():
        task = _locked(task_id)
        if task.attempt != attempt or task.status not in ACTIVE or task.external_id != state.external_id:
            return 0
        previous = task.status
        if state.phase in (JobPhase.PREEMPTED, JobPhase.LOST):
            why = "preempted by the backend" if state.phase == JobPhase.PREEMPTED else "lost by the backend"
            requeue(task, f"{why}: {state.message}".rstrip(": "))
            return 1
        new = PHASE_TO_STATUS.get(state.phase)
        if new is None or new == previous:
            return 0
        task.status = new
        task.status_message = state.message
        if new in FINAL:
            task.finished_at = state.finished_at or timezone.now()
            task.allocated_gpu = 0
        kind = {
            TaskStatus.RUNNING: EventKind.STARTED, TaskStatus.COMPLETED: EventKind.COMPLETED,
            TaskStatus.FAILED: EventKind.FAILED, TaskStatus.STOPPED: EventKind.STOPPED,
        }.get(new, EventKind.STATUS)  # fmt: skip
        message = state.message or f"{task.cluster.name} reports {state.phase.value}"
        if new == TaskStatus.STOPPED:
            message = f"Cancelled on {task.cluster.name}" + (f": {state.message}" if state.message else "")
        task.save()
        if new in FINAL and previous != TaskStatus.RUNNING and state.started_at:
            # It ran and ended between two syncs: keep the run visible in the timeline.
            record_event(task, EventKind.STARTED, f"Ran on {task.cluster.name} from {state.started_at:%H:%M:%S}",
                         from_status=previous, to_status=TaskStatus.RUNNING)  # fmt: skip
            previous = TaskStatus.RUNNING
        record_event(task, kind, message, from_status=previous, to_status=new, data={"exit_code": state.exit_code})
    if new in FINAL:
        request_cycle()
    return 1


def requeue(task: Task, message: str) -> None:
    """Put an active task back in its queue (caller holds the row lock); low tasks are suspended."""
    previous = task.status
    low = task.queue.priority_class == PriorityClass.LOW
    task.status = TaskStatus.SUSPENDED if low else TaskStatus.PREEMPTED
    task.status_message = message
    data = {"cluster": task.cluster_id, "external_id": task.external_id}
    task.cluster, task.placement, task.allocated_gpu, task.replicas, task.external_id = None, [], 0, 0, ""
    task.save()
    record_event(task, EventKind.REQUEUED, message, from_status=previous, to_status=task.status, data=data)
    transaction.on_commit(request_cycle)


def check_cluster_health(cluster: Cluster) -> Cluster:
    """Probe a cluster's backend: healthy on success; degraded after one miss, unavailable after three.

    Tasks on a cluster that just became unavailable are requeued under their class rules.
    """
    try:
        message = executor_for(cluster).health()
        ok = True
    except ExecutorError as exc:
        message, ok = str(exc), False
    with transaction.atomic():
        cluster = Cluster.objects.select_for_update().get(pk=cluster.pk)
        if ok:
            cluster.missed_heartbeats = 0
            cluster.last_heartbeat = timezone.now()
            if cluster.status != ClusterStatus.MAINTENANCE:
                cluster.status = ClusterStatus.HEALTHY
        else:
            cluster.missed_heartbeats += 1
            if cluster.status != ClusterStatus.MAINTENANCE:
                unavailable = cluster.missed_heartbeats >= UNAVAILABLE_AFTER
                cluster.status = ClusterStatus.UNAVAILABLE if unavailable else ClusterStatus.DEGRADED
        cluster.status_message = message[:2000]
        cluster.save(update_fields=["missed_heartbeats", "last_heartbeat", "status", "status_message", "updated_at"])
        if cluster.status == ClusterStatus.UNAVAILABLE:
            for task in (
                Task.objects.select_for_update().select_related("queue").filter(cluster=cluster, status__in=ACTIVE)
            ):
                requeue(task, f"Cluster {cluster.name} is unavailable ({message})")
    return cluster
