"""Execution on the local cluster: a placed task runs as a real process, its status follows, and the
reconciler keeps the backend and the database in line when workers, Redis or the backend fail."""

import base64
import json
import time
from datetime import timedelta

import pytest
from django.db import transaction
from django.test import Client
from django.utils import timezone

from apps.clusters.backends import executor_for
from apps.clusters.executors.base import ExecutorError, JobPhase
from apps.control import reconcile
from apps.control.health import check_cluster_health
from apps.control.jobspec import job_spec
from apps.control.models import BackendObject, Installation, ObjectState
from apps.control.scheduling import run_cycle
from apps.tasks.models import Task
from apps.tasks.services import requeue_task, stop_task, submit_task
from tests.api.base import client_for
from tests.control.drive import intent, launch, reconcile_all, wait_objects_ended, wait_status


@pytest.fixture(autouse=True)
def local_jobs_dir(settings, tmp_path):
    settings.HCS_LOCAL_EXECUTOR_DIR = tmp_path / "local-jobs"


def scheduled(world, command, **fields):
    fields.setdefault("name", "job")
    task = submit_task(
        world.member,
        project=world.project,
        queue="high",
        kind="training",
        command=command,
        gpu_spec=fields.pop("gpu_spec", "1(A100)"),
        **fields,
    )
    run_cycle(world.vdc.pk)
    task.refresh_from_db()
    assert task.status == "scheduled"
    return task


def test_scheduled_task_runs_as_a_process_and_completes(world):
    task = scheduled(world, 'echo "devices=$NVIDIA_VISIBLE_DEVICES"; echo done')
    assert launch(task) == world.cluster.pk
    task.refresh_from_db()
    assert task.external_id and task.status == "starting"
    wait_status(task, "completed")
    logs = executor_for(task.cluster).logs(task.external_id)
    assert "done" in logs and "devices=" in logs
    kinds = list(task.events.values_list("kind", flat=True))
    assert kinds == ["submitted", "scheduled", "status", "started", "completed"]
    assert intent(task).state == ObjectState.ENDED


def test_a_placement_writes_its_launch_intent_in_the_same_transaction(world):
    task = scheduled(world, "echo hi")
    obj = intent(task)
    assert (obj.state, obj.cluster_id, obj.task_uid, obj.external_id) == ("pending", world.cluster.pk, task.uid, "")
    assert obj.shares == [{"id": task.placement[0]["devices"][0]["id"], "milli": 1000}]


def test_the_reconciler_launches_a_placement_whose_launch_job_was_lost(world):
    task = scheduled(world, "sleep 30")  # the broker lost the launch job: only the intent is left
    reconcile_all()
    task.refresh_from_db()
    assert task.status == "starting" and task.external_id
    executor_for(task.cluster).kill(task.external_id)


def test_failing_command_marks_the_task_failed_with_its_exit_code(world, client):
    task = scheduled(world, "exit 3")
    launch(task)
    task = wait_status(task, "failed")
    assert (task.exit_code, task.failure_reason) == (3, "exit_code")
    body = client_for(world.viewer).get(f"/api/v1/tasks/{task.pk}/").data
    assert (body["exit_code"], body["failure_reason"]) == (3, "exit_code")
    assert client_for(world.viewer).get("/api/v1/tasks/", {"failure_reason": "exit_code"}).data["count"] == 1
    client.force_login(world.viewer)
    page = client.get(f"/task-monitoring/{task.pk}/").content.decode()
    assert '<dd data-field="exit_code">3</dd>' in page
    assert '<dd data-field="failure_reason">Its command exited with an error</dd>' in page
    # A task with a retry left is requeued after such a run; its next run has no exit code yet.
    retried = scheduled(world, "exit 3", name="retried", max_retries=1)
    launch(retried)
    retried = wait_status(retried, "queued")
    run_cycle(world.vdc.pk)
    retried.refresh_from_db()
    assert retried.attempt == 2 and retried.exit_code is None and retried.failure_reason == ""


def test_an_expected_duration_is_an_estimate_and_never_stops_the_job(world):
    task = scheduled(world, "sleep 3", expected_duration=timedelta(seconds=1))
    launch(task)
    assert wait_status(task, "completed", timeout=40).status_message != "wall-time limit reached"


