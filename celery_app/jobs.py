"""Celery job functions: thin, they load by id and call a service."""

from __future__ import annotations

import contextlib
import logging

import redis
from django.conf import settings

from apps.clusters.executors.base import ExecutorError
from celery_app.app import app

log = logging.getLogger(__name__)

CYCLE_REQUESTED_KEY = "hcs:scheduler:cycle-requested"


def request_cycle() -> None:
    """Ask for a scheduling cycle soon; many requests within a cycle coalesce into one run."""
    try:
        client = redis.Redis.from_url(settings.REDIS_URL, socket_connect_timeout=1)
        if not client.set(CYCLE_REQUESTED_KEY, "1", nx=True, ex=10):
            return  # one is already on its way
    except redis.RedisError as exc:
        log.warning("cannot request a scheduling cycle (beat will run one): %s", exc)
        return
    run_scheduler.apply_async(countdown=0.2, expires=30)


@app.task(ignore_result=True)
def run_scheduler() -> None:
    """One scheduling cycle for every enabled VDC."""
    from apps.tasks.scheduling import run_all_cycles  # noqa: PLC0415 - Django must be set up first

    with contextlib.suppress(redis.RedisError):  # the flag only coalesces requests; the cycle runs regardless
        redis.Redis.from_url(settings.REDIS_URL, socket_connect_timeout=1).delete(CYCLE_REQUESTED_KEY)
    run_all_cycles()


@app.task(bind=True, ignore_result=True, max_retries=5)
def launch_task(self, task_id: int, attempt: int) -> None:
    """Submit a scheduled task to its backend; retried with exponential backoff, then failed."""
    from apps.tasks import execution  # noqa: PLC0415

    try:
        if execution.launch(task_id, attempt):
            # Users wait for "running": look again soon instead of at the next 5 s status sync.
            follow_launch.apply_async((task_id,), countdown=0.5, expires=60)
    except ExecutorError as exc:
        # Celery's retry() re-raises the error itself once retries run out, so count them here.
        if self.request.retries >= self.max_retries:
            execution.fail(task_id, attempt, f"Backend error after {self.max_retries} retries: {exc}")
            return
        raise self.retry(exc=exc, countdown=min(2**self.request.retries, 60))


@app.task(bind=True, ignore_result=True, max_retries=20)
def follow_launch(self, task_id: int) -> None:
    """Check a just-launched task every second until its backend reports it running (or 20 tries)."""
    from apps.tasks import execution  # noqa: PLC0415

    if execution.sync_one(task_id) in ("scheduled", "starting") and self.request.retries < self.max_retries:
        raise self.retry(countdown=1)


@app.task(bind=True, ignore_result=True, max_retries=5)
def stop_on_backend(self, task_id: int, cluster_id: int | None, external_id: str) -> None:
    """Stop a task's job on its backend (user stop or preemption); retried with backoff."""
    from apps.tasks import execution  # noqa: PLC0415

    try:
        execution.stop_job(cluster_id, external_id)
    except ExecutorError as exc:
        if not exc.retryable:
            log.warning("stop of task %s job %s refused: %s", task_id, external_id, exc)
            return
        raise self.retry(exc=exc, countdown=min(2**self.request.retries, 60))


@app.task(ignore_result=True)
def sync_task_statuses() -> None:
    """Bring active tasks' statuses in line with their backends."""
    from apps.tasks.execution import sync_statuses  # noqa: PLC0415

    sync_statuses()


@app.task(ignore_result=True)
def check_clusters() -> None:
    """Health-check every enabled cluster."""
    from apps.clusters.models import Cluster  # noqa: PLC0415
    from apps.tasks.execution import check_cluster_health  # noqa: PLC0415

    for cluster in Cluster.objects.filter(enabled=True):
        check_cluster_health(cluster)
