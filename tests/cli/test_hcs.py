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
import time
import uuid
from datetime import timedelta

import pytest
import yaml
from rest_framework.authtoken.models import Token

from apps.control.scheduling import run_cycle
from apps.tasks.models import IdempotentRequest, Task
from apps.tasks.services import submit_task
from tests.cli.conftest import HCS
from tests.control import drive

pytestmark = pytest.mark.django_db(transaction=True)

PASSWORD = "pw-for-tests-1"


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
    blocker = submit_task(
        world.owner,
        project=world.project,
        queue="high",
        name="blocker",
        kind="training",
        gpu_spec="8(A100)",
        command="sleep 120",
    )
    run_cycle(world.vdc.pk)
    log_in(run_hcs)

    bad = run_hcs("submit", "-p", "alpha", "-q", "medium", "-n", "typo", "-g", "2x(V100)", "-d", "10m", "--", "true")
    assert bad.returncode == 1
    assert "gpu_spec: expected a count such as 2 or 0.5 before '(' in '2x(V100)'" in bad.stderr
    assert not Task.objects.filter(name="typo").exists()

    submitted = run_hcs(
        "submit",
        "-p",
        "alpha",
        "-q",
        "medium",
        "-n",
        "cli-job",
        "-g",
        "1(A100)",
        "--cpu",
        "2",
        "--memory",
        "4",
        "-d",
        "10m",
        "-t",
        "2h",
        "-e",
        "EPOCHS=3",
        "-e",
        "LR=0.1",
        "--epochs",
        "3",
        "--batch-size",
        "32",
        "--framework",
        "pytorch",
        "--json",
        "--",
        "python3",
        "train.py",
        "--name",
        "a b",
    )
    assert submitted.returncode == 0, submitted.stderr
    task = Task.objects.get(pk=json.loads(submitted.stdout)["id"])
    assert (task.name, task.gpu_spec, task.cpu, task.memory_gib) == ("cli-job", "1(A100)", 2, 4)
    assert (task.expected_duration, task.wall_time) == (timedelta(minutes=10), timedelta(hours=2))
    assert (task.env, task.epochs, task.batch_size, task.framework) == ({"EPOCHS": "3", "LR": "0.1"}, 3, 32, "pytorch")
    assert task.command == "python3 train.py --name 'a b'"
    # Each submit carries a fresh Idempotency-Key (the refused one above was not remembered).
    (remembered,) = IdempotentRequest.objects.filter(user=world.member)
    assert uuid.UUID(remembered.key).version == 4 and remembered.body["id"] == task.pk
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
        "submit",
        "-p",
        "alpha",
        "-q",
        "high",
        "-n",
        "ticker",
        "-g",
        "1(A100)",
        "--json",
        "--",
        "sh",
        "-c",
        'for n in 1 2 3 4 5; do echo "tick $n"; sleep 0.5; done',
    )
    assert submitted.returncode == 0, submitted.stderr
    task = Task.objects.get(pk=json.loads(submitted.stdout)["id"])

    follower = subprocess.Popen(
        [str(HCS), "logs", "-f", str(task.pk)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={k: v for k, v in os.environ.items() if not k.startswith("HCS_")}
        | {"XDG_CONFIG_HOME": str(run_hcs.config.parents[1])},
    )
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
    from apps.vdc.models import ProjectSecret

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
    submitted = run_hcs(
        "submit",
        "-p",
        "alpha",
        "-q",
        "high",
        "-n",
        "uses-secret",
        "-s",
        "HF=HF_TOKEN",
        "--secret-file",
        "/run/secrets/hf=HF_TOKEN",
        "--json",
        "--",
        "sleep",
        "600",
    )
    assert submitted.returncode == 0, submitted.stderr
    task = Task.objects.get(pk=json.loads(submitted.stdout)["id"])
    assert task.secret_refs == [{"secret": "HF_TOKEN", "env": "HF"}, {"secret": "HF_TOKEN", "file": "/run/secrets/hf"}]

    log_in(run_hcs, "olivia")
    in_use = run_hcs("secrets", "rm", "-p", "alpha", "HF_TOKEN")
    # (the task runs a long command: one that ended before this would no longer hold the secret)
    assert in_use.returncode == 1 and f"#{task.pk} uses-secret" in in_use.stderr, (in_use, Task.objects.get(pk=task.pk))
    assert ProjectSecret.objects.filter(name="HF_TOKEN").exists()
    assert run_hcs("stop", str(task.pk)).returncode == 0  # its job ends with the test


def test_submit_prints_the_real_position_and_delete_removes_an_ended_task(run_hcs, live_world):
    world = live_world
    blocker = submit_task(
        world.owner,
        project=world.project,
        queue="high",
        name="blocker",
        kind="training",
        gpu_spec="8(A100)",
        command="sleep 120",
    )
    run_cycle(world.vdc.pk)
    log_in(run_hcs)
    submitted = run_hcs(
        "submit", "-p", "alpha", "-q", "high", "-n", "ranked", "-g", "1(A100)", "-d", "10m", "--", "true"
    )
    assert submitted.returncode == 0, submitted.stderr
    task = Task.objects.get(name="ranked")
    assert f"Submitted task {task.pk} (ranked): queued in high, position 1, estimated start " in submitted.stdout
    assert "?" not in submitted.stdout

    refused = run_hcs("delete", str(task.pk))
    assert refused.returncode == 1 and "expected a stopped, completed or failed task" in refused.stderr
    assert run_hcs("stop", str(task.pk)).returncode == 0
    deleted = run_hcs("delete", str(task.pk))
    assert deleted.returncode == 0, deleted.stderr
    assert deleted.stdout.strip() == f"Task {task.pk} deleted" and not Task.objects.filter(pk=task.pk).exists()
    assert run_hcs("stop", str(blocker.pk)).returncode == 0
    drive.wait_objects_ended(world.cluster)


def test_submit_f_sends_a_downloaded_task_file_again_with_options_overriding_it(run_hcs, live_world, tmp_path):
    from django.test import Client

    from tests.api.test_task_files import submitted as submitted_fields

    world = live_world
    blocker = submit_task(
        world.owner,
        project=world.project,
        queue="high",
        name="blocker",
        kind="training",
        gpu_spec="8(A100)",
        command="sleep 120",
    )
    run_cycle(world.vdc.pk)
    original = submit_task(
        world.member,
        project=world.project,
        queue="medium",
        name="from-file",
        kind="training",
        gpu_spec="1(A100)",
        cpu=2,
        memory_gib=4,
        expected_duration=timedelta(minutes=90),
        wall_time=timedelta(hours=3),
        preemptible=False,
        command="python3 train.py --name 'a b'",
        env={"EPOCHS": "3", "LR": "0.1"},
        secret_env={"WANDB_API_KEY": "never-in-the-file"},
        framework="pytorch",
        epochs=3,
        batch_size=32,
    )
    browser = Client()
    browser.force_login(world.member)
    text = browser.get(f"/tasks/{original.pk}/task.yaml").content.decode()
    assert "never-in-the-file" not in text
    path = tmp_path / "task.yaml"
    path.write_text(text)
    log_in(run_hcs)

    # `hcs task-file` prints the same file from the API, secret names in a comment.
    printed = run_hcs("task-file", str(original.pk))
    assert printed.returncode == 0, printed.stderr
    assert yaml.safe_load(printed.stdout) == yaml.safe_load(text)
    assert "never-in-the-file" not in printed.stdout
    assert "# Secret variables left out (values are never shown): WANDB_API_KEY" in printed.stdout
    assert json.loads(run_hcs("task-file", str(original.pk), "--json").stdout) == yaml.safe_load(text)

    again = run_hcs("submit", "-f", str(path), "--json")
    assert again.returncode == 0, again.stderr
    copy = Task.objects.get(pk=json.loads(again.stdout)["id"])
    assert submitted_fields(copy) == submitted_fields(original) | {"secret_env_names": []}

    # Options win over the file's fields; variables given as options join the file's.
    edited = run_hcs("submit", "-f", str(path), "-n", "edited", "-q", "low", "-e", "LR=0.2", "--secret-env", "K=v")
    assert edited.returncode == 0, edited.stderr
    task = Task.objects.get(name="edited")
    # Whether the cycle ranked it within the CLI's wait depends on the machine's load; the ranked line
    # is checked by test_submit_prints_the_real_position_and_delete_removes_an_ended_task.
    assert f"Submitted task {task.pk} (edited): queued in low, " in edited.stdout
    assert (task.queue.name, task.env, task.epochs, task.secret_env_names) == (
        "low",
        {"EPOCHS": "3", "LR": "0.2"},
        3,
        ["K"],
    )
    # The same file as JSON, read from standard input.
    as_json = json.dumps({**yaml.safe_load(text), "name": "from-json"})
    assert run_hcs("submit", "-f", "-", stdin=as_json).returncode == 0
    assert Task.objects.get(name="from-json").command == original.command

    count = Task.objects.count()
    path.write_text(text + "gpus: 2\n")
    unknown = run_hcs("submit", "-f", str(path))
    assert unknown.returncode == 1
    assert "hcs: gpus: Unknown key: expected only the fields of a task submission" in unknown.stderr
    path.write_text("- name: x\n")
    assert run_hcs("submit", "-f", str(path)).stderr.strip() == (
        f"hcs: {path}: expected a task file holding one mapping of task fields (name: ..., project: ...)"
    )
    path.write_text("name: x\n")
    missing = run_hcs("submit", "-f", str(path))
    assert missing.returncode == 2 and "give -p/--project, or project: in a task file (-f)" in missing.stderr
    path.write_text("name: [x\n")
    broken = run_hcs("submit", "-f", str(path))
    assert broken.returncode == 2 and "expected YAML or JSON; it does not parse at line 2" in broken.stderr
    assert Task.objects.count() == count

    for task in Task.objects.exclude(pk=blocker.pk):
        assert run_hcs("stop", str(task.pk)).returncode == 0
    assert run_hcs("stop", str(blocker.pk)).returncode == 0
    drive.wait_objects_ended(world.cluster)


def test_submit_sets_a_dev_environments_idle_autostop(run_hcs, live_world):
    log_in(run_hcs)
    answer = run_hcs(
        "submit",
        "-p",
        "alpha",
        "-q",
        "high",
        "-n",
        "notebook",
        "-k",
        "dev_env",
        "--ide",
        "jupyter",
        "--image",
        "jupyter/base-notebook",
        "--idle-stop-minutes",
        "45",
        "--idle-stop-percent",
        "8",
        "--",
        "sleep 60",
    )
    assert answer.returncode == 0, answer.stderr
    task = Task.objects.get(name="notebook")
    assert (task.idle_stop_minutes, task.idle_stop_percent) == (45, 8)
    refused = run_hcs("submit", "-p", "alpha", "-q", "high", "-n", "tr", "--idle-stop-minutes", "5", "--", "true")
    assert (
        refused.returncode == 1
        and "idle_stop_minutes: Idle autostop applies to dev environments only" in refused.stderr
    )


def test_sweep_submit_ls_show_and_stop(run_hcs, live_world, tmp_path):
    """`hcs sweep`: a dry run creates nothing, a grid from a task file creates its product, an explicit list
    its combinations, a bad --param is a usage error; ls, show and stop follow the sweep."""
    from apps.tasks.models import Sweep

    log_in(run_hcs)
    path = tmp_path / "task.yaml"
    path.write_text("name: lr\nproject: alpha\nqueue: high\nkind: training\ncommand: sleep 60\ngpu_spec: 1(A100)\n")
    grid = ("--param", "lr=0.1,0.01", "--param", "batch_size=32,64")
    dry = run_hcs("sweep", "submit", "-f", str(path), *grid, "--dry-run")
    assert dry.returncode == 0, dry.stderr
    assert "Dry run: 4 tasks would be created (nothing was)" in dry.stdout and "lr=0.01 batch_size=64" in dry.stdout
    assert not Sweep.objects.exists() and not Task.objects.exists()

    submitted = run_hcs("sweep", "submit", "-f", str(path), *grid, "-e", "EXTRA=1", "--goal", "min")
    assert submitted.returncode == 0, submitted.stderr
    sweep = Sweep.objects.get()
    assert f"Submitted sweep {sweep.pk} (lr): 4 tasks" in submitted.stdout
    tasks = list(sweep.tasks.order_by("pk"))
    assert [t.name for t in tasks] == ["lr-1", "lr-2", "lr-3", "lr-4"]
    assert tasks[3].sweep_values == {"lr": "0.01", "batch_size": "64"} and tasks[3].env == {"EXTRA": "1"}
    assert sweep.parameters == {"lr": ["0.1", "0.01"], "batch_size": ["32", "64"]} and sweep.goal == "min"

    combos = run_hcs("sweep", "submit", "-f", str(path), "-n", "pairs", "--combo", "lr=1,warmup=5", "--combo", "lr=2")
    assert combos.returncode == 0, combos.stderr
    assert Sweep.objects.get(name="pairs").parameters == [{"lr": "1", "warmup": "5"}, {"lr": "2"}]

    bad = run_hcs("sweep", "submit", "-f", str(path), "--param", "lr")
    assert bad.returncode == 2 and "--param: expected KEY=VALUE, got 'lr'" in bad.stderr
    none = run_hcs("sweep", "submit", "-f", str(path))
    assert none.returncode == 2 and "give the values to sweep" in none.stderr
    over = run_hcs("sweep", "submit", "-f", str(path), "--param", "a=" + ",".join(map(str, range(101))))
    assert over.returncode == 1 and "at most 100 tasks" in over.stderr
    assert Sweep.objects.count() == 2

    listed = run_hcs("sweep", "ls")
    assert listed.returncode == 0, listed.stderr
    assert re.search(rf"^{sweep.pk}\s+lr\s+alpha\s+4\s+\d \w+", listed.stdout, re.M), listed.stdout
    shown = run_hcs("sweep", "show", str(sweep.pk))
    assert shown.returncode == 0 and re.search(rf"^{tasks[0].pk}\s+lr-1\s+lr=0.1 batch_size=32", shown.stdout, re.M)
    run_hcs("sweep", "stop", str(Sweep.objects.get(name="pairs").pk))
    Task.objects.filter(pk=tasks[1].pk).update(metric_name="loss", metric_value=0.25)
    shown = run_hcs("sweep", "show", str(sweep.pk))
    assert f"Best (min): task {tasks[1].pk} (lr-2) loss=0.25" in shown.stdout
    stopped = run_hcs("sweep", "stop", str(sweep.pk), "-r", "enough")
    assert stopped.returncode == 0, stopped.stderr
    assert stopped.stdout.strip() == f"Sweep {sweep.pk} (lr): 4 stopped"
    assert set(sweep.tasks.values_list("status", flat=True)) == {"stopped"}
    assert json.loads(run_hcs("sweep", "show", str(sweep.pk), "--json").stdout)["counts"]["finished"] == 4
    drive.wait_objects_ended(live_world.cluster)


def test_template_save_ls_show_submit_and_rm(run_hcs, live_world):
    """`hcs template`: owners save a task as a template, everyone in the project lists it, members submit from it
    by name with options overriding it, viewers may not; an unknown name is a usage error."""
    from apps.tasks.models import TaskTemplate

    world = live_world
    blocker = submit_task(
        world.owner,
        project=world.project,
        queue="high",
        name="blocker",
        kind="training",
        gpu_spec="8(A100)",
        command="sleep 120",
    )
    run_cycle(world.vdc.pk)
    task = submit_task(
        world.member,
        project=world.project,
        queue="high",
        name="resnet",
        kind="training",
        gpu_spec="1(A100)",
        command="sleep 60",
        env={"EPOCHS": "3", "LR": "0.1"},
        secret_env={"WANDB_API_KEY": "never-in-a-template"},
    )
    log_in(run_hcs, "max")
    refused = run_hcs("template", "save", str(task.pk), "resnet")
    assert refused.returncode == 1 and "Only owners of project alpha" in refused.stderr
    log_in(run_hcs, "olivia")
    saved = run_hcs("template", "save", str(task.pk), "resnet", "-d", "ResNet-50 base")
    assert saved.returncode == 0, saved.stderr
    template = TaskTemplate.objects.get()
    assert saved.stdout.strip() == f"Saved task {task.pk} as template {template.pk} (resnet) of project alpha"
    assert "never-in-a-template" not in json.dumps(template.task_file) and template.description == "ResNet-50 base"

    log_in(run_hcs, "max")
    listed = run_hcs("template", "ls")
    assert listed.returncode == 0, listed.stderr
    assert re.search(rf"^{template.pk}\s+resnet\s+alpha\s+training\s+ResNet-50 base\s+olivia", listed.stdout, re.M)
    assert run_hcs("template", "ls", "-p", "beta").stdout.strip() == "No templates."
    shown = run_hcs("template", "show", "resnet")
    assert shown.returncode == 0 and yaml.safe_load(shown.stdout) == template.task_file

    submitted = run_hcs("submit", "--template", "resnet", "-n", "resnet-lr", "-e", "LR=0.01", "--json")
    assert submitted.returncode == 0, submitted.stderr
    copy = Task.objects.get(pk=json.loads(submitted.stdout)["id"])
    assert (copy.name, copy.project, copy.owner, copy.command) == ("resnet-lr", world.project, world.member, "sleep 60")
    assert copy.env == {"EPOCHS": "3", "LR": "0.01"} and copy.secret_env_names == []
    by_id = run_hcs("submit", "-T", str(template.pk), "-p", "alpha")
    assert by_id.returncode == 0 and "Submitted task" in by_id.stdout and "(resnet)" in by_id.stdout

    count = Task.objects.count()
    unknown = run_hcs("submit", "--template", "nope")
    assert unknown.returncode == 2 and "no template 'nope'" in unknown.stderr
    bad = run_hcs("submit", "--template", "resnet", "--gpu", "2((")
    assert bad.returncode == 1 and "gpu_spec" in bad.stderr
    both = run_hcs("submit", "--template", "resnet", "-f", "task.yaml")
    assert both.returncode == 2 and "not both" in both.stderr
    log_in(run_hcs, "vera")
    viewer = run_hcs("submit", "--template", "resnet")
    assert viewer.returncode == 1 and "Viewers of project alpha cannot submit" in viewer.stderr
    assert run_hcs("template", "rm", "resnet").returncode == 1
    assert Task.objects.count() == count

    log_in(run_hcs, "olivia")
    removed = run_hcs("template", "rm", "resnet")
    assert removed.returncode == 0 and not TaskTemplate.objects.exists()
    for one in Task.objects.exclude(pk=blocker.pk):
        assert run_hcs("stop", str(one.pk)).returncode == 0
    assert run_hcs("stop", str(blocker.pk)).returncode == 0
    drive.wait_objects_ended(world.cluster)
