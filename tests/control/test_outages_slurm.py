"""Backends as they really behave, on the real dev Slurm cluster: an unreachable slurmrestd says nothing about the
jobs (running tasks are unknown, not requeued), a job is followed by the id recorded at launch (a look-alike is
reported, not followed), and a rerun of work that may still run waits until the old run is fenced.

Each test counts what the issue counted (tasks requeued, jobs cancelled, completed work rerun, runs overlapping)
and asserts the counts, so a failure says how many.
"""

from __future__ import annotations

import time
from dataclasses import replace
from pathlib import Path

import pytest

from apps.clusters.backends import executor_for
from apps.clusters.executors.base import JobPhase
from apps.clusters.executors.slurm import FENCE_S
from apps.control.health import check_cluster_health
from apps.control.jobspec import job_spec
from apps.control.models import BackendObject, Installation
from apps.control.reconcile import reconcile_cluster
from apps.control.scheduling import run_cycle
from apps.tasks.models import Task
from tests.control import drive
from tests.control.test_faults_slurm import assert_consistent, running_task
from tests.executors.slurm_cluster import kill_daemon, scontrol, start_dev_cluster

pytestmark = pytest.mark.slurm

# The outage the tests inject; the cluster's grace period is longer (the default is 300 s).
OUTAGE_S = 30
GRACE_S = 90


def counts(tasks: list[Task], first_jobs: dict[int, str]) -> dict[str, int]:
    """What an outage did to ``tasks``: requeued, their first jobs cancelled by the portal, completed ones run again."""
    for task in tasks:
        task.refresh_from_db()
    return {
        "requeued": sum(t.events.filter(kind="requeued").count() for t in tasks),
        "cancelled": sum(
            t.events.filter(message__startswith=f"Cancelling job {first_jobs[t.pk]}").count() for t in tasks
        ),
        "rerun": sum(t.attempt - 1 for t in tasks),
    }


def slurm_state(job_id: str) -> str:
    """The job's state as slurmctld tells it (scontrol over munge: works while slurmrestd is down)."""
    shown = scontrol("-o", "show", "job", job_id)
    return shown.split("JobState=", 1)[1].split()[0]


def test_a_slurmrestd_outage_shorter_than_the_grace_period_leaves_running_work_alone(slurm_world, restore_cluster):
    """Running tasks become unknown (still holding their cards), nothing is requeued or cancelled, and a job that
    completed during the outage is completed once slurmrestd answers, never run again."""
    world = slurm_world
    world.slurm_cluster.unknown_grace_s = GRACE_S
    world.slurm_cluster.save(update_fields=["unknown_grace_s"])
    long = [running_task(world, command="sleep 600") for _ in range(3)]
    short = running_task(world, command="sleep 6; echo finished once")
    tasks = [*long, short]
    first_jobs = {t.pk: t.external_id for t in tasks}
    held = {t.pk: t.allocated_gpu for t in tasks}
    assert check_cluster_health(world.slurm_cluster).status == "healthy"  # its last answer, where the grace starts

    kill_daemon("slurmrestd")
    started = time.monotonic()
    statuses = [check_cluster_health(world.slurm_cluster).status for _ in range(3)]
    assert statuses == ["degraded", "degraded", "unavailable"], statuses
    for task in tasks:
        task.refresh_from_db()
        assert (task.status, task.allocated_gpu, task.external_id) == ("unknown", held[task.pk], first_jobs[task.pk])
    while time.monotonic() - started < OUTAGE_S:  # what beat does meanwhile
        check_cluster_health(world.slurm_cluster)
        assert not reconcile_cluster(world.slurm_cluster.pk).reachable
        run_cycle(world.vdc.pk)
        time.sleep(2)
    assert slurm_state(short.external_id) == "COMPLETED"  # it ended during the outage
    assert [t.status for t in Task.objects.filter(pk__in=[t.pk for t in tasks])] == ["unknown"] * 4

    start_dev_cluster()  # slurmrestd answers again
    cluster = check_cluster_health(world.slurm_cluster)
    assert cluster.status == "healthy", cluster.status_message
    assert counts(tasks, first_jobs) == {"requeued": 0, "cancelled": 0, "rerun": 0}
    assert [t.status for t in long] == ["running"] * 3
    assert short.status == "completed" and short.exit_code == 0
    assert all(slurm_state(first_jobs[t.pk]) == "RUNNING" for t in long)
    assert "answers again" in long[0].events.last().message
    assert_consistent(world)


