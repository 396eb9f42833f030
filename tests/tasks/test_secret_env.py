"""Secret variables of tasks: stored encrypted, write-only in every door, names only on the way out, and in
the job's environment at launch."""

from __future__ import annotations

import contextlib
import hashlib
import json
from pathlib import Path

import pytest
from django.db import connection

from apps.clusters.backends import executor_for
from apps.control.jobspec import job_spec
from apps.control.scheduling import run_cycle
from apps.remotegpu.keys import project_key
from apps.tasks.models import Task, TaskEvent
from apps.tasks.services import submit_task
from tests.api.base import client_for
from tests.control.drive import launch, wait_status

SECRET = "s3cr3t-value-9f2a"
TASKS = "/api/v1/tasks/"


def api_submit(world, user=None, **fields):
    body = {"project": "alpha", "queue": "high", "name": "job", "kind": "training", "command": "echo hi", **fields}
    return client_for(user or world.member).post(TASKS, body, format="json")


def with_secret(world, **fields) -> Task:
    fields.setdefault("command", "echo hi")
    return submit_task(
        world.member,
        project=world.project,
        queue="high",
        name="job",
        kind="training",
        secret_env={"API_TOKEN": SECRET},
        **fields,
    )


def test_api_takes_secret_values_and_answers_only_their_names(world):
    response = api_submit(world, env={"EPOCHS": "3"}, secret_env={"API_TOKEN": SECRET})
    assert response.status_code == 201, response.data
    assert response.data["secret_env_names"] == ["API_TOKEN"]
    assert "secret_env" not in response.data
    assert SECRET not in json.dumps(response.data)
    task_id = response.data["id"]
    for user in (world.member, world.viewer, world.owner, world.admin):
        client = client_for(user)
        for url in (f"{TASKS}{task_id}/", TASKS, f"{TASKS}{task_id}/events/"):
            answer = client.get(url)
            assert answer.status_code in (200, 404), (url, answer.status_code)
            assert SECRET not in answer.content.decode(), (user, url)
    detail = client_for(world.viewer).get(f"{TASKS}{task_id}/").data
    assert detail["env"] == {"EPOCHS": "3"} and detail["secret_env_names"] == ["API_TOKEN"]


def test_secret_values_are_encrypted_in_the_database(world):
    task = with_secret(world)
    with connection.cursor() as cursor:
        # The column as stored, read past the model (standard SQL: PostgreSQL and SQLite alike).
        cursor.execute("SELECT CAST(secret_env AS TEXT) FROM tasks_task WHERE id = %s", [task.pk])
        (stored,) = cursor.fetchone()
    assert "API_TOKEN" in stored and SECRET not in stored
    assert Task.objects.get(pk=task.pk).get_secret_env() == {"API_TOKEN": SECRET}
    events = list(TaskEvent.objects.filter(task=task).values_list("message", "data"))
    assert SECRET not in repr(events)


@pytest.mark.parametrize(
    ("secret_env", "message"),
    [
        ({"A=B": "x"}, "Expected variable names"),
        ({"": "x"}, "Expected variable names"),
        ({"CUDA_VISIBLE_DEVICES": "0,1"}, "reserved"),
        ({"HCS_TASK_ID": "1"}, "reserved"),
        ({"TOKEN": 3}, "Expected a string value"),
        ({"TOKEN": "a\x00b"}, "NUL"),
        (["TOKEN"], "Expected environment variables as an object"),
        ({"EPOCHS": "x"}, "also in env"),
    ],
)
def test_secret_variables_meet_the_env_rules(world, secret_env, message):
    response = api_submit(world, env={"EPOCHS": "3"}, secret_env=secret_env)
    assert response.status_code == 400
    assert message in str(response.data["secret_env"])
    assert not Task.objects.exists()


