"""The `hcs` console script, run as a subprocess against a live server on the test database.

The server is Daphne in this process (tests/portal/conftest.py); the test thread plays beat (scheduling
cycles and reconciliation), and local-cluster jobs are real processes.
"""

from __future__ import annotations

import json
import os
import re
import stat
import subprocess
import sys
import time
from datetime import timedelta
from pathlib import Path

import pytest
from rest_framework.authtoken.models import Token

from apps.control.scheduling import run_cycle
from apps.tasks.models import Task
from apps.tasks.services import submit_task
from tests.control import drive

pytestmark = pytest.mark.django_db(transaction=True)

# The console script `make venv` installs next to the interpreter running the tests.
HCS = Path(sys.executable).parent / "hcs"
PASSWORD = "pw-for-tests-1"


@pytest.fixture
def run_hcs(live_server_url, tmp_path):
    """Run `hcs` with a private config directory; the server's URL comes from `hcs login` or HCS_URL."""
    assert HCS.exists(), f"{HCS} is missing: `make venv` installs the project (pip install -e .)"
    base_env = {k: v for k, v in os.environ.items() if not k.startswith("HCS_")}
    base_env["XDG_CONFIG_HOME"] = str(tmp_path / "config")

    def run(*args: str, stdin: str | None = None, env: dict | None = None) -> subprocess.CompletedProcess:
        return subprocess.run(
            [str(HCS), *args], input=stdin, capture_output=True, text=True, timeout=60, env={**base_env, **(env or {})}
        )

    run.url = live_server_url
    run.config = tmp_path / "config" / "hcs" / "config.json"
    return run


def log_in(run_hcs, username: str = "max") -> None:
    result = run_hcs("login", "--url", run_hcs.url, "-u", username, "--password-stdin", stdin=f"{PASSWORD}\n")
    assert result.returncode == 0, result.stderr


def test_login_keeps_the_token_in_a_private_file_and_logout_forgets_it(run_hcs, live_world):
    refused = run_hcs("login", "--url", run_hcs.url, "-u", "max", "--password-stdin", stdin="wrong\n")
    assert refused.returncode == 1
    assert "Unable to log in with provided credentials." in refused.stderr
    assert not run_hcs.config.exists()

    log_in(run_hcs)
    assert stat.S_IMODE(run_hcs.config.stat().st_mode) == 0o600
    assert stat.S_IMODE(run_hcs.config.parent.stat().st_mode) == 0o700
    stored = json.loads(run_hcs.config.read_text())
    assert stored == {"url": run_hcs.url, "token": Token.objects.get(user=live_world.member).key, "username": "max"}
    assert run_hcs("ls").returncode == 0

    assert run_hcs("logout").returncode == 0 and not run_hcs.config.exists()
    result = run_hcs("ls")
    assert result.returncode == 2 and "Not logged in" in result.stderr
    # A script needs no login: HCS_URL and HCS_TOKEN are enough.
    token = Token.objects.create(user=live_world.viewer).key
    result = run_hcs("ls", env={"HCS_URL": run_hcs.url, "HCS_TOKEN": token})
    assert result.returncode == 0, result.stderr
    result = run_hcs("ls", env={"HCS_URL": run_hcs.url, "HCS_TOKEN": "0" * 40})
    assert result.returncode == 1 and "Invalid token." in result.stderr


