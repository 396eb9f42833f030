"""Fault injection against the real dev Slurm cluster: slurmrestd killed during a launch and under
a running task, a slurmd killed under a running task, a node marked down, a worker dying between submit and
write, a foreign job with the same labels. After each, the invariant checker compares Slurm and the database.

The loops are driven by hand (what beat and the worker do), so every step is visible in the test.
"""

from __future__ import annotations

import time
from dataclasses import replace

import pytest

from apps.clusters.backends import executor_for
from apps.clusters.executors.base import JobPhase
from apps.control import invariants
from apps.control.health import check_cluster_health
from apps.control.jobspec import job_spec
from apps.control.models import BackendObject, ObjectState
from apps.control.reconcile import reconcile_cluster
from apps.control.scheduling import run_cycle
from apps.tasks.models import Task
from tests.control import drive
from tests.control.conftest import api_submit
from tests.executors.slurm_cluster import (
    forget_all_jobs,
    kill_daemon,
    scontrol,
    start_dev_cluster,
)

pytestmark = pytest.mark.slurm


def slurm_jobs_of(cluster, task: Task) -> list:
    """Every job of the task's uid on Slurm that is still pending or running."""
    states = executor_for(cluster).list_by_owner({"hcs.io/task-uid": task.uid.hex})
    return [s for s in states if s.phase in (JobPhase.PENDING, JobPhase.RUNNING)]


def assert_consistent(world) -> None:
    problems = invariants.check([world.slurm_cluster])
    assert problems == [], [str(p) for p in problems]


def settle(world, timeout: float = 60.0) -> None:
    """Reconcile until every job the database no longer wants is confirmed gone."""
    deadline = time.monotonic() + timeout
    while True:
        reconcile_cluster(world.slurm_cluster.pk)
        left = BackendObject.objects.filter(cluster=world.slurm_cluster).exclude(state=ObjectState.ENDED)
        if all(o.wanted for o in left.select_related("task")):
            return
        assert time.monotonic() < deadline, list(left.values_list("name", "state", "message"))
        time.sleep(1)


def running_task(world, command="sleep 600", gpu="1(A100)") -> Task:
    task = api_submit(world, name="victim", queue="high", gpu_spec=gpu, command=command)
    task = drive.schedule_and_launch(world.vdc.pk, task)
    return drive.wait_status(task, "running", timeout=60, step=0.5)


def declare_unavailable(world) -> None:
    statuses = [check_cluster_health(world.slurm_cluster).status for _ in range(3)]
    assert statuses == ["degraded", "degraded", "unavailable"], statuses


def test_slurmrestd_down_under_a_running_task_leaves_one_job_for_the_task(slurm_world, restore_cluster):
    """The task is requeued, its job cancelled once Slurm answers, and only then a new attempt runs."""
    world = slurm_world
    task = running_task(world)
    first_job = task.external_id

    kill_daemon("slurmrestd")
    declare_unavailable(world)
    task.refresh_from_db()
    assert task.status == "preempted" and task.cluster is None
    assert "cancelled once the cluster answers" in task.events.filter(kind="requeued").last().message
    run_cycle(world.vdc.pk)
    task.refresh_from_db()
    assert (task.status, task.pending_reason) == ("preempted", "no_eligible_cluster")  # waits; never lost

    start_dev_cluster()  # slurmrestd is back
    cluster = check_cluster_health(world.slurm_cluster)
    assert cluster.status == "healthy" and "1 job(s) cancelled" in cluster.status_message
    run_cycle(world.vdc.pk)
    task.refresh_from_db()
    assert task.status == "scheduled" and task.attempt == 2
    settle(world)
    drive.launch(task)
    task = drive.wait_status(task, "running", timeout=60, step=0.5)

    assert [s.external_id for s in slurm_jobs_of(world.slurm_cluster, task)] == [task.external_id]
    assert task.external_id != first_job
    assert executor_for(world.slurm_cluster).status(first_job).phase == JobPhase.CANCELLED
    assert_consistent(world)
    messages = " ".join(task.events.values_list("message", flat=True))
    assert f"Cancelling job {first_job}" in messages


