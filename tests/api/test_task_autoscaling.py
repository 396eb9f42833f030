"""PATCH of a task: only an inference service's autoscaling settings change, validated like a submission."""

from __future__ import annotations

from decimal import Decimal

import pytest

from apps.tasks.models import Task
from tests.api.base import client_for
from tests.factories import TaskFactory

TASKS = "/api/v1/tasks/"


def service(world, **fields):
    fields = {"autoscale_min": 1, "autoscale_max": 2, "status": "running", **fields}
    return TaskFactory(
        project=world.project,
        vdc=world.vdc,
        queue=world.high,
        owner=world.member,
        kind="inference",
        gpu_spec="1(A100)",
        port=8000,
        **fields,
    )


def patch(world, task, user=None, **body):
    return client_for(user or world.member).patch(f"{TASKS}{task.pk}/", body, format="json")


def test_member_changes_bounds_and_targets_with_a_timeline_event(world):
    svc = service(world)
    response = patch(world, svc, autoscale_min=2, autoscale_max=4, autoscale_rps=20, autoscale_gpu_percent=60)
    assert response.status_code == 200, response.data
    data = response.data
    assert (data["autoscale_min"], data["autoscale_max"], data["autoscale_rps"]) == (2, 4, 20)
    event = svc.events.get(kind="autoscaled")
    assert "min 1 → 2" in event.message and "max 2 → 4" in event.message and event.actor == world.member
    assert response.data["events"][-1]["kind"] == "autoscaled"


def test_a_concurrency_target_is_set_and_cleared_like_the_others(world):
    svc = service(world, autoscale_rps=20)
    response = patch(world, svc, autoscale_concurrency=8)
    assert response.status_code == 200, response.data
    assert (response.data["autoscale_concurrency"], response.data["autoscale_rps"]) == (8, 20)
    assert "concurrency None → 8" in svc.events.get(kind="autoscaled").message
    assert patch(world, svc, autoscale_concurrency=None).data["autoscale_concurrency"] is None
    svc.refresh_from_db()
    assert svc.autoscale_concurrency is None


def test_a_concurrency_target_out_of_range_is_refused_with_its_range_and_nothing_changes(world):
    svc = service(world, autoscale_concurrency=4)
    for bad in (0, 10_001):
        response = patch(world, svc, autoscale_concurrency=bad)
        assert response.status_code == 400
        assert "autoscale_concurrency" in response.data
    assert "less than or equal to 10000" in str(patch(world, svc, autoscale_concurrency=10_001).data)
    assert patch(world, svc, autoscale_concurrency="many").status_code == 400
    svc.refresh_from_db()
    assert svc.autoscale_concurrency == 4 and not svc.events.filter(kind="autoscaled").exists()


def test_min_above_max_is_refused_and_nothing_changes(world):
    svc = service(world)
    response = patch(world, svc, autoscale_min=5)
    assert response.status_code == 400
    assert "autoscale_max" in response.data
    svc.refresh_from_db()
    assert (svc.autoscale_min, svc.autoscale_max) == (1, 2)
    assert not svc.events.filter(kind="autoscaled").exists()


def test_other_fields_are_refused(world):
    svc = service(world)
    response = patch(world, svc, autoscale_max=3, command="rm -rf /", gpu_spec="8(A100)")
    assert response.status_code == 400
    assert set(response.data) == {"command", "gpu_spec"}
    svc.refresh_from_db()
    assert svc.autoscale_max == 2 and svc.command == "echo hello"


def test_targets_out_of_bounds_are_refused(world):
    svc = service(world)
    assert patch(world, svc, autoscale_gpu_percent=150).status_code == 400
    assert patch(world, svc, autoscale_rps=0).status_code == 400
    assert patch(world, svc, autoscale_max=100000).status_code == 400


def test_max_beyond_the_project_gpu_limit_is_refused_with_the_reachable_count(world):
    world.quota.limit_gpu = Decimal(3)
    world.quota.save()
    response = patch(world, service(world), autoscale_max=4)
    assert response.status_code == 400
    assert "at most 3 replicas" in str(response.data["autoscale_max"])


def test_max_beyond_the_queue_maximum_is_refused(world):
    world.high.max_gpu = Decimal(2)
    world.high.save()
    response = patch(world, service(world), autoscale_max=3)
    assert response.status_code == 400
    assert "queue high holds at most 2" in str(response.data["autoscale_max"])


def test_only_inference_services_that_have_not_ended_change(world):
    training = TaskFactory(project=world.project, vdc=world.vdc, queue=world.high, owner=world.member)
    assert patch(world, training, autoscale_max=3).status_code == 400
    ended = service(world, status="completed")
    response = patch(world, ended, autoscale_max=3)
    assert response.status_code == 400 and "status" in response.data