def test_a_wall_time_limit_stops_the_job_and_says_so(world):
    task = scheduled(world, "sleep 60", wall_time=timedelta(seconds=2))
    launch(task)
    task = wait_status(task, "failed", timeout=40)
    assert "wall-time limit reached" in task.status_message
    assert task.failure_reason == "wall_time"


def test_the_queues_default_wall_time_applies_to_tasks_that_set_none(world):
    world.high.default_wall_time = timedelta(hours=4)
    world.high.save()
    task = scheduled(world, "true")
    assert task.wall_time == timedelta(hours=4)
    assert job_spec(task, Installation.current()).time_limit_s == 4 * 3600


def test_every_runs_log_stays_readable_through_the_api(world):
    task = scheduled(world, 'echo "run $HCS_ATTEMPT"; sleep 60')
    launch(task)
    wait_status(task, "running")
    api = client_for(world.viewer)  # anyone who may see the task may read its logs
    assert api.get(f"/api/v1/tasks/{task.pk}/logs/").data["attempts"] == 1
    with transaction.atomic():
        requeue_task(Task.objects.select_for_update().get(pk=task.pk), "node went down (test)")
    run_cycle(world.vdc.pk)
    task.refresh_from_db()
    launch(task)
    wait_status(task, "running")
    deadline = time.monotonic() + 20
    while "run 2" not in api.get(f"/api/v1/tasks/{task.pk}/logs/").data["text"]:
        assert time.monotonic() < deadline, "the second run never wrote its line"
        time.sleep(0.2)

    first = api.get(f"/api/v1/tasks/{task.pk}/logs/", {"attempt": 1}).data
    assert (first["attempt"], first["attempts"]) == (1, 2) and "run 1" in first["text"] and first["external_id"]
    assert api.get(f"/api/v1/tasks/{task.pk}/logs/", {"attempt": 3}).status_code == 400
    assert client_for(world.outsider).get(f"/api/v1/tasks/{task.pk}/logs/").status_code == 404
    # The page links every run; ?run=1 follows the first run's log instead of the latest.
    page = Client()
    page.force_login(world.viewer)
    latest = page.get(f"/task-monitoring/{task.pk}/").content.decode()
    assert '<a href="?run=1#logs">1</a>' in latest and "2 (latest)</strong>" in latest
    assert "data-log-attempt" not in latest
    earlier = page.get(f"/task-monitoring/{task.pk}/", {"run": "1"}).content.decode()
    assert 'data-log-attempt="1"' in earlier and "Log of run 1" in earlier
    assert "data-log-attempt" not in page.get(f"/task-monitoring/{task.pk}/", {"run": "9"}).content.decode()
    stop_task(task, world.member)
    reconcile_all()
    wait_objects_ended(world.cluster)


def test_launch_is_idempotent_per_attempt(world):
    task = scheduled(world, "sleep 30")
    first = launch(task)
    assert launch(task) is None  # already active: nothing to do
    BackendObject.objects.filter(pk=intent(task).pk).update(state=ObjectState.PENDING, external_id="")
    Task.objects.filter(pk=task.pk).update(status="scheduled", external_id="")  # the write was lost
    assert launch(task) == first
    task.refresh_from_db()
    executor = executor_for(task.cluster)
    assert len(executor.list_by_owner({"hcs.io/task-uid": task.uid.hex})) == 1
    executor.kill(task.external_id)


def test_stale_launch_after_a_stop_does_nothing(world):
    task = scheduled(world, "sleep 30")
    stop_task(task, world.member)
    assert launch(task) is None
    assert executor_for(world.cluster).list_by_owner({"hcs.io/task-uid": task.uid.hex}) == []
    reconcile_all()
    assert intent(task).state == ObjectState.ENDED and "never reached" in intent(task).message


def test_stop_of_a_running_task_is_carried_out_by_the_reconciler(world, django_capture_on_commit_callbacks):
    task = scheduled(world, "sleep 30")
    launch(task)
    wait_status(task, {"running", "starting"})
    stop_task(task, world.member, "no longer needed")
    wait_objects_ended(world.cluster)
    state = executor_for(world.cluster).status(task.external_id)
    assert state.phase == JobPhase.CANCELLED
    assert "Cancelling job" in task.events.filter(kind="status").last().message


