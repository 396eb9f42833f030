"""Idle autostop end to end on the local cluster, with a real dev environment process: its cards report idle, the
beat job records the minute and stops it, and the backend's job ends (docs/rules.md#idle-autostop)."""

from __future__ import annotations

import pytest
from django.utils import timezone

from apps.clusters.models import Device
from apps.control import jobs
from apps.tasks.models import TaskEvent, TaskUsageSample
from apps.tasks.services import submit_task
from tests.control.drive import run_until_running, wait_command_started, wait_objects_ended

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def local_jobs_dir(settings, tmp_path):
    settings.HCS_LOCAL_EXECUTOR_DIR = tmp_path / "local-jobs"


def test_an_idle_dev_environment_is_stopped_by_the_beat_job_and_its_job_ends(world):
    task = submit_task(
        world.member,
        project=world.project,
        queue="high",
        name="notebook",
        kind="dev_env",
        ide_type="jupyter",
        image="jupyter/base-notebook",
        gpu_spec="1(A100)",
        command="echo notebook-up; sleep 300",
        idle_stop_minutes=1,
        idle_stop_percent=10,
    )
    task = wait_command_started(run_until_running(task), "notebook-up")
    card_ids = [d["id"] for p in task.placement for d in p["devices"]]
    # What the node agent's report leaves on the card: fresh, and idle.
    world.node.last_report = timezone.now()
    world.node.save(update_fields=["last_report"])
    Device.objects.filter(pk__in=card_ids).update(utilization=2)

    jobs.record_task_usage()
    jobs.record_task_usage()  # run twice (a second beat tick, a redelivered job): one stop, one sample

    task.refresh_from_db()
    assert task.status == "stopped"
    assert TaskUsageSample.objects.filter(task=task).count() == 1
    [event] = TaskEvent.objects.filter(task=task, kind="stopped")
    assert event.message == "Stopped by idle autostop: idle for 1 min under 10% GPU"
    wait_objects_ended(world.cluster)  # the control plane cancelled the sandboxed process
