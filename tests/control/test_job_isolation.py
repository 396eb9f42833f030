"""A project member's job on the local cluster cannot reach the portal: its files, processes, environment,
database, Redis or web server (docs/rules.md#security).

The job below is what an attacker with a member account submitted: it tries each read and prints LEAK or
safe per probe; a control line proves that the probes ran and that the job can use its own directory.
"""

from __future__ import annotations

import os
import shlex
import socket
from pathlib import Path
from urllib.parse import urlparse

import pytest
from django.conf import settings

from apps.clusters.backends import executor_for
from apps.tasks.services import submit_task
from tests.control.drive import schedule_and_launch, wait_status

CANARY = "hcs-canary-3f9a"


def _probe_script(targets: dict[str, str]) -> str:
    lines = ['probe() { if sh -c "$2" >/dev/null 2>&1; then echo "LEAK $1"; else echo "safe $1"; fi; }']
    lines += [f"probe {name} {shlex.quote(check)}" for name, check in targets.items()]
    lines.append('echo mine > "$HOME/own-file" && cat "$HOME/own-file" && echo "control $(id -un)"')
    return "\n".join(lines)


def _tcp_probe(host: str, port: int) -> str:
    return f"bash -c 'exec 3<>/dev/tcp/{host}/{port}'"


@pytest.fixture
def listening_portal():
    """A socket on loopback standing in for the portal's web server (and /metrics, trusted on loopback)."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(8)
    yield server.getsockname()[1]
    server.close()


@pytest.fixture(autouse=True)
def local_jobs_dir(settings, tmp_path):
    settings.HCS_LOCAL_EXECUTOR_DIR = tmp_path / "local-jobs"


def _secret_files() -> dict[str, Path]:
    files = {
        "secret_key": settings.VAR_DIR / "secret_key",
        "credentials_key": settings.VAR_DIR / "credentials.key",
        "settings_py": settings.BASE_DIR / "hcsportal" / "settings.py",
    }
    if settings.DATABASES["default"]["ENGINE"].endswith("sqlite3"):
        files["sqlite_database"] = Path(settings.DATABASES["default"]["NAME"])
    for name, path in list(files.items()):
        if not path.exists():  # e.g. SECRET_KEY given in the environment: nothing on disk to steal
            del files[name]
    return files


def _service_endpoints() -> dict[str, str]:
    """Probes for the database and Redis the portal uses, over TCP or their unix sockets."""
    probes = {}
    db = settings.DATABASES["default"]
    if db["ENGINE"].endswith("postgresql"):
        host, port = db.get("HOST") or "127.0.0.1", int(db.get("PORT") or 5432)
        if host.startswith("/"):
            probes["database_socket"] = f"test -S {host}/.s.PGSQL.{port}"
        else:
            probes["database_tcp"] = _tcp_probe(host, port)
        probes["database_default_socket"] = "test -S /var/run/postgresql/.s.PGSQL.5432"
    redis_url = urlparse(settings.REDIS_URL)
    if redis_url.scheme == "unix":
        probes["redis_socket"] = f"test -S {redis_url.path}"
    else:
        probes["redis_tcp"] = _tcp_probe(redis_url.hostname, redis_url.port or 6379)
    return probes


def _run_job(world, command: str, monkeypatch) -> tuple[object, str]:
    monkeypatch.setenv("HCS_CANARY", CANARY)  # the portal's own environment, as DATABASE_URL would be
    task = submit_task(
        world.member,
        project=world.project,
        queue="high",
        name="attack",
        kind="training",
        command=command,
        gpu_spec="1(A100)",
    )
    schedule_and_launch(world.vdc.pk, task)
    task = wait_status(task, {"completed", "failed", "stopped"})
    assert task.status == "completed", task.status_message
    return task, executor_for(task.cluster).logs(task.external_id, tail=1000)


def test_a_members_job_cannot_read_the_portals_secrets_processes_environment_or_database(
    world, monkeypatch, listening_portal
):
    targets = {name: f"cat {path}" for name, path in _secret_files().items()}
    targets["portal_environ"] = f"cat /proc/{os.getpid()}/environ"
    targets["portal_process_listed"] = "grep -l bin/pytes[t] /proc/[0-9]*/cmdline"  # [t]: not itself
    targets["portal_environment_inherited"] = f"env | grep {CANARY}"
    targets["canary_in_any_process"] = f"grep -l {CANARY} /proc/[0-9]*/environ"
    targets["portal_web_on_loopback"] = _tcp_probe("127.0.0.1", listening_portal)
    targets.update(_service_endpoints())
    assert {"secret_key", "credentials_key", "settings_py"} <= set(targets)

    task, log = _run_job(world, _probe_script(targets), monkeypatch)

    for name in targets:
        assert f"safe {name}" in log, f"{name}: {log}"
    assert "LEAK" not in log
    expected_user = settings.HCS_LOCAL_JOB_USER if os.geteuid() == 0 else None
    assert "mine" in log and "control" in log
    if expected_user:
        assert f"control {expected_user}" in log  # another, unprivileged identity than the portal's


def test_the_probe_does_reach_a_listening_socket_when_jobs_share_the_hosts_network(
    world, monkeypatch, listening_portal, settings
):
    """Control for the test above: the same TCP probe connects once jobs are given the host's network."""
    from apps.clusters import backends

    settings.HCS_LOCAL_JOB_NETWORK = "host"
    monkeypatch.setattr(backends, "_local_executors", {})
    _task, log = _run_job(
        world, _probe_script({"portal_web_on_loopback": _tcp_probe("127.0.0.1", listening_portal)}), monkeypatch
    )
    assert "LEAK portal_web_on_loopback" in log