def test_job_spec_carries_the_secret_but_never_shows_it(world):
    task = with_secret(world)
    run_cycle(world.vdc.pk)
    task.refresh_from_db()
    spec = job_spec(task, "install")
    # Beside the task's own: the project's remote-GPU key, which every task gets (docs/remote-gpu.md).
    assert spec.secret_env == {"API_TOKEN": SECRET, "HCS_REMOTE_GPU_KEY": project_key(task.project)}
    assert "API_TOKEN" not in spec.env and SECRET not in repr(spec)


def test_a_local_job_sees_its_secret_in_its_environment(world, settings, tmp_path):
    settings.HCS_LOCAL_EXECUTOR_DIR = tmp_path / "local-jobs"
    # The command compares a digest: the value itself in a command line would be what the next test looks for.
    digest = hashlib.sha256(SECRET.encode()).hexdigest()
    command = f'test "$(printf %s "$API_TOKEN" | sha256sum | cut -d" " -f1)" = {digest} && echo secret-ok'
    task = with_secret(world, command=command, gpu_spec="1(A100)")
    run_cycle(world.vdc.pk)
    task.refresh_from_db()
    assert task.status == "scheduled"
    launch(task)
    wait_status(task, "completed")
    assert "secret-ok" in executor_for(task.cluster).logs(task.external_id)


def test_no_command_line_on_the_host_shows_a_running_jobs_environment(world, settings, tmp_path):
    # Any account on the host can read every process's command line (ps): values must never be there.
    settings.HCS_LOCAL_EXECUTOR_DIR = tmp_path / "local-jobs"
    task = with_secret(world, command="sleep 30", gpu_spec="1(A100)", env={"PLAIN": "plain-value-7c1d"})
    run_cycle(world.vdc.pk)
    launch(task)
    task = wait_status(task, "running")
    try:
        command_lines = []
        for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
            with contextlib.suppress(OSError):
                command_lines.append(cmdline.read_bytes())
        assert any(b"sleep" in line and b"30" in line for line in command_lines), "the job is seen running"
        assert not [line for line in command_lines if SECRET.encode() in line or b"plain-value-7c1d" in line]
    finally:
        executor_for(task.cluster).kill(task.external_id)


def test_task_page_shows_secret_names_never_values(client, world):
    task = with_secret(world)
    for user in (world.viewer, world.member):
        client.force_login(user)
        page = client.get(f"/task-monitoring/{task.pk}/")
        assert page.status_code == 200
        assert b"API_TOKEN" in page.content and SECRET.encode() not in page.content


def test_submit_page_takes_secret_variables_and_never_renders_them_back(client, world):
    client.force_login(world.member)
    form = {
        "name": "job",
        "project": world.project.pk,
        "vdc": world.vdc.pk,
        "queue": world.high.pk,
        "preemptible": "on",
        "gpu_spec": "",
        "cpu": "1",
        "memory_gib": "1",
        "instances": "1",
        "command": "echo hi",
        "env": "EPOCHS=3",
        "secret_env": f"API_TOKEN={SECRET}",
        "framework": "pytorch",
        "kind": "training",
        "max_retries": "0",
    }
    page = client.get("/training-jobs/new/")
    assert b'name="secret_env"' in page.content
    refused = client.post("/training-jobs/new/", {**form, "name": ""})
    assert refused.status_code == 200 and SECRET.encode() not in refused.content
    response = client.post("/training-jobs/new/", form)
    assert response.status_code == 302, response.content.decode()[-2000:]
    task = Task.objects.get()
    assert task.secret_env_names == ["API_TOKEN"] and task.get_secret_env() == {"API_TOKEN": SECRET}
    assert task.env == {"EPOCHS": "3"}


def test_admin_shows_secret_names_only(client, world):
    task = with_secret(world)
    client.force_login(world.admin)
    page = client.get(f"/admin/tasks/task/{task.pk}/change/")
    assert page.status_code == 200
    assert b"API_TOKEN" in page.content and SECRET.encode() not in page.content
    add = client.get("/admin/tasks/task/add/")
    assert add.status_code == 200 and b'name="secret_variables"' in add.content