def test_stop_during_a_redis_outage_is_carried_out_once_the_loops_run_again(world, settings):
    """The status commits, the hand-off is lost, and the job must still end."""
    task = scheduled(world, "sleep 60")
    launch(task)
    wait_status(task, {"running", "starting"})
    settings.REDIS_URL = "redis://127.0.0.1:1/0"  # nothing listens there: every trigger fails fast
    began = time.monotonic()
    stop_task(task, world.member)
    assert time.monotonic() - began < 5
    assert executor_for(world.cluster).status(task.external_id).phase == JobPhase.RUNNING
    # Meanwhile the scheduler keeps the card from anyone else until the old job is confirmed gone.
    other = submit_task(
        world.member,
        project=world.project,
        queue="high",
        kind="training",
        name="next",
        command="echo next",
        gpu_spec="8(A100)",
    )
    run_cycle(world.vdc.pk)
    other.refresh_from_db()
    assert other.status == "queued" and other.pending_reason == "insufficient_capacity"
    wait_objects_ended(world.cluster, timeout=20)  # what beat does once Redis is back
    assert executor_for(world.cluster).status(task.external_id).phase == JobPhase.CANCELLED
    run_cycle(world.vdc.pk)
    assert launch(other) == world.cluster.pk
    wait_status(other, "completed")


def test_health_check_keeps_a_local_cluster_healthy(world):
    cluster = check_cluster_health(world.cluster)
    assert cluster.status == "healthy" and cluster.missed_heartbeats == 0 and cluster.last_heartbeat
    assert "bubblewrap sandbox" in cluster.status_message


def test_api_health_check_is_for_admins_and_updates_the_status(world):
    from rest_framework.test import APIClient

    client = APIClient()
    client.force_authenticate(world.member)
    url = f"/api/v1/clusters/{world.cluster.pk}/health-check/"
    assert client.post(url).status_code == 403
    client.force_authenticate(world.admin)
    response = client.post(url)
    assert response.status_code == 200 and response.json()["status"] == "healthy"


def test_unavailable_cluster_requeues_its_tasks_and_cancels_their_jobs_when_it_is_back(world, monkeypatch):
    task = scheduled(world, "sleep 60")
    launch(task)
    wait_status(task, {"running", "starting"})
    job = intent(task)
    executor = executor_for(world.cluster)

    def down():
        raise ExecutorError("base directory not writable")

    monkeypatch.setattr(executor, "health", down)
    statuses = [check_cluster_health(world.cluster).status for _ in range(3)]
    assert statuses == ["degraded", "degraded", "unavailable"]
    task.refresh_from_db()
    assert task.status == "preempted" and task.cluster is None
    assert "cancelled once the cluster answers" in task.events.get(kind="requeued").message
    assert executor.status(job.external_id).phase == JobPhase.RUNNING  # unreachable: nothing could be done yet
    monkeypatch.undo()

    world.cluster.refresh_from_db()
    cluster = check_cluster_health(world.cluster)  # back: reconciled before it takes anything new
    assert cluster.status == "healthy" and "1 job(s) cancelled" in cluster.status_message
    wait_objects_ended(world.cluster)
    assert executor.status(job.external_id).phase == JobPhase.CANCELLED


def test_retryable_backend_errors_keep_the_task_waiting_with_the_reason(world, monkeypatch):
    """A transient outage never fails a submission; it waits and runs when the backend is back."""
    task = scheduled(world, "echo hi")
    executor = executor_for(world.cluster)
    real_submit = executor.submit
    calls = []

    def flaky(spec, **kwargs):
        calls.append(spec.name)
        raise ExecutorError("slurmrestd HTTP 503: try later")

    monkeypatch.setattr(executor, "submit", flaky)
    for _ in range(8):  # well past the old limit of 5 retries
        BackendObject.objects.filter(task=task).update(lease_until=None)
        launch(task)
    task.refresh_from_db()
    assert len(calls) == 8
    assert task.status == "scheduled" and "503" in task.status_message
    assert task.events.filter(kind="backend_error").count() == 1  # said once, not at every retry
    monkeypatch.setattr(executor, "submit", real_submit)
    BackendObject.objects.filter(task=task).update(lease_until=None)
    wait_status(task, "completed")