def test_a_task_submitted_during_an_outage_waits_and_runs_when_slurm_is_back(slurm_world, restore_cluster):
    """No 'Backend error after 5 retries': the submission waits with the reason and then runs."""
    world = slurm_world
    kill_daemon("slurmrestd")
    task = api_submit(world, name="early", queue="high", gpu_spec="1(A100)", command="echo made it")
    run_cycle(world.vdc.pk)  # the cluster is still healthy in the database: it is placed there
    task.refresh_from_db()
    assert task.status == "scheduled"
    for _ in range(7):  # more tries than the old limit, each failing fast
        BackendObject.objects.filter(task=task).update(lease_until=None)
        assert drive.launch(task) is None
    task.refresh_from_db()
    assert task.status == "scheduled" and "cannot reach slurmrestd" in task.status_message

    declare_unavailable(world)
    task.refresh_from_db()
    assert task.status == "preempted"
    start_dev_cluster()
    assert check_cluster_health(world.slurm_cluster).status == "healthy"
    run_cycle(world.vdc.pk)
    task.refresh_from_db()
    settle(world)
    drive.launch(task)
    task = drive.wait_status(task, "completed", timeout=60, step=0.5)

    kinds = list(task.events.values_list("kind", flat=True))
    assert "failed" not in kinds and kinds.count("backend_error") == 1 and "requeued" in kinds
    assert "made it" in executor_for(world.slurm_cluster).logs(task.external_id)
    assert_consistent(world)


def test_a_slurmd_killed_under_a_running_task_requeues_it_by_the_portals_rules(slurm_world, restore_cluster):
    """Slurm restarts the job by itself and marks the node down; the portal requeues the
    task as a new attempt elsewhere, the restarted job is cancelled and the first run's log stays."""
    world = slurm_world
    task = running_task(world, command='echo "run ${SLURM_RESTART_COUNT:-0} started"; sleep 600')
    node = task.placement[0]["node_name"]
    first_job = task.external_id
    restore_cluster.append(node)

    kill_daemon(f"slurmd-{node}")
    deadline = time.monotonic() + 90
    while not task.events.filter(kind="requeued").exists() and time.monotonic() < deadline:
        check_cluster_health(world.slurm_cluster)
        reconcile_cluster(world.slurm_cluster.pk)
        time.sleep(1)
    task.refresh_from_db()
    assert task.status == "preempted", list(task.events.values_list("message", flat=True))
    requeue = task.events.get(kind="requeued").message
    # Whichever sees the loss first names it: the health check (the node is down or restarted) or reconciliation
    # (Slurm ended the job with NODE_FAIL).
    assert "down" in requeue or "restarted" in requeue or "node failure" in requeue, requeue

    run_cycle(world.vdc.pk)
    task.refresh_from_db()
    assert task.status == "scheduled" and task.placement[0]["node_name"] != node  # not on the dead node
    settle(world)
    drive.launch(task)
    task = drive.wait_status(task, "running", timeout=60, step=0.5)
    assert [s.external_id for s in slurm_jobs_of(world.slurm_cluster, task)] == [task.external_id]
    assert executor_for(world.slurm_cluster).status(first_job).phase in (JobPhase.CANCELLED, JobPhase.LOST)
    output = executor_for(world.slurm_cluster).logs(first_job)
    assert "run 0 started" in output  # the first run's log was not overwritten by a restart
    assert_consistent(world)


def test_a_node_marked_down_takes_no_placements_and_requeues_its_tasks(slurm_world, restore_cluster):
    """Node state flows into the snapshot at every health check."""
    world = slurm_world
    task = running_task(world)
    node = task.placement[0]["node_name"]
    restore_cluster.append(node)

    # Its slurmd is gone (so it cannot register back) and an operator marks it down at once.
    kill_daemon(f"slurmd-{node}")
    for _ in range(10):
        scontrol("update", f"nodename={node}", "state=down", "reason=hcs-fault-test")
        # A reply the slurmd sent just before it died can still return the node to service ("node_did_resp:
        # node ... returned to service" in slurmctld's log, when an earlier test had just restarted that slurmd).
        time.sleep(1)
        shown = scontrol("show", "node", node)
        if "State=DOWN" in shown and "Reason=hcs-fault-test" in shown:
            break
    # A health check that reaches the backend and sees the node down requeues its tasks. A check whose probe fails
    # leaves the cluster degraded for that pass, and the next one counts: the checks go on, as beat's do, until the
    # task is requeued.
    deadline = time.monotonic() + 30
    checks = 0
    while True:
        cluster = check_cluster_health(world.slurm_cluster)
        checks += 1
        task.refresh_from_db()
        if (cluster.status == "healthy" and task.status == "preempted") or time.monotonic() > deadline:
            break
        time.sleep(1)
    status = (cluster.status, cluster.status_message, f"{checks} health checks")
    assert task.status == "preempted" and f"Node {node}" in task.status_message, status
    assert "hcs-fault-test" in task.status_message
    fresh = [
        api_submit(world, name=f"after-{i}", queue="high", gpu_spec="8(A100)", command="sleep 1") for i in range(2)
    ]
    run_cycle(world.vdc.pk)
    placed = [Task.objects.get(pk=t.pk) for t in (*fresh, task)]
    nodes = [t.placement[0]["node_name"] for t in placed if t.status == "scheduled"]
    assert node not in nodes and nodes  # placed, but never on the down node
    settle(world)
    assert_consistent(world)


