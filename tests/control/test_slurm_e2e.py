"""End to end on the real dev Slurm cluster: API submit -> scheduler -> slurmrestd job -> completed;
preemption of a low gang by a high task cancels it in Slurm; a bad partition fails clearly, losing nothing."""

import time

import pytest

from apps.clusters.backends import executor_for
from apps.control.scheduling import run_cycle
from tests.control import drive
from tests.control.conftest import api_submit

pytestmark = pytest.mark.slurm


def wait_status(task, statuses, timeout=90.0):
    return drive.wait_status(task, statuses, timeout=timeout, step=0.5)


def schedule_and_launch(world, task):
    return drive.schedule_and_launch(world.vdc.pk, task)


def test_api_submission_runs_as_a_slurm_job_and_completes(slurm_world):
    task = api_submit(
        slurm_world,
        name="hello",
        queue="high",
        gpu_spec="2(A100)",
        command='echo "gpus=$CUDA_VISIBLE_DEVICES"; echo done',
    )
    task = schedule_and_launch(slurm_world, task)
    assert task.cluster == slurm_world.slurm_cluster and task.external_id
    assert task.placement[0]["node_name"] in ("hcs-node-1", "hcs-node-2")
    wait_status(task, {"completed"})
    assert "done" in executor_for(task.cluster).logs(task.external_id)
    assert list(task.events.values_list("kind", flat=True))[-1] == "completed"


def test_high_task_cancels_a_running_low_gang_in_slurm_and_requeues_it(slurm_world, django_capture_on_commit_callbacks):
    low = api_submit(slurm_world, name="batch", queue="low", gpu_spec="8(A100)", instances=2, command="sleep 300")
    low = schedule_and_launch(slurm_world, low)
    wait_status(low, {"running"})
    job_id = low.external_id
    high = api_submit(slurm_world, name="urgent", queue="high", gpu_spec="4(A100)", command="echo urgent")
    with django_capture_on_commit_callbacks(execute=True):
        run_cycle(slurm_world.vdc.pk)
    low.refresh_from_db()
    assert low.status == "suspended" and low.external_id == ""
    event = low.events.get(kind="suspended")
    assert event.data["by_task"] == high.pk and event.data["external_id"] == job_id
    state = executor_for(slurm_world.slurm_cluster).status(job_id)
    deadline = time.monotonic() + 30
    while state.phase.value not in ("cancelled", "preempted") and time.monotonic() < deadline:
        time.sleep(0.5)
        state = executor_for(slurm_world.slurm_cluster).status(job_id)
    assert state.phase.value == "cancelled"
    # The same cycle placed the high task in the room it made, and (Celery eager here) launched it.
    high.refresh_from_db()
    assert high.status in ("scheduled", "starting", "running") and high.cluster == slurm_world.slurm_cluster
    wait_status(high, {"completed"})


def test_bad_partition_fails_with_slurms_message_and_keeps_the_task(slurm_world):
    slurm_world.slurm_cluster.namespace = "nosuch"
    slurm_world.slurm_cluster.save()
    task = api_submit(slurm_world, name="lost", queue="high", gpu_spec="1(A100)", command="echo hi")
    run_cycle(slurm_world.vdc.pk)
    task.refresh_from_db()
    assert drive.launch(task) is None
    task.refresh_from_db()
    assert task.status == "failed"
    error = task.events.get(kind="backend_error")
    assert "partition" in error.message.lower()
    assert list(task.events.values_list("kind", flat=True)) == ["submitted", "scheduled", "backend_error"]


def test_nodes_and_gpus_are_imported_from_slurmrestd(slurm_world):
    from apps.clusters.services import import_slurm_nodes

    cluster = slurm_world.slurm_cluster
    cluster.nodes.all().delete()
    nodes = {n.name: n for n in import_slurm_nodes(cluster)}
    assert set(nodes) == {"hcs-node-1", "hcs-node-2", "hcs-node-3", "hcs-node-4"}
    assert [d.gpu_model.name for d in nodes["hcs-node-1"].devices.all()] == ["A100-80G"] * 8
    assert [d.gpu_model.name for d in nodes["hcs-node-4"].devices.all()] == ["V100-32G"] * 4


def test_a_failed_slurm_job_is_retried_as_a_new_attempt_by_the_tasks_retry_setting(slurm_world):
    # Only Kubernetes/Volcano retried failed jobs; a Slurm task failed at its first failed run.
    task = api_submit(
        slurm_world,
        name="flaky",
        queue="high",
        gpu_spec="1(A100)",
        max_retries=1,
        command='echo "attempt $HCS_ATTEMPT"; exit 7',
    )
    task = schedule_and_launch(slurm_world, task)
    first_job = task.external_id
    wait_status(task, {"queued"})
    assert task.events.get(kind="requeued").message == "Attempt 1 failed (exit code 7); retry 1 of 1"
    task = schedule_and_launch(slurm_world, task)
    assert task.attempt == 2 and task.external_id != first_job
    wait_status(task, {"failed"})
    task.refresh_from_db()
    assert (task.exit_code, task.failure_reason) == (7, "exit_code")
    assert "attempt 2" in executor_for(task.cluster).logs(task.external_id)
