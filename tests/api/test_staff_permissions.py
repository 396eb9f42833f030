"""Staff get exactly what their model permissions give them, through the API and the pages (apps.vdc.policy):
a view-only staff user reads every project's tasks and changes nothing; a permission to stop does not delete;
superusers keep every right."""

from __future__ import annotations

import pytest

from apps.tasks.models import Task
from apps.vdc.models import ProjectSecret
from apps.vdc.services import create_secret
from tests.api.base import API, client_for
from tests.factories import TaskFactory, staff_user

pytestmark = pytest.mark.django_db

VIEW_ONLY = (
    "vdc.view_project",
    "vdc.view_vdc",
    "vdc.view_projectsecret",
    "vdc.view_membership",
    "tasks.view_task",
    "tasks.view_taskevent",
    "clusters.view_cluster",
    "queues.view_taskqueue",
)


@pytest.fixture
def view_only(world):
    return staff_user("ops-viewer", *VIEW_ONLY)


def task_of(world, status: str, **fields) -> Task:
    return TaskFactory(
        project=world.project, vdc=world.vdc, queue=world.high, owner=world.member, status=status, **fields
    )


def submission(world) -> dict:
    return {
        "project": world.project.pk,
        "queue": "high",
        "name": "planted",
        "kind": "training",
        "gpu_spec": "1(A100)",
        "command": "cat /run/secrets/registry",
    }


def test_view_only_staff_reads_every_projects_tasks_and_cannot_submit_stop_change_or_delete_them(world, view_only):
    running, stopped = task_of(world, "running"), task_of(world, "stopped")
    client = client_for(view_only)
    listed = client.get(f"{API}tasks/", {"id": running.pk})
    assert [row["id"] for row in listed.data["results"]] == [running.pk]
    assert client.get(f"{API}tasks/{running.pk}/").status_code == 200
    assert client.get(f"{API}tasks/{running.pk}/events/").status_code == 200
    assert client.get(f"{API}projects/{world.project.pk}/secrets/").status_code == 200
    before = Task.objects.count()
    assert client.post(f"{API}tasks/", submission(world), format="json").status_code == 403
    assert Task.objects.count() == before
    assert client.post(f"{API}tasks/{running.pk}/stop/", {}, format="json").status_code == 403
    assert client.post(f"{API}tasks/stop-selected/", {"ids": [running.pk]}, format="json").status_code == 403
    assert client.patch(f"{API}tasks/{running.pk}/", {"autoscale_max": 3}, format="json").status_code == 403
    assert client.delete(f"{API}tasks/{stopped.pk}/").status_code == 403
    running.refresh_from_db()
    assert running.status == "running" and Task.objects.filter(pk=stopped.pk).exists()


def test_view_only_staff_cannot_plant_change_or_delete_a_secret(world, view_only):
    secret = create_secret(world.owner, world.project, "REGISTRY", "hunter2")
    client = client_for(view_only)
    body = {"project": world.project.pk, "name": "PLANTED", "value": "x"}
    assert client.post(f"{API}project-secrets/", body, format="json").status_code == 403
    assert client.patch(f"{API}project-secrets/{secret.pk}/", {"value": "mine"}, format="json").status_code == 403
    assert client.delete(f"{API}project-secrets/{secret.pk}/").status_code == 403
    assert list(ProjectSecret.objects.values_list("name", flat=True)) == ["REGISTRY"]
    secret.refresh_from_db()
    assert secret.get_value() == "hunter2"


def test_view_only_staff_cannot_change_the_platform(world, view_only):
    client = client_for(view_only)
    assert client.post(f"{API}clusters/{world.cluster.pk}/disable/").status_code == 403
    assert client.post(f"{API}clusters/{world.cluster.pk}/health-check/").status_code == 403
    assert client.post(f"{API}queues/{world.high.pk}/close/").status_code == 403
    quota = {"project": world.other_project.pk, "guaranteed_gpu": "1", "limit_gpu": "1"}
    assert client.post(f"{API}vdcs/{world.vdc.pk}/quotas/", quota, format="json").status_code == 403
    world.cluster.refresh_from_db()
    world.high.refresh_from_db()
    assert world.cluster.enabled and world.high.is_open


