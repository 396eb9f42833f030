"""Bad submissions through the API: a 400 naming the field and what was expected, and nothing written.

The cases are the ones that passed validation before and then stopped scheduling cycles, gave a task
every card of its node, or failed at launch and were relaunched every minute.
"""

from __future__ import annotations

import pytest

from apps.tasks.models import Task, TaskEvent
from tests.api.base import client_for

TASKS = "/api/v1/tasks/"


def submit(world, **fields):
    body = {"project": "alpha", "queue": "high", "name": "job", "kind": "training", "command": "echo hi", **fields}
    return client_for(world.member).post(TASKS, body, format="json")


@pytest.mark.parametrize(
    ("field", "fields"),
    [
        ("expected_duration", {"expected_duration": "999999999 00:00:00"}),
        ("expected_duration", {"expected_duration": "-1 00:00:00"}),
        ("expected_duration", {"queue": "medium", "expected_duration": "30 00:00:00"}),
        ("instances", {"instances": 200_000, "cpu": "0", "memory_gib": "0", "gpu_spec": ""}),
        ("cpu", {"cpu": "0"}),
        ("elastic_max", {"elastic_min": 1, "elastic_max": 100_000}),
        ("autoscale_max", {"kind": "inference", "autoscale_min": 1, "autoscale_max": 100_000}),
        (
            "autoscale_concurrency",
            {"kind": "inference", "autoscale_min": 1, "autoscale_max": 2, "autoscale_concurrency": 20_000},
        ),
        ("epochs", {"epochs": 10**9}),
        ("batch_size", {"batch_size": 10**8}),
        ("max_tokens", {"kind": "inference", "max_tokens": 10**9}),
        ("max_retries", {"max_retries": 30_000}),
        ("port", {"kind": "inference", "port": 70_000}),
        ("env", {"gpu_spec": "1(A100)", "env": {"CUDA_VISIBLE_DEVICES": "0,1,2,3"}}),
        ("env", {"gpu_spec": "1(A100)", "env": {"NVIDIA_VISIBLE_DEVICES": "all"}}),
        ("env", {"env": {"A=B": "1"}}),
        ("env", {"env": {"": "1"}}),
        ("env", {"env": {"A": "x\u0000y"}}),
        ("volumes", {"volumes": [1, "a"]}),
        ("volumes", {"volumes": [{"mount_path": "/data", "claim_name": "datasets"}]}),
        ("volumes", {"volumes": [{"name": "root", "mount_path": "/host", "host_path": "/"}]}),
        ("required_labels", {"required_labels": {"gpu": ["a100"]}}),
        (
            "autoscale_latency_ms",
            {"kind": "inference", "autoscale_min": 1, "autoscale_max": 2, "autoscale_latency_ms": 0},
        ),
        ("scale_to_zero_after_s", {"scale_to_zero_after_s": 600}),
        ("scale_to_zero_after_s", {"kind": "inference", "scale_to_zero_after_s": 600}),
        ("scale_to_zero_after_s", {"kind": "inference", "port": 8000, "scale_to_zero_after_s": 5}),
    ],
    ids=[
        "999999999-days",
        "negative-duration",
        "over-the-queue-maximum",
        "200000-instances-of-nothing",
        "zero-cpu",
        "elastic",
        "autoscale",
        "autoscale-concurrency",
        "epochs",
        "batch-size",
        "max-tokens",
        "retries",
        "port",
        "cuda-visible-devices",
        "nvidia-visible-devices-all",
        "equals-in-env-name",
        "empty-env-name",
        "nul-in-env-value",
        "volumes-not-objects",
        "volume-without-name",
        "unapproved-host-path",
        "label-list",
        "autoscale-latency",
        "scale-to-zero-training",
        "scale-to-zero-without-port",
        "scale-to-zero-too-soon",
    ],
)
def test_bad_values_are_a_400_on_their_field_and_write_nothing(world, field, fields):
    response = submit(world, **fields)
    assert response.status_code == 400, response.data
    assert field in response.data, response.data
    message = str(response.data[field][0])
    assert any(word in message for word in ("xpected", "Ensure", "reserved", "not allowed")), message
    assert not Task.objects.exists() and not TaskEvent.objects.exists()


def test_every_problem_of_a_submission_is_reported_at_once(world):
    response = submit(world, queue="medium", env={"A=B": "1"}, volumes=[1])
    assert response.status_code == 400
    assert {"expected_duration", "env", "volumes"} <= set(response.data)


def test_a_valid_submission_within_every_bound_is_accepted(world):
    world.cluster.allowed_host_paths = ["/srv/data"]
    world.cluster.save()
    world.quota.limit_cpu, world.quota.limit_memory_gib = 2048, 32768
    world.quota.save()
    world.node.cpu, world.node.memory_gib = 1024, 16384
    world.node.save()
    response = submit(
        world,
        cpu="1024",
        memory_gib="16384",
        expected_duration="7 00:00:00",
        instances=1,
        epochs=1_000_000,
        env={"EPOCHS": "3", "LD_LIBRARY_PATH": "/opt/lib"},
        volumes=[{"name": "data", "mount_path": "/data", "host_path": "/srv/data/a", "read_only": True}],
    )
    assert response.status_code == 201, response.data
    assert response.data["volumes"][0]["host_path"] == "/srv/data/a"