def test_worker_death_between_submit_and_write_is_adopted_and_a_foreign_job_is_not(slurm_world, monkeypatch):
    """The reconciler matches on installation, task uid and attempt, never on task id alone."""
    world = slurm_world
    task = api_submit(world, name="crashy", queue="high", gpu_spec="1(A100)", command="sleep 600")
    run_cycle(world.vdc.pk)
    task.refresh_from_db()
    executor = executor_for(world.slurm_cluster)
    # Another portal (or an older database) runs a job with this task's id and attempt.
    foreign = job_spec(task, "e" * 32)
    foreign = replace(foreign, labels={**foreign.labels, "hcs.io/task-uid": "b" * 32})
    foreign_id = executor.submit(foreign)

    real_submit = type(executor).submit

    def submit_then_die(self, spec, **kwargs):
        real_submit(self, spec, **kwargs)
        raise SystemExit("worker killed after slurmrestd accepted the job")

    monkeypatch.setattr(type(executor), "submit", submit_then_die)
    with pytest.raises(SystemExit):
        drive.launch(task)
    monkeypatch.undo()
    BackendObject.objects.filter(task=task).update(lease_until=None)  # the dead worker's lease ran out

    result = reconcile_cluster(world.slurm_cluster.pk)

    task.refresh_from_db()
    assert result.adopted == 1 and result.launched == 0
    assert task.external_id and task.external_id != foreign_id
    assert task.events.filter(message__contains="by reconciliation").exists()
    assert len(slurm_jobs_of(world.slurm_cluster, task)) == 1
    assert executor.status(foreign_id).phase in (JobPhase.PENDING, JobPhase.RUNNING)  # not ours: untouched
    executor.stop(foreign_id)
    drive.wait_status(task, "running", timeout=60, step=0.5)
    assert_consistent(world)


def test_a_job_that_ended_while_nobody_looked_is_followed_from_accounting_not_run_again(slurm_world, restore_cluster):
    """The job ends while no reconciler runs (the workers were down), and slurmctld then forgets it (its state lost
    here; on a busy cluster MinJobAge passes): the portal reads how it ended from Slurm accounting. Before, the
    listing's silence made it "lost" and the finished task ran a second time."""
    world = slurm_world
    task = running_task(world, command="sleep 2; echo finished once")
    executor = executor_for(world.slurm_cluster)
    deadline = time.monotonic() + 60
    while executor.status(task.external_id).phase != JobPhase.SUCCEEDED:  # seen on Slurm, not by the portal
        assert time.monotonic() < deadline
        time.sleep(0.5)
    obj = BackendObject.objects.get(task=task)
    while executor.final_state(task.external_id, obj.name, obj.submitted_at.timestamp()) is None:
        assert time.monotonic() < deadline, "Slurm accounting never recorded the end"  # slurmdbd writes a moment later
        time.sleep(0.5)
    forget_all_jobs()
    start_dev_cluster()
    assert executor.status(task.external_id).phase == JobPhase.LOST  # slurmctld no longer knows it

    result = reconcile_cluster(world.slurm_cluster.pk)
    task.refresh_from_db()
    assert (task.status, task.attempt) == ("completed", 1), task.status_message
    assert "requeued" not in task.events.values_list("kind", flat=True)
    obj.refresh_from_db()
    assert obj.state == ObjectState.ENDED and "accounting" in obj.message, obj.message
    assert result.ended == 1 and not result.errors
    run_cycle(world.vdc.pk)
    assert slurm_jobs_of(world.slurm_cluster, task) == []  # nothing runs it again
    assert_consistent(world)
