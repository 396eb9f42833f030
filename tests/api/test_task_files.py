"""Task files: the JSON Schema the API serves (and its copy in docs/), unknown keys refused by name, a task's
downloaded task file submitted again as an equal task, and the submit pages' "Submit again" and upload."""

from __future__ import annotations

import json
from datetime import timedelta
from decimal import Decimal
from pathlib import Path

import jsonschema
import pytest
import yaml
from django.core.files.uploadedfile import SimpleUploadedFile
from django.core.management import call_command

from apps.tasks.api.file_schema import task_file_schema
from apps.tasks.models import Task
from apps.tasks.services import SUBMIT_FIELDS
from tests.api.base import client_for
from tests.factories import ClusterFactory, node_with_every_model

TASKS = "/api/v1/tasks/"
SCHEMA_URL = "/api/v1/tasks/file-schema/"
DOCS_COPY = Path(__file__).resolve().parents[2] / "docs" / "task-file.schema.json"
SECRET = "s3cr3t-value-never-shown"


@pytest.fixture(autouse=True)
def kubernetes(world):
    """Elastic jobs and volume claims run where a backend resizes jobs and mounts claims: a Kubernetes cluster."""
    node_with_every_model(ClusterFactory(vdc=world.vdc, name="k8s-1", cluster_type="kubernetes"))


def full_body(**fields) -> dict:
    return {
        "name": "resnet",
        "kind": "training",
        "project": "alpha",
        "queue": "medium",
        "gpu_spec": "1(A100)",
        "cpu": 2,
        "memory_gib": "4.5",
        "instances": 2,
        "elastic_min": 1,
        "elastic_max": 3,
        "scaling": 0.9,
        "expected_duration": "90m",
        "wall_time": "3h",
        "preemptible": False,
        "required_labels": {"zone": "east"},
        "image": "pytorch/pytorch:2.3.0",
        "command": "python train.py --lr 0.1",
        "env": {"EPOCHS": "3"},
        "secret_env": {"WANDB_API_KEY": SECRET},
        "volumes": [{"name": "data", "mount_path": "/data", "claim_name": "datasets", "read_only": True}],
        "framework": "pytorch",
        "epochs": 3,
        "batch_size": 32,
        "max_retries": 2,
        **fields,
    }


def submitted(task: Task) -> dict:
    """What a submission set on a task (secret values aside)."""
    return {field: getattr(task, field) for field in SUBMIT_FIELDS} | {
        "project": task.project_id,
        "vdc": task.vdc_id,
        "queue": task.queue_id,
        "secret_env_names": task.secret_env_names,
    }


def test_the_schema_is_served_standalone_and_the_docs_copy_is_current(world, tmp_path):
    response = client_for(world.viewer).get(SCHEMA_URL)
    assert response.status_code == 200
    schema = response.json()
    jsonschema.Draft202012Validator.check_schema(schema)
    assert "$ref" not in json.dumps(schema) and "nullable" not in json.dumps(schema)
    assert schema["additionalProperties"] is False
    assert set(schema["properties"]) == {*SUBMIT_FIELDS, "project", "vdc", "queue", "secret_env", "preferred_clusters"}
    assert set(schema["required"]) == {"name", "kind", "project"}
    # Regenerate with: python manage.py task_file_schema --file docs/task-file.schema.json
    assert json.loads(DOCS_COPY.read_text()) == schema == task_file_schema()
    call_command("task_file_schema", "--file", str(tmp_path / "schema.json"))
    assert (tmp_path / "schema.json").read_text() == DOCS_COPY.read_text()
    assert client_for(None).get(SCHEMA_URL).status_code in (401, 403)

    validator = jsonschema.Draft202012Validator(schema)
    assert not list(validator.iter_errors(full_body(epochs=None)))
    errors = [e.message for e in validator.iter_errors(full_body(gpus=2))]
    assert errors == ["Additional properties are not allowed ('gpus' was unexpected)"]


def test_an_unknown_key_is_refused_by_name_and_nothing_is_written(world):
    response = client_for(world.member).post(TASKS, full_body(gpus=2, Image="x"), format="json")
    assert response.status_code == 400
    assert set(response.data) == {"gpus", "Image"}
    assert "Unknown key: expected only the fields of a task submission" in str(response.data["gpus"][0])
    assert SCHEMA_URL in str(response.data["gpus"][0])
    # Answer fields are no submission fields either.
    response = client_for(world.member).post(TASKS, full_body(status="running"), format="json")
    assert response.status_code == 400 and list(response.data) == ["status"]
    assert not Task.objects.exists()


