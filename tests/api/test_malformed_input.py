"""Malformed input is a clear 400 (or 404), never a server error, and a filter never silently ignores a value."""

from __future__ import annotations

import pytest
from django.urls import reverse
from drf_spectacular.generators import SchemaGenerator

from apps.tasks.models import Task, TaskEvent
from apps.tasks.services import delete_task, stop_task
from tests.api.base import client_for
from tests.factories import TaskFactory

TASKS = "/api/v1/tasks/"


def time_filters() -> list[tuple[str, str]]:
    """(list path, a date-time query parameter of it) for every list of the API."""
    schema = SchemaGenerator().get_schema(request=None, public=True)
    found = []
    for path, operations in schema["paths"].items():
        get = operations.get("get")
        if "{" in path or get is None:
            continue
        times = [p["name"] for p in get.get("parameters", []) if p["schema"].get("format") == "date-time"]
        if times:
            found.append((path, times[0]))
    return found


TIME_FILTERS = time_filters()


def test_every_list_with_time_filters_is_checked():
    assert len(TIME_FILTERS) >= 13
    assert ("/api/v1/tasks/", "estimated_start") in TIME_FILTERS


@pytest.mark.parametrize(("path", "name"), TIME_FILTERS)
@pytest.mark.parametrize("value", ["2020-06-21T17:31:59-16:18", "0400-09-23T15:05:23+22:40", "9999-12-31T23:59-10:00"])
def test_time_filters_the_database_cannot_compare_are_a_400(world, path, name, value):
    response = client_for(world.member).get(path, {name: value})
    assert response.status_code == 400, response.content
    assert name in response.json()


def test_time_filters_within_the_offsets_postgresql_stores_are_applied(world):
    TaskFactory(project=world.project, vdc=world.vdc, queue=world.high)
    client = client_for(world.member)
    assert client.get(TASKS, {"submitted_after": "2000-01-01T00:00:00-15:59"}).json()["count"] == 1
    assert client.get(TASKS, {"submitted_after": "2999-01-01T00:00:00+15:59"}).json()["count"] == 0


@pytest.mark.parametrize(
    ("params", "field"),
    [
        ({"preemptible": "maybe"}, "preemptible"),
        ({"waiting": "yes"}, "waiting"),
        ({"cluster__isnull": "perhaps"}, "cluster__isnull"),
        ({"status__in": "queued,sleeping"}, "status__in"),
        ({"kind__in": "mining"}, "kind__in"),
        ({"ordering": "password"}, "ordering"),
        ({"ordering": "name,-nonsense"}, "ordering"),
        ({"name": "a\u0000b"}, "name"),
    ],
)
def test_filter_values_a_filter_cannot_take_are_a_400_naming_it(world, params, field):
    response = client_for(world.member).get(TASKS, params)
    assert response.status_code == 400, response.content
    assert field in response.json()


def test_boolean_choice_and_ordering_filters_still_filter(world):
    TaskFactory(project=world.project, vdc=world.vdc, queue=world.high, preemptible=False, name="b")
    TaskFactory(project=world.project, vdc=world.vdc, queue=world.high, status="running", name="a")
    client = client_for(world.member)
    assert client.get(TASKS, {"preemptible": "false"}).json()["count"] == 1
    assert client.get(TASKS, {"preemptible": "TRUE"}).json()["count"] == 1
    assert client.get(TASKS, {"status__in": "running,completed"}).json()["count"] == 1
    assert [t["name"] for t in client.get(TASKS, {"ordering": "-name"}).json()["results"]] == ["b", "a"]
    assert client.get("/api/v1/clusters/", {"schedulable": "1"}).json()["count"] == 1


def test_json_nested_100000_deep_is_a_400(world):
    body = '{"project": "alpha", "name": "x", "kind": "training", "env": ' + "[" * 100_000 + "]" * 100_000 + "}"
    response = client_for(world.member).post(TASKS, body, content_type="application/json")
    assert response.status_code == 400
    assert "nested at most" in response.json()["detail"]
    assert not Task.objects.exists()


def test_json_deeper_than_any_field_is_a_400(world):
    body = '{"project": "alpha", "env": ' + '{"a": ' * 40 + "1" + "}" * 40 + "}"
    response = client_for(world.member).post(TASKS, body, content_type="application/json")
    assert response.status_code == 400 and "nested at most 32" in response.json()["detail"]


@pytest.mark.parametrize(
    ("field", "value"),
    [("project", "alpha\u0000"), ("vdc", "main\u0000"), ("queue", "high\u0000")],
)
def test_names_with_nul_are_a_400_on_their_field(world, field, value):
    body = {"project": "alpha", "queue": "high", "name": "job", "kind": "training", field: value}
    response = client_for(world.member).post(TASKS, body, format="json")
    assert response.status_code == 400 and field in response.json()
    assert not Task.objects.exists()


def test_membership_for_a_username_with_nul_is_a_400(world):
    body = {"project": world.project.pk, "user": "max\u0000", "role": "member"}
    response = client_for(world.owner).post("/api/v1/memberships/", body, format="json")
    assert response.status_code == 400 and "user" in response.json()


def test_stop_racing_a_delete_is_a_404(world, monkeypatch):
    task = TaskFactory(project=world.project, vdc=world.vdc, queue=world.high, status="queued")
    stale = Task.objects.get(pk=task.pk)
    stop_task(task, world.member)
    delete_task(Task.objects.get(pk=task.pk), world.member)
    monkeypatch.setattr("apps.tasks.api.views.TaskViewSet.get_object", lambda view: stale)
    response = client_for(world.member).post(f"{TASKS}{task.pk}/stop/", {}, format="json")
    assert response.status_code == 404
    assert not TaskEvent.objects.exists()


def test_stop_page_racing_a_delete_is_a_404(client, world, monkeypatch):
    task = TaskFactory(project=world.project, vdc=world.vdc, queue=world.high, status="queued")
    stale = Task.objects.get(pk=task.pk)
    Task.objects.filter(pk=task.pk).delete()
    monkeypatch.setattr("apps.tasks.views._visible_task", lambda request, pk: stale)
    client.force_login(world.member)
    assert client.post(reverse("portal:task-stop", args=[task.pk])).status_code == 404


@pytest.mark.parametrize("vdc", ["²", "1" * 30, "main\u0000", "-1", "1.5"])
def test_price_preview_for_a_vdc_that_is_not_an_id_or_a_name_is_a_404_or_400(world, vdc):
    response = client_for(world.member).post("/api/v1/billing/price-preview/", {"vdc": vdc}, format="json")
    assert response.status_code in (400, 404), response.content


def test_an_api_url_that_matches_nothing_is_a_json_404_and_pages_keep_theirs(client, world):
    response = client_for(world.member).get("/api/v1/tasks/1.5/stop/x/")
    assert response.status_code == 404 and response.json() == {"detail": "Not found."}
    client.force_login(world.member)
    page = client.get("/no-such-page/")
    assert page.status_code == 404 and page["Content-Type"].startswith("text/html")


def test_a_project_just_created_reports_its_role_and_member_count(world):
    response = client_for(world.admin).post("/api/v1/projects/", {"name": "gamma"}, format="json")
    assert response.status_code == 201
    assert (response.data["my_role"], response.data["member_count"]) == (None, 0)