def test_refused_launch_fails_the_task_with_the_backends_message(world, monkeypatch):
    task = scheduled(world, "echo hi")
    executor = executor_for(world.cluster)

    def refuse(spec, **kwargs):
        raise ExecutorError("invalid partition specified: nosuch", retryable=False)

    monkeypatch.setattr(executor, "submit", refuse)
    launch(task)
    task.refresh_from_db()
    assert task.status == "failed" and "nosuch" in task.events.get(kind="backend_error").message
    assert intent(task).state == ObjectState.ENDED


def test_worker_crash_between_submit_and_write_is_adopted_without_a_duplicate(world, monkeypatch):
    task = scheduled(world, "sleep 30")
    executor = executor_for(task.cluster)
    real_submit = executor.submit

    def submit_then_crash(spec, **kwargs):
        real_submit(spec, **kwargs)
        raise SystemExit("worker killed after the backend call")

    monkeypatch.setattr(executor, "submit", submit_then_crash)
    with pytest.raises(SystemExit):
        launch(task)
    monkeypatch.undo()
    task.refresh_from_db()
    assert task.status == "scheduled" and task.external_id == ""

    BackendObject.objects.filter(task=task).update(lease_until=None)  # the dead worker's lease ran out
    result = reconcile.reconcile_cluster(world.cluster.pk)
    task.refresh_from_db()
    assert result.adopted == 1 and result.launched == 0
    assert task.status in ("starting", "running") and task.external_id
    assert len(executor.list_by_owner({"hcs.io/task-uid": task.uid.hex})) == 1
    assert "reconciliation" in task.events.filter(kind="status").last().message
    executor.kill(task.external_id)


def test_a_foreign_job_with_the_same_task_id_and_attempt_is_never_adopted(world, monkeypatch):
    """Another portal (or an older database) ran a job labelled like ours: match on identity."""
    from dataclasses import replace

    from apps.control.jobspec import job_spec

    task = scheduled(world, "sleep 30")
    executor = executor_for(task.cluster)
    foreign = job_spec(task, "f" * 32)
    foreign = replace(
        foreign,
        name=f"{foreign.name}-other",
        command="sleep 60",
        labels={**foreign.labels, "hcs.io/task-uid": "a" * 32},
    )
    executor.submit(foreign)

    result = reconcile.reconcile_cluster(world.cluster.pk)

    task.refresh_from_db()
    assert result.adopted == 0 and result.launched == 1 and result.untracked == 0
    assert task.external_id and task.external_id != foreign.name
    assert executor.status(foreign.name).phase == JobPhase.RUNNING  # not ours: left alone
    wait_status(task, {"running"})
    assert task.started_at >= task.submitted_at
    executor.kill(foreign.name)
    executor.kill(task.external_id)


def test_a_job_of_this_installation_that_no_attempt_owns_is_cancelled(world):
    task = scheduled(world, "sleep 60")
    launch(task)
    task.refresh_from_db()
    external_id = task.external_id
    # A database restored from before the placement: the task waits again and no object tracks the job.
    BackendObject.objects.filter(task=task).delete()
    Task.objects.filter(pk=task.pk).update(status="queued", attempt=0, cluster=None, placement=[], external_id="")

    result = reconcile.reconcile_cluster(world.cluster.pk)

    assert result.untracked == 1 and result.cancelled == 1
    assert "belongs to no live attempt" in task.events.filter(kind="status").last().message
    wait_objects_ended(world.cluster)
    assert executor_for(world.cluster).status(external_id).phase == JobPhase.CANCELLED


def test_ended_objects_are_forgotten_after_the_retention_and_live_ones_never(world):
    done = scheduled(world, "true")
    launch(done)
    wait_status(done, "completed")
    wait_objects_ended(world.cluster)
    running = scheduled(world, "sleep 60")
    launch(running)
    BackendObject.objects.filter(task=running).update(created_at=timezone.now() - timedelta(days=90))
    BackendObject.objects.filter(task=done).update(ended_at=timezone.now() - timedelta(days=29))

    assert reconcile.prune_ended_objects(timedelta(days=30)) == 0
    BackendObject.objects.filter(task=done).update(ended_at=timezone.now() - timedelta(days=31))
    assert reconcile.prune_ended_objects(timedelta(days=30)) == 1

    assert not BackendObject.objects.filter(task=done).exists()
    assert BackendObject.objects.get(task=running).state == ObjectState.ACTIVE
    stop_task(running, world.member)
    reconcile_all()
    wait_objects_ended(world.cluster)