def test_a_look_alike_job_is_reported_not_followed(slurm_world):
    """A second job with a copy of a live task's name, labels and launch token (submitted as the same Slurm user) runs
    and completes: the task keeps following the job whose id it recorded, and its timeline reports the copy."""
    world = slurm_world
    task = running_task(world, command="sleep 600")
    executor = executor_for(world.slurm_cluster)
    obj = BackendObject.objects.get(task=task, attempt=task.attempt)
    copy = job_spec(task, Installation.current().uid.hex, launch_token=obj.launch_token)
    copy = replace(copy, command="sleep 4; exit 0")
    copy_id = executor.submit(copy, fresh=True)
    deadline = time.monotonic() + 60
    while executor.status(copy_id).phase != JobPhase.SUCCEEDED:
        drive.reconcile_all()
        assert time.monotonic() < deadline
        time.sleep(0.5)
    drive.reconcile_all()
    task.refresh_from_db()
    following = int(task.external_id == copy_id or task.status != "running")
    assert following == 0, (task.status, task.external_id, copy_id)
    assert task.events.filter(kind="backend_error", message__contains=f"Job {copy_id} ").count() == 1
    assert executor.status(task.external_id).phase == JobPhase.RUNNING


def beats(path: Path) -> list[float]:
    return [float(line) for line in path.read_text().split()] if path.exists() else []


def test_a_rerun_after_a_killed_slurmd_overlaps_the_old_run_by_at_most_the_fence_interval(
    slurm_world, slurm, restore_cluster
):
    """The slurmd under a running job dies (its job's processes live on): Slurm ends the job (no requeue), the portal
    reruns the task elsewhere once Slurm confirmed the old job ended, and the old run's watchdog ends its processes:
    the two runs overlap by at most FENCE_S seconds (docs/slurm.md, "Fencing")."""
    world = slurm_world
    out = Path(slurm.output_dir) / f"fence-{time.time_ns()}"
    command = f"while true; do date +%s.%N >> {out}-$HCS_ATTEMPT; sleep 0.5; done"
    task = running_task(world, command=command)
    node = task.placement[0]["node_name"]
    restore_cluster.append(node)
    # The job asks Slurm for no requeue itself, as its script's first act (a moment after Slurm says it runs).
    deadline = time.monotonic() + 30
    while "Requeue=0" not in (shown := scontrol("show", "job", task.external_id)) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert "Requeue=0" in shown, shown

    kill_daemon(f"slurmd-{node}")
    deadline = time.monotonic() + 240
    while True:
        check_cluster_health(world.slurm_cluster)
        drive.reconcile_all()
        run_cycle(world.vdc.pk)
        task.refresh_from_db()
        if task.status == "scheduled":
            drive.launch(task)
        if task.attempt >= 2 and task.status == "running":
            break
        assert time.monotonic() < deadline, list(task.events.values_list("message", flat=True))
        time.sleep(1)
    time.sleep(FENCE_S + 3)
    old, new = beats(Path(f"{out}-1")), beats(Path(f"{out}-2"))
    assert old and new, (old[-3:], new[:3])
    overlap = max(0.0, old[-1] - new[0])
    assert overlap <= FENCE_S + 1, overlap
    assert time.time() - old[-1] > FENCE_S  # the old run has ended for good
    assert task.placement[0]["node_name"] != node
    assert "requeued" in task.events.values_list("kind", flat=True)