def test_viewers_may_not_and_outsiders_do_not_see_it(world):
    svc = service(world)
    assert patch(world, svc, world.viewer, autoscale_max=3).status_code == 403
    assert patch(world, svc, world.outsider, autoscale_max=3).status_code == 404
    svc.refresh_from_db()
    assert svc.autoscale_max == 2


def test_a_portal_scaled_service_moves_its_desired_count_into_new_bounds(world):
    svc = service(world, autoscale_max=4, autoscale_desired=4)
    assert patch(world, svc, autoscale_max=2).status_code == 200
    assert Task.objects.get(pk=svc.pk).autoscale_desired == 2


def test_clearing_only_one_bound_is_refused(world):
    response = patch(world, service(world), autoscale_min=None)
    assert response.status_code == 400 and "autoscale_min" in response.data


def test_put_is_not_allowed(world):
    svc = service(world)
    assert client_for(world.member).put(f"{TASKS}{svc.pk}/", {"autoscale_max": 3}, format="json").status_code == 405


# Scheduled minimums.

INFERENCE = {"kind": "inference", "port": 8000, "gpu_spec": "1(A100)", "autoscale_min": 1, "autoscale_max": 4}


def submit(world, **fields):
    body = {"project": "alpha", "queue": "high", "name": "svc", "command": "serve", **INFERENCE, **fields}
    return client_for(world.member).post(TASKS, body, format="json")


def test_a_schedule_is_submitted_as_lines_or_objects_and_answered_as_objects(world):
    response = submit(
        world,
        autoscale_schedule=[
            "Mon-Fri 08:00-20:00 3 Europe/Berlin",
            {"days": "Sat,Sun", "from": "22:00", "to": "02:00", "min_replicas": 2},
        ],
    )
    assert response.status_code == 201, response.data
    assert response.data["autoscale_schedule"] == [
        {"days": "Mon-Fri", "from": "08:00", "to": "20:00", "timezone": "Europe/Berlin", "min_replicas": 3},
        {"days": "Sat,Sun", "from": "22:00", "to": "02:00", "timezone": "UTC", "min_replicas": 2},
    ]


@pytest.mark.parametrize(
    ("entry", "expected"),
    [
        ("Mon-Fri 8-20 3", "Expected DAYS HH:MM-HH:MM N [TIME ZONE]"),
        ({"days": "Mon-Fri", "from": "25:00", "to": "20:00", "min_replicas": 3}, "Expected from as HH:MM"),
        ({"days": "Mon-Fri", "from": "08:00", "to": "08:00", "min_replicas": 3}, "Expected from and to to differ"),
        ({"days": "Mon-Fry", "from": "08:00", "to": "20:00", "min_replicas": 3}, "Expected days of Mon..Sun"),
        ("Mon-Fri 08:00-20:00 3 Mars/Olympus", "Expected a time zone name"),
        ("Mon-Fri 08:00-20:00 9", "Expected min_replicas within the service's replicas 1..4, got 9"),
        ({"days": "Mon", "from": "08:00", "to": "20:00", "min_replicas": 2, "max": 3}, "Unknown key 'max'"),
        ({"days": "Mon", "from": "08:00"}, "Missing to, min_replicas"),
    ],
)
def test_a_bad_schedule_entry_is_a_400_saying_what_was_expected(world, entry, expected):
    response = submit(world, autoscale_schedule=[entry])
    assert response.status_code == 400
    assert "Entry 1: " + expected in str(response.data["autoscale_schedule"]), response.data
    assert not Task.objects.filter(name="svc").exists()


def test_a_schedule_needs_autoscaling_and_an_inference_service(world):
    response = submit(world, autoscale_min=None, autoscale_max=None, autoscale_schedule=["Mon 08:00-20:00 2"])
    assert response.status_code == 400
    assert "set min and max replicas too" in str(response.data["autoscale_schedule"])
    response = submit(world, kind="training", port=None, autoscale_schedule=["Mon 08:00-20:00 2"])
    assert response.status_code == 400
    assert "inference services only" in str(response.data["autoscale_schedule"])


def test_a_schedule_is_patched_and_a_lowered_maximum_below_an_entry_is_refused(world):
    svc = service(world, autoscale_max=4)
    response = patch(world, svc, autoscale_schedule=["Mon-Fri 08:00-20:00 3"])
    assert response.status_code == 200, response.data
    assert response.data["autoscale_schedule"][0]["min_replicas"] == 3
    assert "schedule [] → [Mon-Fri 08:00-20:00 3 UTC]" in svc.events.get(kind="autoscaled").message
    response = patch(world, svc, autoscale_max=2)
    assert response.status_code == 400
    assert "within the service's replicas 1..2, got 3" in str(response.data["autoscale_schedule"])
