"""Task templates through the API and the service: who writes them, what a task file may hold, submitting from
one (roles, overrides, the same checks as POST /tasks/), saving a task as one."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.core.exceptions import PermissionDenied, ValidationError

from apps.tasks import task_templates
from apps.tasks.models import Task, TaskTemplate
from apps.vdc.services import create_secret
from tests.api.base import client_for
from tests.factories import TaskFactory

TEMPLATES = "/api/v1/task-templates/"
TASK_FILE = {
    "kind": "training",
    "queue": "high",
    "gpu_spec": "1(A100)",
    "command": "python train.py",
    "env": {"EPOCHS": "3", "LR": "0.1"},
}


def create(world, user=None, **fields):
    body = {"project": "alpha", "name": "resnet", "description": "ResNet-50", "task_file": TASK_FILE, **fields}
    return client_for(user or world.owner).post(TEMPLATES, body, format="json")


@pytest.fixture
def template(world):
    return task_templates.create_template(world.owner, world.project, "resnet", dict(TASK_FILE), "ResNet-50")


def test_an_owner_creates_a_template_and_everyone_in_the_project_reads_it(world):
    response = create(world)
    assert response.status_code == 201, response.data
    created = TaskTemplate.objects.get()
    assert created.project == world.project and created.created_by == world.owner
    assert created.task_file == TASK_FILE and response.data["kind"] == "training"
    for role in ("owner", "member", "viewer", "admin"):
        listed = client_for(world.user(role)).get(TEMPLATES).data["results"]
        assert [row["name"] for row in listed] == ["resnet"], role
    assert client_for(world.outsider).get(TEMPLATES).data["results"] == []
    assert client_for(world.outsider).get(f"{TEMPLATES}{created.pk}/").status_code == 404


@pytest.mark.parametrize("role", ["member", "viewer"])
def test_members_and_viewers_do_not_write_templates(world, template, role):
    user = world.user(role)
    assert create(world, user, name="other").status_code == 403
    # Refused before the body is read: a bad body gets the same 403.
    assert create(world, user, name="other", task_file={"gpus": 1}).status_code == 403
    client = client_for(user)
    assert client.patch(f"{TEMPLATES}{template.pk}/", {"description": "x"}, format="json").status_code == 403
    assert client.delete(f"{TEMPLATES}{template.pk}/").status_code == 403
    assert TaskTemplate.objects.get().description == "ResNet-50"


def test_an_outsider_cannot_create_in_a_project_it_cannot_see(world):
    response = create(world, world.outsider)
    assert response.status_code == 400 and "project" in response.data


@pytest.mark.parametrize(
    ("task_file", "key", "words"),
    [
        ({**TASK_FILE, "gpus": 2}, "gpus", "Unknown key"),
        ({**TASK_FILE, "status": "running"}, "status", "Read-only"),
        ({**TASK_FILE, "gpu_spec": "2(NOPE"}, "gpu_spec", ""),
        ({**TASK_FILE, "cpu": "lots"}, "cpu", ""),
        ({**TASK_FILE, "secret_env": {"WANDB_API_KEY": "s3cret"}}, "secret_env", "never kept"),
        ({**TASK_FILE, "project": "beta"}, "project", "its project, alpha"),
        ({"command": "python x.py"}, "kind", ""),
        ({**TASK_FILE, "secret_refs": [{"secret": "NOPE", "env": "NOPE"}]}, "secret_refs", "NOPE"),
    ],
)
def test_a_bad_task_file_is_refused_naming_the_field(world, task_file, key, words):
    response = create(world, task_file=task_file)
    assert response.status_code == 400, response.data
    assert key in response.data["task_file"], response.data
    assert words in str(response.data["task_file"][key])
    assert "s3cret" not in str(response.data)
    assert not TaskTemplate.objects.exists()


def test_a_task_file_that_is_no_mapping_is_refused(world):
    response = create(world, task_file=["kind", "training"])
    assert response.status_code == 400 and "task_file" in response.data


def test_a_name_is_unique_within_its_project(world, template):
    response = create(world)
    assert response.status_code == 400 and "already has a template resnet" in str(response.data["name"])
    other = TaskTemplate.objects.create(project=world.other_project, name="resnet", task_file={"kind": "training"})
    assert other.pk  # another project may use the name


def test_an_owner_changes_and_deletes_a_template(world, template):
    client = client_for(world.owner)
    url = f"{TEMPLATES}{template.pk}/"
    response = client.patch(url, {"name": "resnet50", "task_file": {**TASK_FILE, "epochs": 5}}, format="json")
    assert response.status_code == 200, response.data
    template.refresh_from_db()
    assert template.name == "resnet50" and template.task_file["epochs"] == 5
    response = client.patch(url, {"task_file": {**TASK_FILE, "gpu_spec": "1(("}}, format="json")
    assert response.status_code == 400 and "gpu_spec" in response.data["task_file"]
    response = client.patch(url, {"project": world.other_project.pk}, format="json")
    assert response.status_code == 400
    assert client.delete(url).status_code == 204
    assert not TaskTemplate.objects.exists()


def test_filters_by_project_and_name(world, template):
    TaskTemplate.objects.create(project=world.project, name="bert", task_file={"kind": "training"})
    client = client_for(world.member)
    names = lambda params: [row["name"] for row in client.get(TEMPLATES, params).data["results"]]  # noqa: E731
    assert names({"project": world.project.pk}) == ["bert", "resnet"]
    assert names({"project_name": "alpha", "name": "bert"}) == ["bert"]
    assert names({"name__icontains": "res"}) == ["resnet"]
    assert names({"project": world.other_project.pk}) == []


@pytest.mark.parametrize("role", ["owner", "member"])
def test_owners_and_members_submit_from_a_template(world, template, role):
    response = client_for(world.user(role)).post(f"{TEMPLATES}{template.pk}/submit/", {}, format="json")
    assert response.status_code == 201, response.data
    task = Task.objects.get(pk=response.data["id"])
    assert task.name == "resnet" and task.project == world.project and task.owner == world.user(role)
    assert task.queue == world.high and task.gpu_spec == "1(A100)" and task.env == TASK_FILE["env"]
    assert response.data["events"] and "notice" in response.data


def test_overrides_change_the_fields_and_join_the_variables(world, template):
    body = {"name": "resnet-lr", "queue": "low", "env": {"LR": "0.01"}, "secret_env": {"TOKEN": "t0k"}}
    response = client_for(world.member).post(f"{TEMPLATES}{template.pk}/submit/", body, format="json")
    assert response.status_code == 201, response.data
    task = Task.objects.get(pk=response.data["id"])
    assert task.name == "resnet-lr" and task.queue == world.low
    assert task.env == {"EPOCHS": "3", "LR": "0.01"} and task.secret_env_names == ["TOKEN"]
    template.refresh_from_db()
    assert "secret_env" not in template.task_file and template.task_file["env"]["LR"] == "0.1"


def test_a_submission_from_a_template_is_checked_as_a_submit(world, template):
    client = client_for(world.member)
    url = f"{TEMPLATES}{template.pk}/submit/"
    response = client.post(url, {"gpu_spec": "3(("}, format="json")
    assert response.status_code == 400 and "gpu_spec" in response.data
    response = client.post(url, {"gpus": 1}, format="json")
    assert response.status_code == 400 and "gpus" in response.data
    response = client.post(url, {"project": "beta"}, format="json")
    assert response.status_code == 400 and "project" in response.data
    response = client.post(url, ["not", "an", "object"], format="json")
    assert response.status_code == 400
    assert not Task.objects.exists()


def test_viewers_cannot_submit_and_outsiders_do_not_see_the_template(world, template):
    url = f"{TEMPLATES}{template.pk}/submit/"
    assert client_for(world.viewer).post(url, {}, format="json").status_code == 403
    assert client_for(world.outsider).post(url, {}, format="json").status_code == 404
    assert not Task.objects.exists()


def test_a_submit_with_an_idempotency_key_creates_one_task(world, template):
    client = client_for(world.member)
    url = f"{TEMPLATES}{template.pk}/submit/"
    first = client.post(url, {}, format="json", HTTP_IDEMPOTENCY_KEY="k-1")
    again = client.post(url, {}, format="json", HTTP_IDEMPOTENCY_KEY="k-1")
    assert first.status_code == again.status_code == 201
    assert first.data["id"] == again.data["id"] and Task.objects.count() == 1


def test_a_task_saved_as_a_template_keeps_no_secret_value(world):
    create_secret(world.owner, world.project, "HF_TOKEN", "hf_value")
    task = TaskFactory(
        project=world.project,
        vdc=world.vdc,
        queue=world.medium,
        owner=world.member,
        name="bert",
        kind="training",
        command="python bert.py",
        expected_duration=timedelta(hours=1),
        secret_refs=[{"secret": "HF_TOKEN", "env": "HF_TOKEN"}],
    )
    task.set_secret_env({"WANDB_API_KEY": "wandb-s3cret"})
    task.save()
    saved = task_templates.template_from_task(world.owner, task, "bert-base", "from a good run")
    assert "secret_env" not in saved.task_file and "project" not in saved.task_file
    assert "wandb-s3cret" not in str(saved.task_file) and "hf_value" not in str(saved.task_file)
    assert saved.task_file["secret_refs"] == [{"secret": "HF_TOKEN", "env": "HF_TOKEN"}]
    assert saved.task_file["queue"] == "medium" and saved.kind == "training"
    with pytest.raises(PermissionDenied):
        task_templates.template_from_task(world.member, task, "mine")
    with pytest.raises(ValidationError) as refused:
        task_templates.template_from_task(world.owner, task, "bert-base")
    assert "name" in refused.value.message_dict


def test_staff_write_only_with_the_permission(world, template):
    from tests.factories import staff_user

    reader = staff_user("ops-reader", "tasks.view_tasktemplate")
    with pytest.raises(PermissionDenied):
        task_templates.update_template(reader, template, description="x")
    writer = staff_user("ops-writer", "tasks.view_tasktemplate", "tasks.change_tasktemplate")
    task_templates.update_template(writer, template, description="kept by ops")
    assert TaskTemplate.objects.get().description == "kept by ops"