def test_a_job_that_vanished_is_lost_and_its_task_requeued(world):
    task = scheduled(world, "sleep 60")
    launch(task)
    wait_status(task, {"running"})
    executor = executor_for(world.cluster)
    executor.delete(task.external_id)  # e.g. the host was wiped
    reconcile_all()
    task.refresh_from_db()
    assert task.status == "preempted" and "lost by the backend" in task.status_message


def test_following_a_cluster_sees_its_fresh_jobs_start_with_status_calls_or_one_listing(world, monkeypatch):
    tasks = [scheduled(world, "sleep 30", name=f"job-{i}") for i in range(2)]
    for task in tasks:
        assert launch(task) == world.cluster.pk
    executor = executor_for(world.cluster)
    listings = []
    real_list = executor.list_by_owner
    monkeypatch.setattr(executor, "list_by_owner", lambda labels: listings.append(labels) or real_list(labels))
    deadline = time.monotonic() + 10
    while reconcile.follow_cluster(world.cluster.pk) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert [Task.objects.get(pk=t.pk).status for t in tasks] == ["running", "running"]
    assert listings == []  # two jobs: a status call each, not a listing of the cluster
    assert reconcile.follow_cluster(world.cluster.pk) == 0

    many = [scheduled(world, "sleep 30", name=f"many-{i}", gpu_spec="") for i in range(6)]
    for task in many:
        launch(task)
    reconcile.follow_cluster(world.cluster.pk)
    assert len(listings) == 1  # six at once: one listing
    for task in (*tasks, *many):
        task.refresh_from_db()
        executor.kill(task.external_id)


def test_check_backends_reports_what_breaks_the_invariants(world, capsys):
    from django.core.management import CommandError, call_command

    task = scheduled(world, "sleep 60")
    launch(task)
    call_command("check_backends")
    assert "backends and database agree" in capsys.readouterr().out

    BackendObject.objects.filter(task=task).delete()  # the job is now tracked by nothing
    with pytest.raises(CommandError, match="2 problem"):
        call_command("check_backends")
    out = capsys.readouterr().out
    assert "untracked job" in out and "lost submission" in out  # and its active task has no job on record
    task.refresh_from_db()
    executor_for(world.cluster).kill(task.external_id)


def test_jobs_on_a_cluster_disabled_meanwhile_are_still_followed(world, monkeypatch):
    from apps.control import jobs

    task = scheduled(world, "sleep 60")
    launch(task)
    world.cluster.enabled = False
    world.cluster.save()
    queued = []
    monkeypatch.setattr(jobs.reconcile_cluster, "apply_async", lambda args, **kw: queued.append(args[0]))
    jobs.reconcile_all()
    assert queued == [world.cluster.pk]
    task.refresh_from_db()
    executor_for(world.cluster).kill(task.external_id)


def test_a_log_follower_reads_every_line_once_from_before_the_start_to_the_end(world):
    command = 'for n in 1 2 3 4 5 6; do echo "line $n"; sleep 0.6; done'
    task = submit_task(
        world.member,
        project=world.project,
        queue="high",
        kind="training",
        name="counter",
        command=command,
        gpu_spec="1(A100)",
    )
    api = client_for(world.viewer)
    url = f"/api/v1/tasks/{task.pk}/logs/"
    body = api.get(url).data
    assert (body["attempt"], body["running"], body["status"], body["text"]) == (0, True, "queued", "")
    run_cycle(world.vdc.pk)
    body = api.get(url, {"after": body["cursor"]}).data
    assert body["attempt"] == 1 and body["running"] and "never reached a backend" in body["note"]
    launch(task)
    pieces, deadline = [], time.monotonic() + 40
    while body["running"] or body["more"]:
        assert time.monotonic() < deadline, f"the follower never saw the run end: {body}"
        reconcile_all()  # what beat does every 2 s
        body = api.get(url, {"after": body["cursor"]}).data
        pieces.append(body["text"])
        time.sleep(0.2)
    assert "".join(pieces) == "".join(f"line {n}\n" for n in range(1, 7))
    assert len([p for p in pieces if p]) >= 2, "the output should have come as it was written"
    assert (body["status"], body["running"], body["more"]) == ("completed", False, False)
    assert api.get(url, {"after": body["cursor"]}).data["text"] == ""
    assert api.get(url, {"tail": 2}).data["text"] == "line 5\nline 6\n"