def test_submit_ls_status_queue_and_stop(run_hcs, live_world):
    world = live_world
    blocker = submit_task(world.owner, project=world.project, queue="high", name="blocker", kind="training",
                          gpu_spec="8(A100)", command="sleep 120")  # fmt: skip
    run_cycle(world.vdc.pk)
    log_in(run_hcs)

    bad = run_hcs("submit", "-p", "alpha", "-q", "medium", "-n", "typo", "-g", "2x(V100)", "-d", "10m", "--", "true")
    assert bad.returncode == 1
    assert "gpu_spec: expected a count such as 2 or 0.5 before '(' in '2x(V100)'" in bad.stderr
    assert not Task.objects.filter(name="typo").exists()

    submitted = run_hcs(
        "submit", "-p", "alpha", "-q", "medium", "-n", "cli-job", "-g", "1(A100)", "--cpu", "2", "--memory", "4",
        "-d", "10m", "-t", "2h", "-e", "EPOCHS=3", "-e", "LR=0.1", "--epochs", "3", "--batch-size", "32",
        "--framework", "pytorch", "--json", "--", "python3", "train.py", "--name", "a b",
    )  # fmt: skip
    assert submitted.returncode == 0, submitted.stderr
    task = Task.objects.get(pk=json.loads(submitted.stdout)["id"])
    assert (task.name, task.gpu_spec, task.cpu, task.memory_gib) == ("cli-job", "1(A100)", 2, 4)
    assert (task.expected_duration, task.wall_time) == (timedelta(minutes=10), timedelta(hours=2))
    assert (task.env, task.epochs, task.batch_size, task.framework) == ({"EPOCHS": "3", "LR": "0.1"}, 3, 32, "pytorch")
    assert task.command == "python3 train.py --name 'a b'"
    run_cycle(world.vdc.pk)
    task.refresh_from_db()
    assert (task.status, task.queue_position) == ("queued", 1)

    listed = run_hcs("ls")
    assert listed.returncode == 0
    header, *rows = listed.stdout.splitlines()
    assert header.split()[:6] == ["ID", "NAME", "KIND", "PROJECT", "QUEUE", "STATUS"]
    assert [row.split()[:6] for row in rows] == [
        [str(task.pk), "cli-job", "training", "alpha", "medium", "queued"],
        [str(blocker.pk), "blocker", "training", "alpha", "high", Task.objects.get(pk=blocker.pk).status],
    ]
    only_queued = json.loads(run_hcs("ls", "--status", "queued", "--kind", "training", "--json").stdout)
    assert [t["id"] for t in only_queued] == [task.pk]
    assert run_hcs("ls", "-p", "beta").stdout.strip() == "No tasks."
    wrong = run_hcs("ls", "--status", "sleeping")
    assert wrong.returncode == 1 and wrong.stderr.startswith("hcs: status__in: ")

    shown = run_hcs("status", str(task.pk))
    assert shown.returncode == 0
    assert "Status:            queued" in shown.stdout and "Queue position:    1" in shown.stdout
    assert "Pending reason:" in shown.stdout and "Timeline:" in shown.stdout and "submitted" in shown.stdout
    assert json.loads(run_hcs("status", str(task.pk), "--json").stdout)["events"][0]["kind"] == "submitted"
    assert run_hcs("status", "999999").returncode == 1

    queues = run_hcs("queue")
    assert queues.returncode == 0
    medium = next(line.split() for line in queues.stdout.splitlines() if line.split()[1:2] == ["medium"])
    assert medium == ["main", "medium", "medium", "fifo", "open", "1", "0"]
    assert "Your projects' waiting tasks:" in queues.stdout
    waiting = queues.stdout.split("Your projects' waiting tasks:")[1].splitlines()[2].split()
    assert waiting[:4] == ["medium", "1", str(task.pk), "cli-job"]

    viewer_token = Token.objects.create(user=world.viewer).key
    refused = run_hcs("stop", str(task.pk), env={"HCS_TOKEN": viewer_token})
    assert refused.returncode == 1 and refused.stderr.startswith("hcs: Only owners and members")
    stopped = run_hcs("stop", str(task.pk), "-r", "wrong learning rate")
    assert stopped.returncode == 0, stopped.stderr
    assert stopped.stdout.strip() == f"Task {task.pk} (cli-job): stopped"
    task.refresh_from_db()
    assert task.status == "stopped" and "wrong learning rate" in task.events.last().message
    assert run_hcs("stop", str(blocker.pk)).returncode == 0
    drive.wait_objects_ended(world.cluster)  # the blocker's process is gone before the next test


