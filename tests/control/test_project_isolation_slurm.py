"""Per-project accounts end to end on the real dev Slurm cluster (slurmdbd on the local MariaDB): a task of a
per-project cluster runs under its project's account, made by the portal with GrpTRES mirroring the quota, and a
quota save carries the new limit to Slurm."""

from __future__ import annotations

import os
import subprocess
import time
import uuid
from decimal import Decimal

import pytest

from apps.clusters.backends import executor_for
from tests.control import drive
from tests.control.conftest import api_submit

pytestmark = pytest.mark.slurm


@pytest.fixture
def per_project(slurm_world, slurm):
    """The dev cluster per project, with a prefix of its own so every run makes a fresh account."""
    cluster = slurm_world.slurm_cluster
    cluster.project_isolation = "per_project"
    cluster.isolation_prefix = f"t{uuid.uuid4().hex[:6]}-"
    cluster.save()
    slurm_world.account = f"{cluster.isolation_prefix}alpha"
    slurm_world.slurm_env = {**os.environ, "SLURM_CONF": slurm.conf}
    yield slurm_world
    subprocess.run(["scancel", "-A", slurm_world.account], capture_output=True, env=slurm_world.slurm_env, check=False)
    time.sleep(1)
    subprocess.run(
        ["sacctmgr", "-i", "delete", "account", slurm_world.account],
        capture_output=True,
        env=slurm_world.slurm_env,
        check=False,
    )


def grp_tres(world) -> str:
    rows = subprocess.run(
        ["sacctmgr", "-n", "-P", "show", "assoc", f"account={world.account}", "user=hcs", "format=user,grptres"],
        capture_output=True,
        text=True,
        env=world.slurm_env,
        check=True,
    ).stdout
    return next(line.split("|")[1] for line in rows.splitlines() if line.startswith("hcs|"))


def test_task_runs_under_its_project_account_with_the_quota_as_grp_tres(
    per_project, django_capture_on_commit_callbacks
):
    world = per_project
    task = api_submit(world, name="in-account", queue="high", gpu_spec="1(A100)", command="echo done")
    task = drive.schedule_and_launch(world.vdc.pk, task)
    drive.wait_status(task, {"completed"}, timeout=90, step=0.5)
    record = executor_for(task.cluster)._record(task.external_id)
    assert record["account"] == world.account
    sacct = subprocess.run(
        ["sacct", "-n", "-P", "-X", "-j", task.external_id, "-o", "account"],
        capture_output=True,
        text=True,
        env=world.slurm_env,
        check=True,
    ).stdout
    assert sacct.split() == [world.account]
    # The world's quota: 16 cores, 256 GiB, 32 GPU-equivalents = 80 cards at V100's 0.4 (the lowest rate here).
    assert grp_tres(world) == "cpu=16,gres/gpu=80,mem=256G"

    world.quota.limit_gpu, world.quota.limit_cpu = Decimal(4), Decimal(20)
    with django_capture_on_commit_callbacks(execute=True):  # Celery is eager here: the sync job runs now
        world.quota.save()
    assert grp_tres(world) == "cpu=20,gres/gpu=10,mem=256G"
