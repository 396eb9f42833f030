"""Execution on the local cluster: a scheduled task runs as a real process and its status follows."""

import time

import pytest

from apps.clusters.backends import executor_for
from apps.clusters.executors.base import ExecutorError
from apps.tasks import execution
from apps.tasks.models import Task
from apps.tasks.scheduling import run_cycle
from apps.tasks.services import stop_task, submit_task


@pytest.fixture(autouse=True)
def local_jobs_dir(settings, tmp_path):
    settings.HCS_LOCAL_EXECUTOR_DIR = tmp_path / "local-jobs"
    settings.CELERY_TASK_ALWAYS_EAGER = True


def scheduled(world, command, **fields):
    task = submit_task(world.member, project=world.project, queue="high", name="job", kind="training",
                       command=command, gpu_spec=fields.pop("gpu_spec", "1(A100)"), **fields)  # fmt: skip
    run_cycle(world.vdc.pk)
    task.refresh_from_db()
    assert task.status == "scheduled"
    return task


def wait_for(task, statuses, timeout=15.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        execution.sync_statuses()
        task.refresh_from_db()
        if task.status in statuses:
            return task
        time.sleep(0.2)
    raise AssertionError(f"task stayed {task.status}, expected {statuses}")


def test_scheduled_task_runs_as_a_process_and_completes(world):
    task = scheduled(world, 'echo "devices=$NVIDIA_VISIBLE_DEVICES"; echo done')
    external_id = execution.launch(task.pk, task.attempt)
    task.refresh_from_db()
    assert external_id and task.external_id == external_id and task.status == "starting"
    wait_for(task, {"completed"})
    logs = executor_for(task.cluster).logs(task.external_id)
    assert "done" in logs and "devices=" in logs
    kinds = list(task.events.values_list("kind", flat=True))
    assert kinds == ["submitted", "scheduled", "status", "started", "completed"]


def test_failing_command_marks_the_task_failed(world):
    task = scheduled(world, "exit 3")
    execution.launch(task.pk, task.attempt)
    wait_for(task, {"failed"})


def test_launch_is_idempotent_per_attempt(world):
    task = scheduled(world, "sleep 30")
    first = execution.launch(task.pk, task.attempt)
    Task.objects.filter(pk=task.pk).update(status="scheduled", external_id="")  # the write was lost
    second = execution.launch(task.pk, task.attempt)
    assert first == second
    assert len(executor_for(task.cluster).list_by_owner({"hcs.io/task-id": str(task.pk)})) == 1
    executor_for(task.cluster).stop(first)


def test_stale_launch_after_a_stop_does_nothing(world):
    task = scheduled(world, "sleep 30")
    stop_task(task, world.member)
    assert execution.launch(task.pk, task.attempt) is None
    assert executor_for(world.cluster).list_by_owner({"hcs.io/task-id": str(task.pk)}) == []


def test_stop_of_a_running_task_stops_the_process(world, django_capture_on_commit_callbacks):
    task = scheduled(world, "sleep 30")
    execution.launch(task.pk, task.attempt)
    wait_for(task, {"running", "starting"})
    with django_capture_on_commit_callbacks(execute=True):
        stop_task(task, world.member, "no longer needed")
    state = executor_for(world.cluster).status(task.external_id)
    assert state.phase.value == "cancelled"


def test_health_check_keeps_a_local_cluster_healthy(world):
    cluster = execution.check_cluster_health(world.cluster)
    assert cluster.status == "healthy" and cluster.missed_heartbeats == 0 and cluster.last_heartbeat


def test_api_health_check_is_for_admins_and_updates_the_status(world):
    from rest_framework.test import APIClient  # noqa: PLC0415

    client = APIClient()
    client.force_authenticate(world.member)
    url = f"/api/v1/clusters/{world.cluster.pk}/health-check/"
    assert client.post(url).status_code == 403
    client.force_authenticate(world.admin)
    response = client.post(url)
    assert response.status_code == 200 and response.json()["status"] == "healthy"


def test_three_missed_health_checks_make_a_cluster_unavailable_and_requeue_its_tasks(world, monkeypatch):
    task = scheduled(world, "sleep 30")
    execution.launch(task.pk, task.attempt)
    executor = executor_for(world.cluster)

    def down():
        raise ExecutorError("base directory not writable")

    monkeypatch.setattr(executor, "health", down)
    statuses = [execution.check_cluster_health(world.cluster).status for _ in range(3)]
    assert statuses == ["degraded", "degraded", "unavailable"]
    task.refresh_from_db()
    assert task.status == "preempted" and task.cluster is None
    assert "unavailable" in task.events.get(kind="requeued").message
    monkeypatch.undo()
    executor.stop(task.events.get(kind="requeued").data["external_id"])


def test_worker_crash_between_submit_and_write_is_reconciled_without_a_duplicate(world, monkeypatch):
    task = scheduled(world, "sleep 30")
    executor = executor_for(task.cluster)
    real_submit = executor.submit

    def submit_then_crash(spec):
        real_submit(spec)
        raise SystemExit("worker killed after the backend call")

    monkeypatch.setattr(executor, "submit", submit_then_crash)
    with pytest.raises(SystemExit):
        execution.launch(task.pk, task.attempt)
    monkeypatch.undo()
    task.refresh_from_db()
    assert task.status == "scheduled" and task.external_id == ""

    Task.objects.filter(pk=task.pk).update(started_at=task.started_at - execution.RECONCILE_AFTER * 2)
    result = execution.sync_statuses()
    task.refresh_from_db()
    assert result.reconciled == 1
    assert task.status == "starting" and task.external_id
    assert len(executor.list_by_owner({"hcs.io/task-id": str(task.pk)})) == 1
    assert "reconciliation" in task.events.filter(kind="status").last().message
    executor.stop(task.external_id)


def test_retryable_backend_errors_are_retried_then_fail_with_the_message(world, monkeypatch):
    from celery_app.jobs import launch_task  # noqa: PLC0415

    task = scheduled(world, "echo hi")
    calls = []

    def flaky(task_id, attempt):
        calls.append(task_id)
        raise ExecutorError("slurmrestd HTTP 503: try later")

    monkeypatch.setattr(execution, "launch", flaky)
    monkeypatch.setattr(launch_task, "retry", _immediate_retry(launch_task))
    launch_task.apply(args=(task.pk, task.attempt))
    task.refresh_from_db()
    assert len(calls) == launch_task.max_retries + 1
    assert task.status == "failed"
    assert "503" in task.events.get(kind="backend_error").message


def _immediate_retry(job):
    """Celery's retry, minus the countdown wait, so the test sees every attempt in order."""
    real = job.retry

    def retry(*args, countdown=None, **kwargs):
        return real(*args, countdown=0, **kwargs)

    return retry


def test_sync_one_follows_a_just_launched_task(world):
    task = scheduled(world, "sleep 5")
    execution.launch(task.pk, task.attempt)
    deadline = time.monotonic() + 10
    while execution.sync_one(task.pk) != "running" and time.monotonic() < deadline:
        time.sleep(0.2)
    task.refresh_from_db()
    assert task.status == "running"
    executor_for(task.cluster).stop(task.external_id)
    assert execution.sync_one(999_999) is None