def test_staff_without_view_permissions_sees_only_its_own_projects(world):
    task = task_of(world, "running")
    client = client_for(staff_user("ops-bare"))
    assert client.get(f"{API}tasks/").data["results"] == []
    assert client.get(f"{API}tasks/{task.pk}/").status_code == 404
    assert client.get(f"{API}projects/").data["results"] == []


def test_staff_allowed_to_change_tasks_stops_any_task_and_deletes_none(world):
    running, stopped = task_of(world, "running"), task_of(world, "stopped")
    client = client_for(staff_user("ops-stopper", "tasks.view_task", "tasks.change_task"))
    response = client.post(f"{API}tasks/{running.pk}/stop/", {"reason": "maintenance"}, format="json")
    assert response.status_code == 200 and response.data["status"] == "stopped"
    assert client.delete(f"{API}tasks/{stopped.pk}/").status_code == 403
    assert Task.objects.filter(pk=stopped.pk).exists()


def test_staff_allowed_to_delete_tasks_deletes_an_ended_one_and_stops_none(world):
    running, stopped = task_of(world, "running"), task_of(world, "stopped")
    client = client_for(staff_user("ops-cleaner", "tasks.view_task", "tasks.delete_task"))
    assert client.delete(f"{API}tasks/{stopped.pk}/").status_code == 204
    assert not Task.objects.filter(pk=stopped.pk).exists()
    assert client.post(f"{API}tasks/{running.pk}/stop/", {}, format="json").status_code == 403


def test_staff_allowed_to_add_secrets_adds_one_and_rotates_none(world):
    staff = staff_user("ops-secrets", "vdc.view_project", "vdc.view_projectsecret", "vdc.add_projectsecret")
    client = client_for(staff)
    body = {"project": world.project.pk, "name": "HF_TOKEN", "value": "hf_1", "description": "hub"}
    created = client.post(f"{API}project-secrets/", body, format="json")
    assert created.status_code == 201 and "value" not in created.data
    rotated = client.patch(f"{API}project-secrets/{created.data['id']}/", {"value": "hf_2"}, format="json")
    assert rotated.status_code == 403
    assert ProjectSecret.objects.get(pk=created.data["id"]).get_value() == "hf_1"


def test_staff_allowed_to_add_tasks_submits_into_any_project_and_stops_none(world):
    staff = staff_user("ops-submitter", "vdc.view_project", "tasks.view_task", "tasks.add_task")
    client = client_for(staff)
    response = client.post(f"{API}tasks/", submission(world), format="json")
    assert response.status_code == 201, response.data
    assert Task.objects.get(pk=response.data["id"]).owner == staff
    assert client.post(f"{API}tasks/{response.data['id']}/stop/", {}, format="json").status_code == 403


def test_a_superuser_still_does_everything(world):
    running, stopped = task_of(world, "running"), task_of(world, "stopped")
    client = client_for(world.admin)
    assert client.post(f"{API}tasks/", submission(world), format="json").status_code == 201
    assert client.post(f"{API}tasks/{running.pk}/stop/", {}, format="json").status_code == 200
    assert client.delete(f"{API}tasks/{stopped.pk}/").status_code == 204
    body = {"project": world.project.pk, "name": "REGISTRY", "value": "hunter2"}
    assert client.post(f"{API}project-secrets/", body, format="json").status_code == 201
    assert client.post(f"{API}clusters/{world.cluster.pk}/disable/").status_code == 200


def test_an_inactive_superuser_has_no_platform_rights(world):
    world.admin.is_active = False
    world.admin.save()
    task = task_of(world, "running")
    assert client_for(world.admin).post(f"{API}tasks/{task.pk}/stop/", {}, format="json").status_code == 404


def test_a_permission_given_to_a_user_who_is_not_staff_counts_for_nothing(world):
    user = staff_user("not-staff", "tasks.view_task", "tasks.change_task")
    user.is_staff = False
    user.save()
    task = task_of(world, "running")
    assert client_for(user).get(f"{API}tasks/{task.pk}/").status_code == 404
