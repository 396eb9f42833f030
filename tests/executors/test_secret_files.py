"""Secret files of a job (JobSpec.secret_files): owner-only, in the job's own file tree, gone with the job.

Local jobs get them from bubblewrap in the sandbox's memory; Slurm jobs write them from their environment into
a private directory their batch script removes at the end (the script is run here by bash, as Slurm would).
"""

from __future__ import annotations

import hashlib
import json
import os
import pwd
import subprocess
import time
from pathlib import Path

import pytest

from apps.clusters.executors.base import ExecutorError, JobPhase
from apps.clusters.executors.local import LocalExecutor, _sandboxed_process
from apps.clusters.executors.slurm import SlurmExecutor

from .test_local import FINAL, wait_for

VALUE = "dataset-token-5e8a\nsecond line"


@pytest.fixture
def executor(tmp_path):
    ex = LocalExecutor(tmp_path / "jobs", grace_period_s=1.0)
    yield ex
    for state in ex.list_by_owner({}):
        ex.kill(state.external_id)


def test_a_local_job_reads_its_secret_files_owner_only_and_nobody_else_can(executor, make_spec):
    spec = make_spec(
        command='sha256sum < /run/secrets/token; stat -c "%a %u" /run/secrets/token /tmp/creds/key; '
        "(echo x >> /run/secrets/token) 2>/dev/null && echo writable; echo started; sleep 30",
        secret_files={"/run/secrets/token": VALUE, "/tmp/creds/key": "k"},
    )
    assert VALUE not in repr(spec)
    job = executor.submit(spec)
    deadline = time.monotonic() + 10
    while "started" not in executor.logs(job) and time.monotonic() < deadline:
        time.sleep(0.05)
    job_uid = pwd.getpwnam("hcs-job").pw_uid if os.geteuid() == 0 else os.geteuid()
    digest = hashlib.sha256(VALUE.encode()).hexdigest()
    assert executor.logs(job).splitlines()[:3] == [f"{digest}  -", f"400 {job_uid}", f"400 {job_uid}"]
    assert "writable" not in executor.logs(job)
    # Nowhere on the host's disk: not in the job's directory the portal keeps.
    for path in (executor.base_dir / job).rglob("*"):
        assert not path.is_file() or b"dataset-token" not in path.read_bytes(), path
    if os.geteuid() == 0:
        # Another unprivileged account cannot read it through the sandbox's root either.
        meta_pid = json.loads((executor.base_dir / job / "job.json").read_text())["pid"]
        inside = _sandboxed_process(meta_pid)
        assert inside is not None
        other = subprocess.run(
            [
                "setpriv",
                "--reuid=nobody",
                "--regid=nogroup",
                "--clear-groups",
                "cat",
                f"/proc/{inside}/root/run/secrets/token",
            ],
            capture_output=True,
            text=True,
            check=False,
        )
        assert other.returncode != 0 and "dataset-token" not in other.stdout
    executor.stop(job)
    assert wait_for(executor, job, FINAL, timeout=15.0).phase == JobPhase.CANCELLED


def test_a_training_job_gets_secret_files_in_tmp_and_beside_its_checkpoints(executor, make_spec):
    spec = make_spec(
        command='cat /tmp/key; echo; cat /workspace/token; echo; ls "$HCS_CHECKPOINT_DIR" | wc -l; df /tmp | tail -1',
        secret_files={"/tmp/key": "tmp-value", "/workspace/token": "beside-value"},
        settings={"checkpoint_path": "/workspace/ckpt"},
        task_uid="7" * 32,
    )
    job = executor.submit(spec)
    assert wait_for(executor, job, FINAL, timeout=15.0).phase == JobPhase.SUCCEEDED, executor.logs(job)
    lines = executor.logs(job).splitlines()
    assert lines[:3] == ["tmp-value", "beside-value", "0"]  # nothing of them in the checkpoint directory
    assert lines[3].startswith("tmpfs")  # /tmp stays the job's own, size-limited tmpfs


def test_a_secret_file_where_the_job_directory_lies_is_refused_with_the_reason(executor, make_spec, tmp_path):
    spec = make_spec(command="true", secret_files={str(tmp_path): "value"})  # the job's directory is under it
    with pytest.raises(ExecutorError, match=f"the secret file {tmp_path} cannot be placed") as refused:
        executor.submit(spec)
    assert refused.value.retryable is False
    assert not (executor.base_dir / spec.name).exists()


def test_every_rank_of_a_local_gang_reads_the_whole_secret_file(executor, make_spec):
    # Each rank's sandbox copies from its own descriptor: one shared descriptor would leave later ranks an
    # empty file (bubblewrap reads it to its end).
    spec = make_spec(command="sha256sum < /run/secrets/token", instances=2, secret_files={"/run/secrets/token": VALUE})
    job = executor.submit(spec)
    assert wait_for(executor, job, FINAL, timeout=15.0).phase == JobPhase.SUCCEEDED
    digest = hashlib.sha256(VALUE.encode()).hexdigest()
    assert executor.logs(job).splitlines() == [f"{digest}  -"] * 2


def test_a_slurm_job_carries_secret_files_in_its_environment_never_in_its_script(make_spec, tmp_path):
    spec = make_spec(
        command='cat "$HCS_SECRETS_DIR/token"; echo; stat -c "%a" "$HCS_SECRETS_DIR/token"; '
        'env | grep -c HCS_SECRET_FILE || true; echo "$HCS_SECRETS_DIR" > dir.txt',
        secret_files={"/run/secrets/token": VALUE},
        secret_env={"API_KEY": "k"},
    )
    description = SlurmExecutor("http://slurm.invalid", "jwt", "hcs").job_description(spec)
    assert description["job"]["environment"]["HCS_SECRET_FILE_0"] == VALUE
    assert description["job"]["environment"]["API_KEY"] == "k"
    assert "dataset-token" not in description["script"]
    # The batch script as the job's node runs it: with the submitted environment, in its working directory.
    script = tmp_path / "batch.sh"
    script.write_text(description["script"])
    env = {**description["job"]["environment"], "TMPDIR": str(tmp_path)}
    result = subprocess.run(
        ["bash", str(script)], env=env, cwd=tmp_path, capture_output=True, text=True, timeout=20, check=False
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == [*VALUE.splitlines(), "400", "0"]
    secrets_dir = Path((tmp_path / "dir.txt").read_text().strip())
    assert secrets_dir.parent == tmp_path and not secrets_dir.exists()


def test_a_cancelled_slurm_job_removes_its_secret_files(make_spec, tmp_path):
    spec = make_spec(command='echo "$HCS_SECRETS_DIR" > dir.txt; sleep 30', secret_files={"/run/key": "v"})
    description = SlurmExecutor("http://slurm.invalid", "jwt", "hcs").job_description(spec)
    script = tmp_path / "batch.sh"
    script.write_text(description["script"])
    env = {**description["job"]["environment"], "TMPDIR": str(tmp_path)}
    process = subprocess.Popen(["bash", str(script)], env=env, cwd=tmp_path, start_new_session=True)
    deadline = time.monotonic() + 10
    while not (tmp_path / "dir.txt").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    secrets_dir = Path((tmp_path / "dir.txt").read_text().strip())
    assert (secrets_dir / "key").read_text() == "v"
    os.killpg(process.pid, 15)  # scancel signals every process of the job
    assert process.wait(timeout=10) != 0
    assert not secrets_dir.exists()
