"""Driving the control loops by hand in tests: what beat and the worker do, one step at a time."""

from __future__ import annotations

import time

from apps.clusters.backends import executor_for
from apps.clusters.models import Cluster
from apps.control import reconcile
from apps.control.models import BackendObject, ObjectState
from apps.control.scheduling import run_cycle
from apps.tasks.models import Task


def intent(task: Task) -> BackendObject:
    """The backend object of the task's current attempt."""
    return BackendObject.objects.get(task=task, attempt=task.attempt)


def launch(task: Task) -> int | None:
    """Carry out the launch intent of a scheduled task now (what the launch job does right after a cycle)."""
    task.refresh_from_db()
    return reconcile.launch_object(intent(task).pk)


def schedule_and_launch(vdc_id: int, task: Task) -> Task:
    run_cycle(vdc_id)
    task.refresh_from_db()
    assert task.status == "scheduled", (task.pending_reason, task.pending_message)
    if launch(task) != task.cluster_id:
        # A transient backend error (a loaded machine, a slow slurmrestd): the reconciler retries the launch,
        # as beat does every few seconds.
        return wait_status(task, ("starting", "running"), timeout=60, step=0.5)
    task.refresh_from_db()
    return task


def run_until_running(task: Task) -> Task:
    """A just-submitted task on its way to running: the cycle and launch a worker would do, unless Celery (eager,
    under a live server) already did them on commit."""
    task.refresh_from_db()
    if task.status == "queued":
        run_cycle(task.vdc_id)
        task.refresh_from_db()
    if task.status == "scheduled":
        launch(task)
    return wait_status(task, "running")


def wait_command_started(task: Task, marker: str, timeout: float = 30.0) -> Task:
    """A running task once its command printed ``marker``: its sandbox is up, so a console can join it (a task is
    running as soon as its backend accepted the job, a moment before the job's command starts)."""
    executor, deadline = executor_for(task.cluster), time.monotonic() + timeout
    while marker not in executor.logs(task.external_id):
        if time.monotonic() > deadline:
            raise AssertionError(f"task {task.pk}'s command never printed {marker!r}")
        time.sleep(0.1)
    return task


def reconcile_all() -> list[reconcile.ReconcileResult]:
    """One reconciliation of every enabled cluster (what beat runs every few seconds)."""
    return [reconcile.reconcile_cluster(pk) for pk in Cluster.objects.filter(enabled=True).values_list("pk", flat=True)]


def wait_status(task: Task, statuses, timeout: float = 30.0, step: float = 0.2) -> Task:
    """Reconcile until the task reaches one of ``statuses``."""
    statuses = {statuses} if isinstance(statuses, str) else set(statuses)
    deadline = time.monotonic() + timeout
    while True:
        reconcile_all()
        task.refresh_from_db()
        if task.status in statuses:
            return task
        if time.monotonic() > deadline:
            events = list(task.events.values_list("kind", "message"))
            raise AssertionError(f"task {task.pk} stayed {task.status}, expected {statuses}; events: {events}")
        time.sleep(step)


def wait_objects_ended(cluster: Cluster, timeout: float = 30.0, step: float = 0.2) -> None:
    """Reconcile until the backend confirmed every object of the cluster gone."""
    deadline = time.monotonic() + timeout
    while BackendObject.objects.filter(cluster=cluster).exclude(state=ObjectState.ENDED).exists():
        if time.monotonic() > deadline:
            left = list(
                BackendObject.objects.filter(cluster=cluster)
                .exclude(state=ObjectState.ENDED)
                .values_list("name", "state", "message")
            )
            raise AssertionError(f"objects still on {cluster.name}: {left}")
        reconcile.reconcile_cluster(cluster.pk)
        time.sleep(step)
