"""The Web Console on Slurm: an interactive step in the job's allocation (``srun --overlap --pty``), as the
job's user, against the real dev cluster (scripts/dev_slurm.sh)."""

from __future__ import annotations

import os
import time

import pytest

from apps.clusters.executors.base import ExecutorError, JobPhase
from apps.clusters.executors.slurm import SlurmExecutor, srun_terminal_argv


def test_the_step_joins_the_jobs_allocation_on_the_instances_node_as_the_jobs_user():
    argv = srun_terminal_argv(42, "hcs", "hcs-node-2", run_as_root=True)
    assert argv[:6] == ["setpriv", "--reuid=hcs", "--regid=hcs", "--init-groups", "--", "srun"]
    assert {"--jobid=42", "--overlap", "--pty", "--nodes=1", "--ntasks=1", "--nodelist=hcs-node-2"} <= set(argv)
    assert argv[-3:-1] == ["/bin/sh", "-c"] and "bash -i" in argv[-1]
    assert srun_terminal_argv(42, "hcs")[0] == "srun"  # a portal running as the jobs' user runs srun itself


@pytest.fixture
def slurm(slurm_cluster):
    executor = SlurmExecutor(**slurm_cluster.executor_kwargs(), slurm_conf=slurm_cluster.conf)
    jobs = []
    yield executor, jobs
    for job_id in jobs:
        executor.stop(job_id)


def read_until(terminal, needle: bytes, timeout: float = 30) -> bytes:
    seen = b""
    deadline = time.monotonic() + timeout
    while needle not in seen and time.monotonic() < deadline:
        seen += terminal.read(0.5) or b""
    return seen


@pytest.mark.slurm
@pytest.mark.skipif(os.geteuid() != 0, reason="srun runs as the dev cluster's job user: the test needs root")
def test_a_running_slurm_job_opens_a_shell_in_its_allocation(slurm, make_spec):
    executor, jobs = slurm
    job_id = executor.submit(make_spec(command="echo started; sleep 300"))
    jobs.append(job_id)
    deadline = time.monotonic() + 60
    while (state := executor.status(job_id)).phase != JobPhase.RUNNING:
        assert time.monotonic() < deadline, state
        time.sleep(0.3)

    terminal = executor.open_terminal(job_id, 0)
    try:
        terminal.write(b'echo "hcs-$((40+2)) user=$(id -un) job=$SLURM_JOB_ID"\r')
        seen = read_until(terminal, f"job={job_id}".encode())
        assert b"hcs-42 user=hcs " in seen and f"job={job_id}".encode() in seen, seen
    finally:
        terminal.close()
    assert executor.status(job_id).phase == JobPhase.RUNNING  # the shell's end leaves the job alone


@pytest.mark.slurm
def test_a_finished_slurm_job_has_no_terminal(slurm, make_spec):
    executor, jobs = slurm
    job_id = executor.submit(make_spec(command="true"))
    jobs.append(job_id)
    deadline = time.monotonic() + 60
    while executor.status(job_id).phase in (JobPhase.PENDING, JobPhase.RUNNING):
        assert time.monotonic() < deadline
        time.sleep(0.3)
    with pytest.raises(ExecutorError, match="not running"):
        executor.open_terminal(job_id)