def test_a_downloaded_task_file_submits_an_equal_task_and_holds_no_secret_value(world, client):
    response = client_for(world.member).post(TASKS, full_body(), format="json")
    assert response.status_code == 201, response.data
    task = Task.objects.get(pk=response.data["id"])
    assert (task.expected_duration, task.cpu, task.scaling) == (timedelta(minutes=90), Decimal(2), 0.9)

    client.force_login(world.member)
    download = client.get(f"/tasks/{task.pk}/task.yaml")
    assert download.status_code == 200
    assert download["Content-Type"].startswith("application/yaml")
    assert download["Content-Disposition"] == f'attachment; filename="task-{task.pk}.yaml"'
    text = download.content.decode()
    assert SECRET not in text and "secret_env:" not in text
    assert "# Secret variables left out (values are never shown): WANDB_API_KEY" in text
    data = yaml.safe_load(text)
    assert data["project"] == "alpha" and data["queue"] == "medium" and data["vdc"] == "main"
    assert "ide_type" not in data and "port" not in data  # defaults are left out
    jsonschema.validate(data, task_file_schema())
    # The API gives the same file as JSON (what `hcs task-file` prints), to anyone who may see the task.
    assert client_for(world.viewer).get(f"{TASKS}{task.pk}/task-file/").json() == data
    assert client_for(world.outsider).get(f"{TASKS}{task.pk}/task-file/").status_code == 404

    again = client_for(world.member).post(TASKS, {**data, "secret_env": {"WANDB_API_KEY": "other"}}, format="json")
    assert again.status_code == 201, again.data
    assert submitted(Task.objects.get(pk=again.data["id"])) == submitted(task)
    # The page shows the same file and, for a member, Submit again.
    page = client.get(f"/task-monitoring/{task.pk}/").content.decode()
    assert f'href="/training-jobs/new/?from={task.pk}"' in page and "Download task.yaml" in page
    assert SECRET not in page
    client.force_login(world.viewer)
    page = client.get(f"/task-monitoring/{task.pk}/").content.decode()
    assert "Download task.yaml" in page and "Submit again" not in page
    client.force_login(world.outsider)
    assert client.get(f"/tasks/{task.pk}/task.yaml").status_code == 404


def test_submit_again_fills_the_form_and_keeps_fields_it_has_no_input_for(world, client):
    task = Task.objects.get(pk=client_for(world.member).post(TASKS, full_body(), format="json").data["id"])
    client.force_login(world.member)
    page = client.get(f"/training-jobs/new/?from={task.pk}")
    assert page.status_code == 200
    form = page.context["form"]
    assert form.initial["name"] == "resnet" and form.initial["project"] == world.project.pk
    assert form.initial["queue"] == world.medium.pk and form.initial["env"] == "EPOCHS=3"
    assert form.initial["volumes"] == "datasets:/data:ro"
    assert json.loads(form.initial["carried"]) == {"required_labels": {"zone": "east"}, "scaling": 0.9}
    html = page.content.decode()
    assert f"Filled from task #{task.pk} resnet" in html and SECRET not in html
    assert "Kept from the task file (no field here): required_labels: {&quot;zone&quot;: &quot;east&quot;}" in html

    # Posting the filled form as it is gives the same task (the secret variable aside, which is not copied).
    fields = {name: form[name].value() for name in form.fields}
    body = {k: "" if v is None else v for k, v in fields.items() if v is not False}
    response = client.post("/training-jobs/new/", body)
    assert response.status_code == 302, response.context["form"].errors
    clone = Task.objects.exclude(pk=task.pk).get()
    assert submitted(clone) | {"secret_env_names": []} == submitted(task) | {
        "secret_env_names": [],
        "volumes": [{**task.volumes[0], "name": "vol-1"}],
    }


def test_an_uploaded_task_file_is_submitted_or_refused_naming_the_key(world, client):
    client.force_login(world.member)
    text = yaml.safe_dump(full_body(name="uploaded", secret_env={}))
    response = client.post("/training-jobs/new/", {"task_file": SimpleUploadedFile("job.yaml", text.encode())})
    task = Task.objects.get(name="uploaded")
    assert response.status_code == 302 and response["Location"] == f"/task-monitoring/{task.pk}/"
    assert task.required_labels == {"zone": "east"} and task.owner == world.member

    bad = json.dumps(full_body(name="refused", gpus=2)).encode()
    response = client.post("/inference-services/new/", {"task_file": SimpleUploadedFile("job.json", bad)})
    assert response.status_code == 200
    assert response.context["upload_errors"] == [
        "Task file job.json: gpus: Unknown key: expected only the fields of a task submission (the task file "
        f"schema, {SCHEMA_URL})."
    ]
    assert "The task file was not submitted" in response.content.decode()
    response = client.post("/training-jobs/new/", {"task_file": SimpleUploadedFile("job.yaml", b"name: [unclosed\n")})
    assert response.context["upload_errors"] == [
        "Task file job.yaml: Expected a task file in YAML or JSON; it does not parse at line 2, column 1."
    ]
    typo = yaml.safe_dump(full_body(name="x", gpu_spec="2x(V100)")).encode()
    response = client.post("/training-jobs/new/", {"task_file": SimpleUploadedFile("job.yaml", typo)})
    (message,) = response.context["upload_errors"]
    assert message.startswith("Task file job.yaml: gpu_spec: expected a count such as 2 or 0.5 before '('")
    assert response.context["form"].initial["gpu_spec"] == "2x(V100)"
    client.force_login(world.viewer)
    response = client.post("/training-jobs/new/", {"task_file": SimpleUploadedFile("job.yaml", text.encode())})
    assert response.context["upload_errors"] == ["Task file job.yaml: Viewers of project alpha cannot submit tasks."]
    assert list(Task.objects.values_list("name", flat=True)) == ["uploaded"]