def test_logs_follow_a_real_local_job_until_it_ends(run_hcs, live_world):
    log_in(run_hcs)
    submitted = run_hcs(
        "submit", "-p", "alpha", "-q", "high", "-n", "ticker", "-g", "1(A100)", "--json", "--",
        "sh", "-c", 'for n in 1 2 3 4 5; do echo "tick $n"; sleep 0.5; done',
    )  # fmt: skip
    assert submitted.returncode == 0, submitted.stderr
    task = Task.objects.get(pk=json.loads(submitted.stdout)["id"])

    follower = subprocess.Popen(
        [str(HCS), "logs", "-f", str(task.pk)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env={k: v for k, v in os.environ.items() if not k.startswith("HCS_")} | {
            "XDG_CONFIG_HOME": str(run_hcs.config.parents[1])
        },
    )  # fmt: skip
    deadline = time.monotonic() + 60
    try:
        while follower.poll() is None:  # this thread is beat: cycles and status sync until the job ends
            assert time.monotonic() < deadline, "hcs logs -f did not end with the run"
            run_cycle(live_world.vdc.pk)
            drive.reconcile_all()
            time.sleep(0.3)
    finally:
        if follower.poll() is None:
            follower.kill()
    out, err = follower.communicate()
    assert follower.returncode == 0, err
    assert out == "".join(f"tick {n}\n" for n in range(1, 6))
    assert f"run 1 of task {task.pk} ended; the task is completed" in err

    task.refresh_from_db()
    assert task.status == "completed"
    assert re.search(r"^Status:\s+completed\nExit code:\s+0$", run_hcs("status", str(task.pk)).stdout, re.M)
    tail = run_hcs("logs", str(task.pk), "-n", "2")
    assert (tail.returncode, tail.stdout) == (0, "tick 4\ntick 5\n")
    wrong = run_hcs("logs", str(task.pk), "--attempt", "2")
    assert wrong.returncode == 1 and "attempt: Expected a run between 1 and 1, got 2." in wrong.stderr


def test_secrets_are_set_from_stdin_listed_by_name_and_referred_to_by_submit(run_hcs, live_world):
    from apps.vdc.models import ProjectSecret  # noqa: PLC0415

    value = "hf_cli-secret-4d2c"
    log_in(run_hcs, "olivia")  # an owner of project alpha
    added = run_hcs("secrets", "set", "-p", "alpha", "HF_TOKEN", "-d", "the hub", stdin=value)
    assert added.returncode == 0, added.stderr
    assert ProjectSecret.objects.get(name="HF_TOKEN").get_value() == value
    rotated = run_hcs("secrets", "set", "-p", "alpha", "HF_TOKEN", stdin="rotated-7e1")
    assert rotated.returncode == 0 and "new value" in rotated.stdout
    assert ProjectSecret.objects.get(name="HF_TOKEN").get_value() == "rotated-7e1"

    log_in(run_hcs, "max")  # a member: sees names, may not set
    listed = run_hcs("secrets", "ls", "-p", "alpha")
    assert listed.returncode == 0 and "HF_TOKEN" in listed.stdout and "the hub" in listed.stdout
    assert value not in listed.stdout and "rotated-7e1" not in listed.stdout
    refused = run_hcs("secrets", "set", "-p", "alpha", "OTHER", stdin="x")
    assert refused.returncode == 1 and "Only owners of project alpha" in refused.stderr
    unknown = run_hcs("submit", "-p", "alpha", "-q", "high", "-n", "j", "-s", "HF=NOPE", "--", "true")
    assert unknown.returncode == 1 and "has no secret NOPE; its secrets are: HF_TOKEN" in unknown.stderr
    submitted = run_hcs("submit", "-p", "alpha", "-q", "high", "-n", "uses-secret", "-s", "HF=HF_TOKEN",
                        "--secret-file", "/run/secrets/hf=HF_TOKEN", "--json", "--", "sleep", "600")  # fmt: skip
    assert submitted.returncode == 0, submitted.stderr
    task = Task.objects.get(pk=json.loads(submitted.stdout)["id"])
    assert task.secret_refs == [{"secret": "HF_TOKEN", "env": "HF"}, {"secret": "HF_TOKEN", "file": "/run/secrets/hf"}]

    log_in(run_hcs, "olivia")
    in_use = run_hcs("secrets", "rm", "-p", "alpha", "HF_TOKEN")
    # (the task runs a long command: one that ended before this would no longer hold the secret)
    assert in_use.returncode == 1 and f"#{task.pk} uses-secret" in in_use.stderr, (in_use, Task.objects.get(pk=task.pk))
    assert ProjectSecret.objects.filter(name="HF_TOKEN").exists()
    assert run_hcs("stop", str(task.pk)).returncode == 0  # its job ends with the test
