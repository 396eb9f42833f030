"""The sandbox holds when the portal itself runs as a normal user, not root (docs/local-jobs.md).

Then no dedicated job user can be switched to; bubblewrap's unprivileged user namespace alone must keep
the job from the portal's files, processes, environment and loopback services. The test runs a small
"portal" as an unprivileged user (the executor package only: it needs no Django) that starts one job.
"""

from __future__ import annotations

import json
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
from pathlib import Path

import pyseccomp
import pytest

EXECUTORS = Path(__file__).resolve().parents[2] / "apps" / "clusters" / "executors"
PORTAL_USER = "nobody"

DRIVER = r"""
import json, os, shlex, socket, sys, time
sys.path.insert(0, sys.argv[1])
from executors.base import ExecutorError, JobPhase, JobSpec
from executors.limits import Limits
from executors.local import LocalExecutor

home = sys.argv[2]
os.environ["DATABASE_URL"] = "postgres://portal:hunter2@db/portal"
(secret := os.path.join(home, "secret_key")) and open(secret, "w").write("portal-secret")
os.chmod(secret, 0o600)
server = socket.socket()
server.bind(("127.0.0.1", 0))
server.listen(1)
port = server.getsockname()[1]
probes = {
    "secret_key": f"cat {secret}",
    "portal_environ": f"cat /proc/{os.getpid()}/environ",
    "portal_process_listed": "grep -l executors.loca[l] /proc/[0-9]*/cmdline",
    "environment_inherited": "env | grep hunter2",
    "loopback_listener": f"bash -c 'exec 3<>/dev/tcp/127.0.0.1/{port}'",
}
script = 'probe() { if sh -c "$2" >/dev/null 2>&1; then echo "LEAK $1"; else echo "safe $1"; fi; }\n'
script += "\n".join(f"probe {name} {shlex.quote(check)}" for name, check in probes.items())
script += '\necho ok > "$HOME/f" && echo "control $(cat $HOME/f) uid=$(id -u)"\n'
script += 'echo saved > "$HCS_CHECKPOINT_DIR/state"\n'
try:  # a normal user cannot create cgroups here: jobs are refused, unless limits are off on purpose
    LocalExecutor(os.path.join(home, "refused"), grace_period_s=1).health()
    refusal = ""
except ExecutorError as exc:
    refusal = str(exc)
executor = LocalExecutor(os.path.join(home, "jobs"), grace_period_s=1, limits=Limits(cgroups=False))
executor.health()
uid = "0" * 32
job = executor.submit(JobSpec(task_id=1, attempt=1, name="job-1", project="p", owner="o", kind="training",
                              command=script, task_uid=uid))
deadline = time.monotonic() + 20
while executor.status(job).phase in (JobPhase.PENDING, JobPhase.RUNNING) and time.monotonic() < deadline:
    time.sleep(0.1)
kept = executor.checkpoint_dir(uid) / "state"
print(json.dumps({"phase": executor.status(job).phase.value, "log": executor.logs(job), "uid": os.getuid(),
                  "probes": list(probes), "checkpoint": kept.read_text() if kept.exists() else None,
                  "refusal": refusal}))
"""


@pytest.mark.skipif(os.geteuid() != 0, reason="the suite itself runs unprivileged: test_job_isolation covers it")
def test_a_job_of_a_portal_running_as_a_normal_user_cannot_reach_the_portal(tmp_path):
    account = pwd.getpwnam(PORTAL_USER)
    root = Path(tempfile.mkdtemp(prefix="hcs-unprivileged-portal-"))
    try:
        package = root / "pkg" / "executors"
        package.mkdir(parents=True)
        for name in (
            "__init__.py",
            "base.py",
            "limits.py",
            "local.py",
            "logfile.py",
            "sandbox.py",
            "terminal.py",
            "vram.py",
        ):
            shutil.copy(EXECUTORS / name, package / name)
        shutil.copy(pyseccomp.__file__, package.parent)  # the sandbox's seccomp filter, for the system's python
        home = root / "portal-home"
        home.mkdir(mode=0o700)
        os.chown(home, account.pw_uid, account.pw_gid)
        os.chmod(root, 0o755)
        result = subprocess.run(
            [
                "setpriv",
                f"--reuid={account.pw_uid}",
                f"--regid={account.pw_gid}",
                "--clear-groups",
                "/usr/bin/python3",
                "-c",
                DRIVER,
                str(root / "pkg"),
                str(home),
            ],
            env={"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "LANG": "C.UTF-8"},
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
    finally:
        shutil.rmtree(root, ignore_errors=True)
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout.strip().splitlines()[-1])

    assert report["uid"] == account.pw_uid and report["phase"] == "succeeded", report
    for name in report["probes"]:
        assert f"safe {name}" in report["log"], report["log"]
    # The job keeps the portal's uid (there is no other identity to take) yet sees none of its things.
    assert f"control ok uid={account.pw_uid}" in report["log"]
    assert report["checkpoint"] == "saved\n"  # its checkpoint directory is mounted writable there too
    # Without cgroups of its own, such a portal refuses jobs rather than run them without limits.
    assert "cannot be held to their CPU, memory and process limits" in report["refusal"]
    assert "HCS_LOCAL_JOB_LIMITS=off" in report["refusal"]


def test_the_sandbox_refuses_to_start_without_bubblewrap(tmp_path):
    from apps.clusters.executors.base import ExecutorError, JobSpec
    from apps.clusters.executors.local import LocalExecutor
    from apps.clusters.executors.sandbox import Sandbox

    executor = LocalExecutor(tmp_path / "jobs", sandbox=Sandbox(bwrap=""))
    spec = JobSpec(task_id=1, attempt=1, name="j", project="p", owner="o", kind="training", command="true")
    with pytest.raises(ExecutorError, match="apt-get install bubblewrap") as err:
        executor.submit(spec)
    assert err.value.retryable is False
    assert not (tmp_path / "jobs" / "j").exists()  # nothing ran, nothing was left behind
    with pytest.raises(ExecutorError, match="bubblewrap"):
        executor.health()


def test_a_missing_job_user_is_a_clear_error_when_the_portal_is_root(tmp_path):
    from apps.clusters.executors.base import ExecutorError
    from apps.clusters.executors.sandbox import Sandbox

    if os.geteuid() != 0:
        assert Sandbox(job_user="no-such-user").check() is None  # unprivileged: the portal's uid is used
        return
    with pytest.raises(ExecutorError, match="setup_local_jobs.sh") as err:
        Sandbox(job_user="no-such-user-hcs").check()
    assert err.value.retryable is False


def test_loopback_listener_in_this_test_is_reachable_without_a_sandbox():
    """Control: the loopback probe used above does connect from an ordinary process."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    port = server.getsockname()[1]
    try:
        probe = subprocess.run(["bash", "-c", f"exec 3<>/dev/tcp/127.0.0.1/{port}"], check=False)
    finally:
        server.close()
    assert probe.returncode == 0
