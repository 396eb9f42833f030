"""The local executor's ways into a running job, without Django: a shell in its sandbox, a port through a forwarder.

tests/portal/test_terminal.py and test_connect.py run them end to end; these pin the command lines.
"""

from __future__ import annotations

import os

import pytest

from apps.clusters.executors import sandbox as sandbox_module
from apps.clusters.executors.base import ExecutorError
from apps.clusters.executors.sandbox import Sandbox

pytestmark = pytest.mark.skipif(os.geteuid() != 0 or not Sandbox().bwrap, reason="needs root and bubblewrap")


def test_the_shell_joins_the_sandbox_then_becomes_the_job_user_with_only_the_jobs_environment():
    argv = Sandbox(job_user="hcs-job").enter_argv(4242)
    assert "exec_without_user_namespaces" in argv[2]  # the job's seccomp filter first, in the portal's python
    argv = argv[argv.index("nsenter") :]
    assert argv[:8] == ["nsenter", "--target=4242", "--mount", "--uts", "--ipc", "--net", "--pid", "--"]
    assert argv[8] == "setpriv" and "--clear-groups" in argv and "--no-new-privs" in argv
    assert argv[argv.index("env") :][:4] == ["env", "-i", "/bin/sh", "-c"]
    assert ". /run/hcs-job.env" in argv[-1] and "setsid --ctty" in argv[-1]


def test_the_forwarder_joins_only_the_jobs_network_and_pids():
    argv = Sandbox(job_user="hcs-job").forward_argv(4242, "/tmp/x.sock", 8888)
    assert argv == [
        "nsenter",
        "--target=4242",
        "--net",
        "--pid",
        "--",
        "socat",
        "UNIX-LISTEN:/tmp/x.sock,fork,mode=600",
        "TCP:127.0.0.1:8888",
    ]


def test_an_unprivileged_portal_says_it_cannot_reach_into_its_jobs(monkeypatch):
    monkeypatch.setattr(sandbox_module.os, "geteuid", lambda: 1000)
    with pytest.raises(ExecutorError, match="needs the portal to run as root"):
        Sandbox(job_user="hcs-job").enter_argv(4242)
    with pytest.raises(ExecutorError, match="needs the portal to run as root"):
        Sandbox(job_user="hcs-job").forward_argv(4242, "/tmp/x.sock", 8888)


def test_a_deleted_jobs_forwarder_sockets_go_with_it(tmp_path):
    import time

    from apps.clusters.executors.base import JobSpec
    from apps.clusters.executors.local import LocalExecutor

    executor = LocalExecutor(tmp_path / "jobs", sandbox=Sandbox(job_user="hcs-job"))
    job = executor.submit(
        JobSpec(task_id=1, attempt=1, name="fwd", project="p", owner="o", kind="training", command="sleep 60")
    )
    deadline = time.monotonic() + 10
    while True:
        try:
            endpoint = executor.port_endpoint(job, 0, 8000)
            break
        except ExecutorError:
            assert time.monotonic() < deadline
            time.sleep(0.1)
    assert os.path.exists(endpoint.uds) and oct(os.stat(endpoint.uds).st_mode)[-3:] == "600"
    assert executor.port_endpoint(job, 0, 8000) == endpoint  # the running forwarder is reused
    executor.delete(job)
    assert not os.path.exists(endpoint.uds)
