"""LocalExecutor.instances(): each rank of a real job, with the CPU and memory its processes use."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from apps.clusters.executors.base import ExecutorError, JobPhase
from apps.clusters.executors.local import LocalExecutor

from .test_local import FINAL, wait_for, wait_for_log

# Rank 0 spins a core; rank 1 holds ~64 MiB of resident memory and idles.
GANG_COMMAND = (
    'echo "rank $HCS_RANK of $HCS_WORLD_SIZE at $HCS_MASTER_ADDR"; '
    'if [ "$HCS_RANK" = 0 ]; then while :; do :; done; '
    "else python3 -c 'import time; b = bytearray(64 << 20); b[::4096] = b\"x\" * (len(b) // 4096); time.sleep(600)'; fi"
)


@pytest.fixture
def executor(tmp_path):
    ex = LocalExecutor(tmp_path / "jobs", grace_period_s=1.0)
    yield ex
    for state in ex.list_by_owner({}):
        ex.kill(state.external_id)


def wait_for_instances(executor, job_id, ready, timeout=15.0):
    deadline = time.monotonic() + timeout
    while True:
        found = executor.instances(job_id)
        if ready(found) or time.monotonic() > deadline:
            return found
        time.sleep(0.1)


def test_a_two_instance_job_runs_two_ranks_each_with_its_own_figures(executor, make_spec):
    spec = make_spec(command=GANG_COMMAND, instances=2, cpu=1.0, memory_gib=1.0, secret_env={"API_TOKEN": "s3cr3t"})
    job_id = executor.submit(spec)
    wait_for_log(executor, job_id, "rank 1 of 2")
    log = wait_for_log(executor, job_id, "rank 0 of 2")
    assert "rank 0 of 2 at 127.0.0.1" in log and "rank 1 of 2 at 127.0.0.1" in log

    def measured(found):
        # Rank 1 passes 0.06 GiB while it is still touching its pages (busy): measured once it has gone to sleep.
        # Rank 0's first samples may come before its loop got the core (a loaded host): measured once it did.
        if len(found) != 2 or None in (found[0].cpu_used_cores, found[1].cpu_used_cores):
            return False
        busy, asleep = found[0].cpu_used_cores, found[1].cpu_used_cores
        return asleep < 0.3 and busy > max(0.1, 2 * asleep) and (found[1].memory_used_gib or 0) > 0.06

    rank0, rank1 = wait_for_instances(executor, job_id, measured, timeout=60)
    assert executor.status(job_id).phase == JobPhase.RUNNING
    assert [rank0.index, rank1.index] == [0, 1]
    assert rank0.name == f"{job_id}/rank-0" and rank1.name == f"{job_id}/rank-1"
    assert rank0.state == rank1.state == "running"
    # A busy loop measures about one core on an idle host, much less on a loaded one (CI shares 2 cores): it is
    # told apart from the sleeping rank by comparison, not by a fixed figure.
    assert rank0.cpu_used_cores > max(0.1, 2 * rank1.cpu_used_cores), (rank0, rank1)
    assert rank1.cpu_used_cores < 0.3, rank1  # asleep
    assert rank1.memory_used_gib > 0.06 and rank0.memory_used_gib < rank1.memory_used_gib
    assert rank0.node and rank0.ip and rank0.restarts == 0 and rank0.started_at is not None
    # Names of the secrets it was given, never their values.
    assert rank0.secrets == ("API_TOKEN",) and "s3cr3t" not in repr(rank0)


def test_a_rank_that_ends_first_shows_its_exit_while_the_other_runs(executor, make_spec):
    command = 'if [ "$HCS_RANK" = 1 ]; then exit 0; fi; sleep 600'
    job_id = executor.submit(make_spec(command=command, instances=2))
    found = wait_for_instances(
        executor, job_id, lambda f: len(f) == 2 and f[1].state != "running" and f[0].state == "running", timeout=10
    )
    assert found[0].state == "running" and found[1].state in ("exited", "exited 0"), found
    assert found[1].cpu_used_cores is None and found[1].usage_note
    time.sleep(1)
    assert executor.status(job_id).phase == JobPhase.RUNNING  # a rank that succeeds stops nobody
    executor.stop(job_id)
    state = wait_for(executor, job_id, FINAL)
    assert state.phase == JobPhase.CANCELLED
    # Rank 0 was stopped by TERM (the shell reports 128 + 15), rank 1 had exited 0 by itself.
    assert [i.state for i in executor.instances(job_id)] == ["exited 143", "exited 0"]


def test_a_failing_rank_stops_the_other_ranks_and_fails_the_job(executor, make_spec):
    # Rank 1 fails at once; ranks 0 and 2 would wait forever, as ranks of a distributed job wait in a collective
    # for a peer that is gone. Like Slurm's --kill-on-bad-exit, the gang ends.
    command = 'if [ "$HCS_RANK" = 1 ]; then sleep 1; exit 3; fi; sleep 600'
    started = time.monotonic()
    job_id = executor.submit(make_spec(command=command, instances=3))
    deadline = time.monotonic() + 10
    while len(_sleepers(job_id)) < 2:  # the check below can see the other ranks' processes
        assert time.monotonic() < deadline, "ranks 0 and 2 did not start"
        time.sleep(0.05)
    state = wait_for(executor, job_id, FINAL, timeout=30)
    assert time.monotonic() - started < 20  # the stop's grace (1 s here), not the 600 s
    assert (state.phase, state.exit_code) == (JobPhase.FAILED, 3)
    assert state.message == "rank 1 failed with exit code 3; the other ranks were stopped"
    assert [i.state for i in executor.instances(job_id)] == ["exited 143", "exited 3", "exited 143"]
    assert not _sleepers(job_id)  # nothing of the gang is left running


def _sleepers(job_id: str) -> list[str]:
    """Processes of this job (its HCS_JOB_DIR names the job) still running the test's `sleep 600`."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
                environ = (entry / "environ").read_bytes()
            except OSError:
                continue
            if cmdline.startswith("sleep 600") and f"/{job_id}/".encode() in environ:
                found.append(f"{entry.name}: {cmdline}")
    return found


def test_a_gang_exits_with_the_first_failing_rank(executor, make_spec):
    job_id = executor.submit(make_spec(command='[ "$HCS_RANK" = 1 ] && exit 5; exit 0', instances=2))
    state = wait_for(executor, job_id, FINAL)
    assert state.phase == JobPhase.FAILED and state.exit_code == 5
    assert state.message == "rank 1 failed with exit code 5; the other ranks were stopped"
    # Rank 0 ended by itself, or was stopped when rank 1 failed first.
    assert [i.state for i in executor.instances(job_id)] in (["exited 0", "exited 5"], ["exited 143", "exited 5"])


def test_a_single_instance_job_has_one_instance_and_none_once_unknown(executor, make_spec):
    job_id = executor.submit(make_spec(command="sleep 600"))
    (only,) = wait_for_instances(executor, job_id, lambda f: f and f[0].cpu_used_cores is not None)
    assert only.index == 0 and only.name == job_id and only.state == "running"
    assert only.memory_used_gib > 0
    assert executor.instances("hcs-task-0-1") == []
    with pytest.raises(ExecutorError):
        executor.instances("../etc")


def test_the_port_of_a_later_rank_is_refused_past_the_gang(executor, make_spec):
    job_id = executor.submit(make_spec(command="sleep 600", instances=2))
    wait_for_instances(executor, job_id, lambda f: all(i.state == "running" for i in f))
    with pytest.raises(ExecutorError, match="instances 0 to 1, not 2"):
        executor.port_endpoint(job_id, 2, 8080)
