"""bulk_update_rows: one COPY and one UPDATE, and a clear error instead of a hang for fields not loaded."""

import pytest

from apps.tasks.bulk import bulk_update_rows
from apps.tasks.models import Task
from tests.factories import TaskFactory


def test_rows_are_written_back(world):
    tasks = TaskFactory.create_batch(3, project=world.project, owner=world.member, vdc=world.vdc, queue=world.low)
    for task in tasks:
        task.pending_message = f"row {task.pk}"
    bulk_update_rows(Task, tasks, ["pending_message"])
    assert {t.pk: t.pending_message for t in Task.objects.all()} == {t.pk: f"row {t.pk}" for t in tasks}


def test_a_field_not_loaded_is_an_error_not_a_query_inside_the_copy(world):
    # Reading a deferred field queries the database: in the middle of PostgreSQL's COPY on the same
    # connection that hung the scheduling cycle for good.
    TaskFactory(project=world.project, owner=world.member, vdc=world.vdc, queue=world.low)
    tasks = list(Task.objects.only("pk", "status"))
    with pytest.raises(ValueError, match="failure_reason not loaded on the Task rows"):
        bulk_update_rows(Task, tasks, ["status", "failure_reason"])


def test_json_decimal_and_duration_values_survive_the_round_trip(world):
    from datetime import timedelta  # noqa: PLC0415
    from decimal import Decimal  # noqa: PLC0415

    task = TaskFactory(project=world.project, owner=world.member, vdc=world.vdc, queue=world.low)
    task.placement = [{"node": 1, "node_name": "n1", "devices": [{"id": 3, "milli": 500}]}]
    task.allocated_gpu = Decimal("0.500")
    task.window = timedelta(minutes=7, seconds=30)
    task.pending_message = "it’s “quoted”"
    bulk_update_rows(Task, [task], ["placement", "allocated_gpu", "window", "pending_message"])
    task.refresh_from_db()
    assert task.placement == [{"node": 1, "node_name": "n1", "devices": [{"id": 3, "milli": 500}]}]
    assert (task.allocated_gpu, task.window, task.pending_message) == (
        Decimal("0.500"),
        timedelta(minutes=7, seconds=30),
        "it’s “quoted”",
    )
