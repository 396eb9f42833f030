"""Where the job finds its checkpoints and TensorBoard logs: what submission accepts (API, pages), what a
cluster's checkpoint settings take, and the job spec that carries both to the executors."""

from __future__ import annotations

import pytest

from apps.control.jobspec import job_spec
from apps.tasks.models import Task
from apps.tasks.services import submit_task
from tests.api.base import client_for

TASKS = "/api/v1/tasks/"


def submit(world, **fields):
    body = {"project": "alpha", "queue": "high", "name": "job", "kind": "training", "command": "echo hi", **fields}
    return client_for(world.member).post(TASKS, body, format="json")


@pytest.mark.parametrize("path", ["checkpoints", "/work/../etc", "/", "/usr/ckpt", "/proc/self", "/tmp/x", "/a//b"])
def test_a_checkpoint_path_must_be_a_plain_directory_outside_the_systems_trees(world, path):
    response = submit(world, checkpoint_path=path)
    assert response.status_code == 400 and "checkpoint_path" in response.data, response.data
    assert not Task.objects.exists()


@pytest.mark.parametrize("path", ["../tb", "runs/../tb", "./tb", "/work/../etc", "/", "/usr/tb", "/tmp/x", "/a//b"])
def test_a_tensorboard_dir_must_be_a_plain_path_outside_the_systems_trees(world, path):
    response = submit(world, tensorboard_dir=path)
    assert response.status_code == 400 and "tensorboard_dir" in response.data, response.data
    assert "/hcs/checkpoint/tb" in str(response.data["tensorboard_dir"])  # what would do
    assert not Task.objects.exists()


def test_checkpoint_path_and_tensorboard_dir_are_kept_and_returned(world):
    response = submit(world, checkpoint_path="/workspace/ckpt", tensorboard_dir="/workspace/ckpt/tb")
    assert response.status_code == 201, response.data
    assert (response.data["checkpoint_path"], response.data["tensorboard_dir"]) == (
        "/workspace/ckpt",
        "/workspace/ckpt/tb",
    )
    listed = client_for(world.viewer).get(TASKS, {"tensorboard_dir": "/workspace/ckpt/tb"}).data
    assert [t["id"] for t in listed["results"]] == [response.data["id"]]


def test_the_training_form_refuses_a_relative_checkpoint_path_next_to_the_field(client, world):
    client.force_login(world.member)
    data = {
        "name": "t",
        "project": world.project.pk,
        "kind": "training",
        "framework": "pytorch",
        "vdc": world.vdc.pk,
        "queue": world.high.pk,
        "gpu_spec": "1(A100)",
        "cpu": "1",
        "memory_gib": "2",
        "instances": "1",
        "max_retries": "0",
        "checkpoint_path": "ckpt",
        "command": "echo hi",
    }
    response = client.post("/training-jobs/new/", data)
    assert response.status_code == 200 and "absolute path" in str(response.context["form"].errors["checkpoint_path"])
    data.update(checkpoint_path="/workspace/ckpt", tensorboard_dir="/workspace/tb")
    assert client.post("/training-jobs/new/", data).status_code == 302
    assert Task.objects.get().tensorboard_dir == "/workspace/tb"


def test_the_job_spec_carries_the_task_uid_and_tensorboard_dir(world):
    task = submit_task(
        world.member,
        project=world.project,
        queue="high",
        kind="fine_tuning",
        name="ft",
        command="echo",
        tensorboard_dir="/tb",
        epochs=2,
    )
    task.cluster = world.cluster
    spec = job_spec(task, "inst")
    assert spec.task_uid == task.uid.hex and spec.settings["tensorboard_dir"] == "/tb" and spec.settings["epochs"] == 2
    assert spec.checkpoint_dir == ""  # the executor says where it is on its backend


def test_the_api_shows_and_checks_a_clusters_checkpoint_settings(world):
    api = client_for(world.admin)
    url = f"/api/v1/clusters/{world.cluster.pk}/"
    assert api.patch(url, {"checkpoint_root": "relative"}, format="json").status_code == 400
    response = api.patch(url, {"checkpoint_root": "/shared/ckpt", "checkpoint_size_gib": 20}, format="json")
    assert response.status_code == 200 and response.data["checkpoint_root"] == "/shared/ckpt"
