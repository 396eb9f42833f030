"""Task submission, stop, delete and timeline through the API: the service's rules surface as 400 / 403 / 404."""

from __future__ import annotations

import pytest
from rest_framework.authtoken.models import Token

from apps.tasks.models import Task, TaskEvent
from tests.api.base import client_for
from tests.factories import ClusterFactory, TaskFactory, node_with_every_model

TASKS = "/api/v1/tasks/"
GRAMMAR_EXAMPLES = [
    "2(V100)",
    "1(A100|H100)",
    "4(ascend910b)",
    "0.5(vgpu)",
    "0.5(T4)",
    "1(16G,50%)",
    "vram=16Gi,tflops-fp16=100",
    "1",
    "0",
    "",
]


def submit(world, user=None, **fields):
    body = {"project": "alpha", "queue": "high", "name": "job", "kind": "training", "command": "echo hi", **fields}
    return client_for(user or world.member).post(TASKS, body, format="json")


@pytest.mark.parametrize("spec", GRAMMAR_EXAMPLES)
def test_every_grammar_example_is_accepted(world, spec):
    node_with_every_model(world.cluster)  # the grammar is under test here, not what the VDC holds
    response = submit(world, gpu_spec=spec)
    assert response.status_code == 201, response.data
    assert response.data["gpu_spec"] == spec
    assert response.data["status"] == "queued"
    assert [e["kind"] for e in response.data["events"]] == ["submitted"]


def test_submission_reports_the_queue_class_and_defaults_to_the_default_vdc(world):
    data = submit(world, queue="medium", expected_duration="02:00:00").data
    assert (data["vdc"], data["vdc_name"], data["queue"], data["priority_class"]) == (
        world.vdc.pk,
        "main",
        world.medium.pk,
        "medium",
    )
    assert data["owner"] == "max" and data["project_name"] == "alpha"


def test_project_vdc_and_queue_may_be_ids(world):
    response = submit(world, project=world.project.pk, vdc=world.vdc.pk, queue=world.low.pk)
    assert response.status_code == 201, response.data
    assert response.data["queue_name"] == "low"


def test_preferred_clusters_are_kept(world):
    response = submit(world, preferred_clusters=[world.cluster.pk])
    assert response.status_code == 201, response.data
    assert response.data["preferred_clusters"] == [world.cluster.pk]


def test_preferred_cluster_the_user_cannot_see_is_rejected(world):
    hidden = ClusterFactory()
    response = submit(world, preferred_clusters=[hidden.pk])
    assert response.status_code == 400
    assert "preferred_clusters" in response.data


def test_malformed_spec_is_a_field_error_with_the_parser_message_and_writes_nothing(world):
    response = submit(world, gpu_spec="2x(V100)")
    assert response.status_code == 400
    assert list(response.data) == ["gpu_spec"]
    assert "expected" in str(response.data["gpu_spec"][0]).lower()
    assert not Task.objects.exists() and not TaskEvent.objects.exists()


def test_medium_queue_without_expected_duration_is_rejected(world):
    response = submit(world, queue="medium")
    assert response.status_code == 400
    assert "expected duration" in str(response.data["expected_duration"][0])
    assert not Task.objects.exists()


def test_unknown_queue_names_the_known_ones(world):
    response = submit(world, queue="urgent")
    assert response.status_code == 400
    message = str(response.data["queue"][0])
    assert "urgent" in message and all(name in message for name in ("high", "medium", "low"))


def test_missing_queue_names_the_known_ones(world):
    body = {"project": "alpha", "name": "job", "kind": "training"}
    response = client_for(world.member).post(TASKS, body, format="json")
    assert response.status_code == 400 and "high" in str(response.data["queue"][0])


def test_quota_over_limit_is_rejected(world):
    response = submit(world, gpu_spec="2(A100)", instances=5)  # 10 GPU-equivalents > limit 8
    assert response.status_code == 400
    assert "limit" in str(response.data["gpu_spec"][0])
    assert not Task.objects.exists()


def test_closed_queue_is_rejected(world):
    world.low.is_open = False
    world.low.save()
    response = submit(world, queue="low")
    assert response.status_code == 400 and "closed" in str(response.data["queue"][0])


def test_bad_shapes_are_rejected_by_the_serializer(world):
    response = submit(world, kind="mining", cpu="lots", env=["A=1"], queue=3.5)
    assert response.status_code == 400
    assert {"kind", "cpu", "queue"} <= set(response.data)


