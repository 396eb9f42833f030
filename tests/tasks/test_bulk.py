"""bulk_update_rows: one COPY and one UPDATE, and a clear error instead of a hang for fields not loaded."""

import pytest
from django.db import connection

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
    if connection.vendor != "postgresql":
        pytest.skip("the COPY path is PostgreSQL's; other databases use bulk_update")
    TaskFactory(project=world.project, owner=world.member, vdc=world.vdc, queue=world.low)
    tasks = list(Task.objects.only("pk", "status"))
    with pytest.raises(ValueError, match="failure_reason not loaded on the Task rows"):
        bulk_update_rows(Task, tasks, ["status", "failure_reason"])