def test_a_log_cursor_is_checked(world):
    task = scheduled(world, "echo one; echo two")
    launch(task)
    wait_status(task, "completed")
    api = client_for(world.member)
    url = f"/api/v1/tasks/{task.pk}/logs/"
    cursor = api.get(url, {"tail": 1}).data["cursor"]
    assert api.get(url, {"after": cursor}).data["text"] == ""
    assert api.get(url, {"after": "not-a-cursor"}).status_code == 400
    forged = base64.urlsafe_b64encode(json.dumps([1, "{}"]).encode()).decode()
    assert api.get(url, {"after": forged}).json() == {
        "after": ["Expected the cursor of an earlier answer (its `cursor` field)."]
    }
    assert api.get(url, {"after": cursor, "attempt": 2}).status_code == 400
    assert client_for(world.outsider).get(url, {"after": cursor}).status_code == 404


def test_a_failed_run_is_retried_as_a_new_attempt_by_the_tasks_retry_setting(world, client):
    # Only Kubernetes/Volcano retried failed jobs (the backend does it); local and Slurm tasks failed at once.
    task = scheduled(world, 'echo "run $HCS_ATTEMPT"; exit 3', max_retries=1)
    launch(task)
    task = wait_status(task, "queued")
    retry = task.events.get(kind="requeued")
    assert retry.message == "Attempt 1 failed (exit code 3); retry 1 of 1"
    assert retry.data["retry"] == 1 and retry.data["exit_code"] == 3 and retry.from_status in ("starting", "running")
    assert (task.exit_code, task.failure_reason, task.finished_at) == (None, "", None)  # the task did not end
    run_cycle(world.vdc.pk)
    task.refresh_from_db()
    assert task.status == "scheduled" and task.attempt == 2
    launch(task)
    task = wait_status(task, "failed")  # the retry is used up: the second failure is final
    assert (task.exit_code, task.failure_reason) == (3, "exit_code")
    assert list(task.events.filter(kind__in=("requeued", "failed")).values_list("kind", flat=True)) == [
        "requeued",
        "failed",
    ]
    body = client_for(world.viewer).get(f"/api/v1/tasks/{task.pk}/").data
    assert [e["kind"] for e in body["events"]].count("scheduled") == 2  # each attempt on the timeline


def test_a_task_without_retries_fails_on_the_first_failed_run(world):
    task = scheduled(world, "exit 4")
    launch(task)
    task = wait_status(task, "failed")
    assert task.attempt == 1 and not task.events.filter(kind="requeued").exists()


def test_a_dev_environment_whose_ide_is_not_installed_fails_at_once_and_stops_billing(world, client):
    """The default Jupyter dev environment on a host without Jupyter: the task fails with a message saying what is
    missing and how an admin installs it, it is final, and metering an hour later accrues nothing more."""
    from apps.billing.models import UsageRecord
    from apps.billing.services import meter_usage, seed_demo_prices

    seed_demo_prices()
    task = submit_task(
        world.member,
        project=world.project,
        queue="high",
        kind="dev_env",
        name="notebook",
        command="",
        gpu_spec="1(A100)",
        env={"PATH": "/nonexistent:/usr/bin:/bin"},  # no jupyter on this PATH, whatever the host has
    )
    run_cycle(world.vdc.pk)
    launch(task)
    task = wait_status(task, "failed")
    assert task.failure_reason == "launch_failed"
    assert task.status_message.startswith("jupyter is not installed on the cluster's host"), task.status_message
    assert "python3 -m pip install jupyterlab" in task.status_message
    assert intent(task).state == ObjectState.ENDED

    meter_usage()
    billed = sorted(UsageRecord.objects.filter(task=task).values_list("quantity", flat=True))
    meter_usage(timezone.now() + timedelta(hours=1))
    assert sorted(UsageRecord.objects.filter(task=task).values_list("quantity", flat=True)) == billed
    task.meter.refresh_from_db()
    assert task.meter.closed  # the run's final accrual is done: nothing accrues after it

    client.force_login(world.member)
    page = client.get(f"/task-monitoring/{task.pk}/").content.decode().replace("&#x27;", "'")
    assert "jupyter is not installed on the cluster's host" in page
    assert "data-connect" not in page
