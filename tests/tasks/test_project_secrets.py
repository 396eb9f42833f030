"""Project secrets: kept encrypted per project, managed by owners, referred to by name from tasks (secret_refs),
decrypted only into the job of each attempt, and never shown back by the API, pages, admin or events."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import pwd
from pathlib import Path

import pytest
from django.core.exceptions import PermissionDenied, ValidationError
from django.db import connection

from apps.clusters.backends import executor_for
from apps.clusters.executors.base import ExecutorError
from apps.control.jobspec import job_spec
from apps.control.scheduling import run_cycle
from apps.tasks.forms import parse_secret_refs
from apps.tasks.models import Task, TaskEvent
from apps.tasks.services import stop_task, submit_task
from apps.vdc.models import ProjectSecret
from apps.vdc.services import create_secret, delete_secret, update_secret
from tests.api.base import client_for
from tests.control.drive import launch, wait_status

VALUE = "hf_9c1e-project-secret-value"
ROTATED = "hf_2b7d-rotated-secret-value"
SECRETS = "/api/v1/project-secrets/"
TASKS = "/api/v1/tasks/"


@pytest.fixture
def secret(world) -> ProjectSecret:
    return create_secret(world.owner, world.project, "HF_TOKEN", VALUE, "the model hub")


def submit(world, refs, **fields) -> Task:
    fields.setdefault("command", "echo hi")
    return submit_task(
        world.member, project=world.project, queue="high", name="job", kind="training", secret_refs=refs, **fields
    )


# --- the secret itself ---------------------------------------------------------------------------


def test_a_secret_is_stored_encrypted_and_never_in_its_repr(world, secret):
    with connection.cursor() as cursor:
        cursor.execute("SELECT value FROM vdc_projectsecret WHERE id = %s", [secret.pk])
        (stored,) = cursor.fetchone()
    assert VALUE not in stored and stored
    assert ProjectSecret.objects.get(pk=secret.pk).get_value() == VALUE
    assert VALUE not in repr(secret) + str(secret)
    assert secret.created_by == world.owner and secret.updated_by == world.owner


@pytest.mark.parametrize("role", ["member", "viewer", "outsider"])
def test_only_owners_and_admins_manage_secrets(world, secret, role):
    user = world.user(role)
    with pytest.raises(PermissionDenied):
        create_secret(user, world.project, "OTHER", "x")
    with pytest.raises(PermissionDenied):
        update_secret(user, secret, value="y")
    with pytest.raises(PermissionDenied):
        delete_secret(user, secret)
    assert ProjectSecret.objects.get().get_value() == VALUE
    assert create_secret(world.admin, world.project, "OTHER", "x").project == world.project


@pytest.mark.parametrize(
    ("name", "value", "field", "message"),
    [
        ("HF_TOKEN", "x", "name", "already has a secret HF_TOKEN"),
        ("hf-token", "x", "name", "letters, digits and underscores"),
        ("1TOKEN", "x", "name", "letters, digits and underscores"),
        ("TOKEN", "", "value", "non-empty"),
        ("TOKEN", "a\x00b", "value", "NUL"),
        ("TOKEN", "x" * 40_000, "value", "at most 32768"),
    ],
)
def test_a_bad_secret_is_refused_and_nothing_written(world, secret, name, value, field, message):
    with pytest.raises(ValidationError) as refused:
        create_secret(world.owner, world.project, name, value)
    assert message in str(refused.value.message_dict[field])
    assert ProjectSecret.objects.count() == 1


# --- the API -------------------------------------------------------------------------------------


def test_api_never_answers_a_value_to_anyone(world, secret):
    created = client_for(world.owner).post(
        SECRETS,
        {"project": world.project.pk, "name": "REGISTRY", "value": "reg-p4ss-771", "description": "r"},
        format="json",
    )
    assert created.status_code == 201, created.data
    assert "value" not in created.data and "reg-p4ss-771" not in json.dumps(created.data)
    rotated = client_for(world.owner).patch(f"{SECRETS}{secret.pk}/", {"value": ROTATED}, format="json")
    assert rotated.status_code == 200 and ROTATED not in json.dumps(rotated.data)
    for user in (world.owner, world.member, world.viewer, world.admin, world.outsider):
        client = client_for(user)
        for url in (SECRETS, f"{SECRETS}{secret.pk}/", f"/api/v1/projects/{world.project.pk}/secrets/"):
            answer = client.get(url)
            assert answer.status_code in (200, 404), (url, answer.status_code)
            body = answer.content.decode()
            assert VALUE not in body and ROTATED not in body and "reg-p4ss-771" not in body
    names = [
        row["name"] for row in client_for(world.viewer).get(SECRETS, {"project": world.project.pk}).data["results"]
    ]
    assert names == ["HF_TOKEN", "REGISTRY"]
    assert client_for(world.outsider).get(SECRETS).data["results"] == []


def test_api_rotates_a_value_and_refuses_a_rename(world, secret):
    client = client_for(world.owner)
    assert client.patch(f"{SECRETS}{secret.pk}/", {"value": ROTATED}, format="json").status_code == 200
    assert ProjectSecret.objects.get().get_value() == ROTATED
    renamed = client.patch(f"{SECRETS}{secret.pk}/", {"name": "OTHER"}, format="json")
    assert renamed.status_code == 400 and "tasks refer to a secret" in str(renamed.data["name"])
    assert client_for(world.member).patch(f"{SECRETS}{secret.pk}/", {"value": "x"}, format="json").status_code == 403
    assert ProjectSecret.objects.get().name == "HF_TOKEN" and ProjectSecret.objects.get().get_value() == ROTATED
    missing = client.post(SECRETS, {"project": world.project.pk, "name": "EMPTY"}, format="json")
    assert missing.status_code == 400 and "value" in missing.data


def test_a_secret_that_waiting_or_running_tasks_need_is_not_deleted(world, secret):
    task = submit(world, [{"secret": "HF_TOKEN", "env": "HF_TOKEN"}])
    refused = client_for(world.owner).delete(f"{SECRETS}{secret.pk}/")
    assert refused.status_code == 400
    assert f"#{task.pk} job" in str(refused.data) and "Stop them" in str(refused.data)
    assert ProjectSecret.objects.filter(pk=secret.pk).exists()
    stop_task(task, world.member)
    assert client_for(world.owner).delete(f"{SECRETS}{secret.pk}/").status_code == 204
    assert not ProjectSecret.objects.exists()


# --- tasks referring to secrets ------------------------------------------------------------------


def test_a_task_refers_to_secrets_by_name_only(world, secret):
    response = client_for(world.member).post(
        TASKS,
        {
            "project": "alpha",
            "queue": "high",
            "name": "job",
            "kind": "training",
            "command": "echo hi",
            "secret_refs": [
                {"secret": "HF_TOKEN", "env": "HUGGING_FACE_HUB_TOKEN"},
                {"secret": "HF_TOKEN", "file": "/run/secrets/hf"},
            ],
        },
        format="json",
    )
    assert response.status_code == 201, response.data
    assert response.data["secret_refs"][1] == {"secret": "HF_TOKEN", "file": "/run/secrets/hf"}
    task = Task.objects.get()
    for user in (world.viewer, world.member, world.admin):
        for url in (f"{TASKS}{task.pk}/", f"{TASKS}{task.pk}/events/"):
            assert VALUE not in client_for(user).get(url).content.decode()
    assert VALUE not in repr(list(TaskEvent.objects.values_list("message", "data")))


def test_an_unknown_secret_is_a_400_naming_it_and_those_that_exist(world, secret):
    create_secret(world.owner, world.project, "REGISTRY", "r")
    response = client_for(world.member).post(
        TASKS,
        {
            "project": "alpha",
            "queue": "high",
            "name": "job",
            "kind": "training",
            "command": "echo hi",
            "secret_refs": [{"secret": "WANDB_KEY", "env": "WANDB_API_KEY"}],
        },
        format="json",
    )
    assert response.status_code == 400
    message = str(response.data["secret_refs"])
    assert "has no secret WANDB_KEY" in message and "HF_TOKEN, REGISTRY" in message
    assert not Task.objects.exists()


@pytest.mark.parametrize(
    ("refs", "message"),
    [
        ({"secret": "HF_TOKEN"}, "Expected a list"),
        ([{"secret": "HF_TOKEN"}], "either env or file"),
        ([{"secret": "HF_TOKEN", "env": "A", "file": "/run/a"}], "either env or file"),
        ([{"secret": "hf token", "env": "A"}], "expected a secret name"),
        ([{"secret": "HF_TOKEN", "env": "A-B"}], "Expected variable names"),
        ([{"secret": "HF_TOKEN", "env": "HCS_TOKEN"}], "reserved"),
        ([{"secret": "HF_TOKEN", "env": "EPOCHS"}], "also set by env or secret_env"),
        ([{"secret": "HF_TOKEN", "env": "API_TOKEN"}], "also set by env or secret_env"),
        ([{"secret": "HF_TOKEN", "env": "T"}, {"secret": "HF_TOKEN", "env": "T"}], "also set by another reference"),
        ([{"secret": "HF_TOKEN", "file": "run/hf"}], "absolute path"),
        ([{"secret": "HF_TOKEN", "file": "/run/../etc/hf"}], "plain path"),
        ([{"secret": "HF_TOKEN", "file": "/etc/hf"}], "expected a path outside"),
        ([{"secret": "HF_TOKEN", "file": "/usr/lib/hf"}], "expected a path outside"),
        ([{"secret": "HF_TOKEN", "file": "/run/hcs-job.env"}], "the platform's"),
        ([{"secret": "HF_TOKEN", "file": "/hcs/checkpoint/hf"}], "the platform's"),
        ([{"secret": "HF_TOKEN", "file": "/run/a/hf"}, {"secret": "HF_TOKEN", "file": "/tmp/hf"}], "same file name"),
        ([{"secret": "HF_TOKEN", "file": "/tmp"}], "would replace the job's directory /tmp; expected a file in"),
        ([{"secret": "HF_TOKEN", "file": "/var"}], "would replace the job's directory /var/tmp"),
        ([{"secret": "HF_TOKEN", "file": "/run"}], "would replace the job's directory /run"),
        ([{"secret": "HF_TOKEN", "file": "/a/hf"}, {"secret": "HF_TOKEN", "file": "/a/hf/b"}], "cannot both be files"),
        ([{"secret": "HF_TOKEN", "file": "/workspace/ckpt/hf"}], "in the checkpoint directory /workspace/ckpt"),
        ([{"secret": "HF_TOKEN", "file": "/workspace/ckpt"}], "in the checkpoint directory /workspace/ckpt"),
        ([{"secret": "HF_TOKEN", "file": "/workspace"}], "in the checkpoint directory /workspace/ckpt"),
    ],
)
def test_bad_secret_references_are_refused_and_nothing_written(world, secret, refs, message):
    with pytest.raises(ValidationError) as refused:
        submit(world, refs, env={"EPOCHS": "3"}, secret_env={"API_TOKEN": "t"}, checkpoint_path="/workspace/ckpt")
    assert message in str(refused.value.message_dict["secret_refs"])
    assert not Task.objects.exists()


def test_the_form_reads_variable_and_file_lines():
    assert parse_secret_refs("HF=HF_TOKEN\n# note\n/run/secrets/r = REGISTRY\n") == [
        {"secret": "HF_TOKEN", "env": "HF"},
        {"secret": "REGISTRY", "file": "/run/secrets/r"},
    ]
    with pytest.raises(ValidationError, match="VARIABLE=SECRET"):
        parse_secret_refs("HF_TOKEN")


def test_submit_page_takes_secret_references(client, world, secret):
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
        "secret_refs": "HF=HF_TOKEN\n/run/secrets/hf=HF_TOKEN",
        "framework": "pytorch",
        "kind": "training",
        "max_retries": "0",
    }
    assert b'name="secret_refs"' in client.get("/training-jobs/new/").content
    unknown = client.post("/training-jobs/new/", {**form, "secret_refs": "HF=NOPE"})
    assert unknown.status_code == 200 and b"has no secret NOPE" in unknown.content
    response = client.post("/training-jobs/new/", form)
    assert response.status_code == 302, response.content.decode()[-2000:]
    task = Task.objects.get()
    assert task.secret_refs == [{"secret": "HF_TOKEN", "env": "HF"}, {"secret": "HF_TOKEN", "file": "/run/secrets/hf"}]
    page = client.get(f"/task-monitoring/{task.pk}/")
    assert b"HF_TOKEN" in page.content and b"/run/secrets/hf" in page.content and VALUE.encode() not in page.content


# --- the job -------------------------------------------------------------------------------------


def test_each_attempt_gets_the_value_the_secret_has_when_it_starts(world, secret):
    task = submit(world, [{"secret": "HF_TOKEN", "env": "HF"}, {"secret": "HF_TOKEN", "file": "/run/secrets/hf"}])
    run_cycle(world.vdc.pk)
    task.refresh_from_db()
    spec = job_spec(task, "install")
    assert spec.secret_env["HF"] == VALUE and spec.secret_files == {"/run/secrets/hf": VALUE}
    assert "HF" not in spec.env and VALUE not in repr(spec)
    update_secret(world.owner, secret, value=ROTATED)
    again = job_spec(task, "install")
    assert again.secret_env["HF"] == ROTATED and again.secret_files == {"/run/secrets/hf": ROTATED}


def test_a_secret_gone_before_launch_fails_the_attempt_with_its_name(world, secret):
    task = submit(world, [{"secret": "HF_TOKEN", "env": "HF"}])
    run_cycle(world.vdc.pk)
    task.refresh_from_db()
    ProjectSecret.objects.all().delete()  # bypasses the service's rule, as a database restore could
    with pytest.raises(ExecutorError, match="has no secret HF_TOKEN any more") as failed:
        job_spec(task, "install")
    assert failed.value.retryable is False


def test_a_local_job_reads_its_secret_as_a_variable_and_an_owner_only_file(world, settings, tmp_path, secret):
    settings.HCS_LOCAL_EXECUTOR_DIR = tmp_path / "local-jobs"
    # The command holds a digest of the value, not the value: it shows on the host's command lines.
    digest = hashlib.sha256(VALUE.encode()).hexdigest()
    command = (
        f'test "$(printf %s "$HF" | sha256sum)" = "{digest}  -" && echo env-ok; '
        f'test "$(sha256sum < /run/secrets/hf)" = "{digest}  -" && echo file-ok; '
        'echo "mode=$(stat -c %a /run/secrets/hf) owner=$(stat -c %u /run/secrets/hf) me=$(id -u)"; '
        "sleep 3"
    )
    task = submit(
        world,
        [{"secret": "HF_TOKEN", "env": "HF"}, {"secret": "HF_TOKEN", "file": "/run/secrets/hf"}],
        command=command,
        gpu_spec="1(A100)",
    )
    run_cycle(world.vdc.pk)
    launch(task)
    task = wait_status(task, "running")
    try:
        # Neither on any command line of the host nor in any file the portal keeps for the job.
        command_lines = []
        for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
            with contextlib.suppress(OSError):
                command_lines.append(cmdline.read_bytes())
        assert not [line for line in command_lines if VALUE.encode() in line]
        for path in Path(settings.HCS_LOCAL_EXECUTOR_DIR).rglob("*"):
            if path.is_file():
                assert VALUE.encode() not in path.read_bytes(), path
        task = wait_status(task, "completed")
    finally:
        executor_for(task.cluster).kill(task.external_id)
    log = executor_for(task.cluster).logs(task.external_id)
    assert "env-ok" in log and "file-ok" in log, log
    job_uid = pwd.getpwnam("hcs-job").pw_uid if os.geteuid() == 0 else os.geteuid()
    assert f"mode=400 owner={job_uid} me={job_uid}" in log


# --- the admin -----------------------------------------------------------------------------------


def test_admin_never_renders_a_value_and_stores_a_rotation(client, world, secret):
    client.force_login(world.admin)
    url = f"/admin/vdc/projectsecret/{secret.pk}/change/"
    page = client.get(url)
    assert page.status_code == 200 and b"HF_TOKEN" in page.content and VALUE.encode() not in page.content
    response = client.post(url, {"description": "rotated", "new_value": ROTATED})
    assert response.status_code == 302, response.content.decode()[-1500:]
    assert ProjectSecret.objects.get().get_value() == ROTATED
    kept = client.post(url, {"description": "kept", "new_value": ""})
    assert kept.status_code == 302 and ProjectSecret.objects.get().get_value() == ROTATED
    assert ROTATED.encode() not in client.get(url).content
    new = {"project": world.project.pk, "name": "REGISTRY", "description": "", "new_value": "reg-9"}
    added = client.post("/admin/vdc/projectsecret/add/", new)
    assert added.status_code == 302 and ProjectSecret.objects.get(name="REGISTRY").get_value() == "reg-9"
    empty = client.post(
        "/admin/vdc/projectsecret/add/", {"project": world.project.pk, "name": "EMPTY", "new_value": ""}
    )
    assert empty.status_code == 200 and not ProjectSecret.objects.filter(name="EMPTY").exists()


def test_admin_refuses_to_delete_a_secret_a_waiting_task_needs(client, world, secret):
    task = submit(world, [{"secret": "HF_TOKEN", "env": "HF"}])
    client.force_login(world.admin)
    url = f"/admin/vdc/projectsecret/{secret.pk}/delete/"
    page = client.get(url)
    assert f"#{task.pk} job".encode() in page.content
    client.post(url, {"post": "yes"})
    assert ProjectSecret.objects.filter(pk=secret.pk).exists()