def test_wall_time_is_bounded_by_the_queue_and_separate_from_the_expected_duration(world):
    admin = client_for(world.admin)
    url = f"/api/v1/queues/{world.high.pk}/"
    response = admin.patch(url, {"default_wall_time": "2 00:00:00", "max_wall_time": "1 00:00:00"}, format="json")
    assert response.status_code == 400 and "longest wall time" in str(response.data["default_wall_time"][0])
    response = admin.patch(url, {"default_wall_time": "02:00:00", "max_wall_time": "1 00:00:00"}, format="json")
    assert response.status_code == 200, response.data
    too_long = submit(world, wall_time="2 00:00:00")
    assert too_long.status_code == 400 and "longest wall time" in str(too_long.data["wall_time"][0])
    assert submit(world, wall_time="-00:01:00").status_code == 400
    defaulted = submit(world)
    assert defaulted.status_code == 201 and defaulted.data["wall_time"] == "02:00:00"
    own = submit(world, expected_duration="3 00:00:00", wall_time="12:00:00")
    assert own.status_code == 201 and (own.data["expected_duration"], own.data["wall_time"]) == (
        "3 00:00:00",
        "12:00:00",
    )


@pytest.mark.parametrize(
    ("text", "stored"),
    [
        ("10m", "00:10:00"),
        ("1h30m", "01:30:00"),
        ("2d", "2 00:00:00"),
        ("02:00:00", "02:00:00"),
        ("P1DT2H", "1 02:00:00"),
    ],
)
def test_the_api_takes_durations_as_the_pages_do(world, text, stored):
    response = submit(world, expected_duration=text, wall_time=text)
    assert response.status_code == 201, response.data
    assert response.data["expected_duration"] == response.data["wall_time"] == stored


@pytest.mark.parametrize("text", ["10x", "1h 30", "9999999d", "-5m"])
def test_durations_the_pages_would_refuse_are_a_400_saying_what_is_expected(world, text):
    response = submit(world, expected_duration=text)
    assert response.status_code == 400 and "expected_duration" in response.data
    assert not Task.objects.exists()


def test_queue_maximum_is_set_by_admins_through_the_api(world):
    url = f"/api/v1/queues/{world.high.pk}/"
    member = client_for(world.member).patch(url, {"max_expected_duration": "30 00:00:00"}, format="json")
    assert member.status_code == 403
    admin = client_for(world.admin)
    response = admin.patch(url, {"max_expected_duration": "400 00:00:00"}, format="json")
    assert response.status_code == 400 and "366 days" in str(response.data["max_expected_duration"][0])
    response = admin.patch(url, {"max_expected_duration": "30 00:00:00"}, format="json")
    assert response.status_code == 200 and response.data["max_expected_duration"] == "30 00:00:00"
    assert submit(world, expected_duration="30 00:00:00").status_code == 201


@pytest.mark.parametrize("paths", [["/"], ["data"], ["/data/../etc"], ["/data\u0000"], "/data"])
def test_cluster_host_path_prefixes_must_be_plain_absolute_paths(world, paths):
    response = client_for(world.admin).patch(
        f"/api/v1/clusters/{world.cluster.pk}/", {"allowed_host_paths": paths}, format="json"
    )
    assert response.status_code == 400 and "allowed_host_paths" in response.data
    world.cluster.refresh_from_db()
    assert world.cluster.allowed_host_paths == []


def test_cluster_host_path_prefixes_are_set_and_shown(world):
    url = f"/api/v1/clusters/{world.cluster.pk}/"
    response = client_for(world.admin).patch(url, {"allowed_host_paths": ["/data", "/scratch"]}, format="json")
    assert response.status_code == 200, response.data
    assert client_for(world.member).get(url).data["allowed_host_paths"] == ["/data", "/scratch"]


def test_a_submission_that_must_wait_for_others_says_so_and_one_that_can_start_does_not(world, client):
    # Admitted, but it can run only after others leave: the submitter is told at once.
    from apps.control.scheduling import run_cycle

    world.quota.limit_gpu = 16
    world.quota.save()
    first = submit(world, gpu_spec="6(A100)", name="big")
    assert first.status_code == 201 and first.data["notice"] == ""
    run_cycle(world.vdc.pk)
    second = submit(world, gpu_spec="4(A100)", name="second", queue="low")
    assert second.status_code == 201
    assert second.data["notice"] == (
        "It can start only after others leave: 2 of the 8 GPUs it can use are free now. "
        "Its page shows its position and estimated start."
    )
    third = submit(world, gpu_spec="1(A100)", name="third", queue="low")
    assert third.data["notice"].startswith("It can start only after others leave: 1 task waits ahead of it in queue")
    assert "big" not in third.data["notice"] and "second" not in third.data["notice"]  # counts, never names
    # The form says the same as a warning on the task's page.
    client.force_login(world.member)
    response = client.post(
        "/training-jobs/new/",
        {
            "name": "fourth",
            "project": world.project.pk,
            "vdc": world.vdc.pk,
            "queue": world.low.pk,
            "cpu": "1",
            "memory_gib": "1",
            "gpu_spec": "4(A100)",
            "instances": "1",
            "command": "sleep 1",
            "framework": "pytorch",
            "max_retries": "0",
            "kind": "training",
        },
        follow=True,
    )
    assert response.redirect_chain, response.context["form"].errors
    shown = [str(m) for m in response.context["messages"]]
    assert any(m.startswith("It can start only after others leave: 2 tasks wait ahead of it") for m in shown), shown


def test_a_mistyped_model_is_answered_with_the_models_the_vdc_has(world):
    # The hint named catalog models the VDC does not have (A10, A30 ... for "A10O").
    answer = submit(world, gpu_spec="1(A10O)")
    assert answer.status_code == 400
    message = answer.data["gpu_spec"][0]
    assert message.startswith("unknown GPU model 'A10O' in '1(A10O)'; did you mean A100-80G?")
    assert message.endswith(f"(VDC {world.vdc.name} has A100-80G)")
    assert not Task.objects.exists()
