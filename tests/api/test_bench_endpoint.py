"""The load benchmark's one-row write: routed only for the benchmark, one INSERT, platform admins only."""

from __future__ import annotations

from rest_framework.test import APIRequestFactory, force_authenticate

from apps.tasks.models import TaskEvent
from hcsportal.bench import OneRowView
from tests.api.base import client_for
from tests.factories import TaskFactory


def test_one_row_write_is_not_routed_unless_the_benchmark_turns_it_on(world):
    response = client_for(world.admin).post("/api/v1/bench/one-row/", {"task": 1}, format="json")
    assert response.status_code == 404


def post_as(user, body):
    request = APIRequestFactory().post("/api/v1/bench/one-row/", body, format="json")
    force_authenticate(request, user)
    return OneRowView.as_view()(request)


def test_one_row_write_inserts_one_event_in_one_query(world, django_assert_num_queries):
    task = TaskFactory(project=world.project, vdc=world.vdc, queue=world.high)
    with django_assert_num_queries(1):
        response = post_as(world.admin, {"task": task.pk})
    assert response.status_code == 201
    assert TaskEvent.objects.get(pk=response.data["id"]).task == task


def test_one_row_write_is_for_platform_admins_only(world):
    task = TaskFactory(project=world.project, vdc=world.vdc, queue=world.high)
    assert post_as(world.member, {"task": task.pk}).status_code == 403
    assert not TaskEvent.objects.exists()