def test_state_fields_are_read_only(world):
    """A submission that tries to set what the portal sets is refused, each field named, and writes nothing."""
    response = submit(world, status="running", queue_position=1, external_id="x", attempt=9)
    assert response.status_code == 400
    assert set(response.data) == {"status", "queue_position", "external_id", "attempt"}
    assert str(response.data["status"][0]) == "Read-only: the portal sets it; a submission may not."
    assert not Task.objects.exists()
    response = submit(world)
    assert (response.data["status"], response.data["queue_position"], response.data["attempt"]) == ("queued", None, 0)
    assert response.data["external_id"] == ""


def test_viewer_gets_403_on_submit_and_outsider_cannot_name_the_project(world):
    assert submit(world, user=world.viewer).status_code == 403
    response = submit(world, user=world.outsider)
    assert response.status_code == 400 and "project" in response.data
    assert not Task.objects.exists()


def test_member_stops_a_queued_task_and_the_timeline_says_who(world):
    task_id = submit(world).data["id"]
    response = client_for(world.owner).post(f"{TASKS}{task_id}/stop/", {"reason": "wrong image"}, format="json")
    assert response.status_code == 200, response.data
    assert response.data["status"] == "stopped" and response.data["finished_at"]
    last = response.data["events"][-1]
    assert (last["kind"], last["actor"]) == ("stopped", "olivia") and "wrong image" in last["message"]


def test_viewer_cannot_stop_403_and_outsider_gets_404(world):
    task_id = submit(world).data["id"]
    assert client_for(world.viewer).post(f"{TASKS}{task_id}/stop/").status_code == 403
    assert client_for(world.outsider).post(f"{TASKS}{task_id}/stop/").status_code == 404
    assert Task.objects.get(pk=task_id).status == "queued"


def test_stopping_a_finished_task_is_a_400(world):
    task = TaskFactory(project=world.project, vdc=world.vdc, queue=world.high, status="completed")
    response = client_for(world.member).post(f"{TASKS}{task.pk}/stop/")
    assert response.status_code == 400 and "status" in response.data


def test_delete_of_an_unfinished_task_is_a_400_and_keeps_it(world):
    task_id = submit(world).data["id"]
    response = client_for(world.member).delete(f"{TASKS}{task_id}/")
    assert response.status_code == 400 and "status" in response.data
    assert Task.objects.filter(pk=task_id).exists()


def test_viewer_cannot_delete_and_outsider_gets_404(world):
    task = TaskFactory(project=world.project, vdc=world.vdc, queue=world.high, status="stopped")
    assert client_for(world.viewer).delete(f"{TASKS}{task.pk}/").status_code == 403
    assert client_for(world.outsider).delete(f"{TASKS}{task.pk}/").status_code == 404
    assert Task.objects.filter(pk=task.pk).exists()


def test_tasks_are_not_edited_after_submission(world):
    task_id = submit(world).data["id"]
    client = client_for(world.member)
    assert client.put(f"{TASKS}{task_id}/", {"name": "x"}, format="json").status_code == 405
    # PATCH takes only an inference service's autoscaling settings (tests/api/test_task_autoscaling.py).
    response = client.patch(f"{TASKS}{task_id}/", {"name": "x"}, format="json")
    assert response.status_code == 400 and "name" in response.data
    assert Task.objects.get(pk=task_id).name == "job"


def test_events_endpoint_lists_the_timeline_oldest_first(world):
    task_id = submit(world).data["id"]
    client_for(world.member).post(f"{TASKS}{task_id}/stop/")
    response = client_for(world.viewer).get(f"{TASKS}{task_id}/events/")
    assert response.status_code == 200
    assert [e["kind"] for e in response.data["results"]] == ["submitted", "stopped"]
    assert client_for(world.outsider).get(f"{TASKS}{task_id}/events/").status_code == 404


def test_outsider_sees_none_of_another_projects_tasks(world):
    submit(world)
    assert client_for(world.outsider).get(TASKS).data["count"] == 0
    assert client_for(world.viewer).get(TASKS).data["count"] == 1


def test_token_authentication_works(world):
    token = Token.objects.create(user=world.member)
    client = client_for(None)
    client.credentials(HTTP_AUTHORIZATION=f"Token {token.key}")
    assert client.get(TASKS).status_code == 200
    assert submit_with(client).status_code == 201
    client.credentials(HTTP_AUTHORIZATION="Token not-a-token")
    assert client.get(TASKS).status_code == 401


def submit_with(client):
    body = {"project": "alpha", "queue": "high", "name": "job", "kind": "training", "command": "echo hi"}
    return client.post(TASKS, body, format="json")


def test_token_endpoint_issues_a_token_for_a_password(world):
    response = client_for(None).post("/api/v1/auth/token/", {"username": "max", "password": "pw-for-tests-1"})
    assert response.status_code == 200
    assert response.data["token"] == Token.objects.get(user=world.member).key
