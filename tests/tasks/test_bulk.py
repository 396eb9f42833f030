"""bulk_update_rows: one COPY and one UPDATE, and a clear error instead of a hang for fields not loaded."""

import pytest
from django.db import connection
from django.utils import timezone

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
    from datetime import timedelta
    from decimal import Decimal

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


def test_inserted_rows_get_their_keys_insert_time_values_and_leave_the_sequence_ahead(world):
    import uuid

    from apps.control.models import BackendObject
    from apps.tasks.bulk import bulk_insert_rows
    from apps.tasks.models import TaskEvent

    task = TaskFactory(project=world.project, owner=world.member, vdc=world.vdc, queue=world.low)
    events = [
        TaskEvent(
            task=task,
            kind="scheduled",
            from_status="queued",
            to_status="scheduled",
            message=f"it’s #{k}",
            data={"placement": [{"node": k, "devices": [{"id": 3, "milli": 500}]}], "attempt": k},
        )
        for k in range(3)
    ]
    intent = BackendObject(
        cluster=world.cluster,
        task=task,
        task_uid=uuid.uuid4(),
        attempt=1,
        name="hcs-1-a1",
        shares=[{"id": 5, "milli": 1000}, {"id": 6, "milli": 1000}],
        replicas=2,
    )
    before = timezone.now()
    bulk_insert_rows(TaskEvent, events)
    after = timezone.now()
    bulk_insert_rows(BackendObject, [intent])
    assert all(before <= e.created_at <= after for e in events)  # insert-time values, taken during the call
    if connection.vendor == "postgresql":  # the COPY path: one stamp for the insert, as one statement stamps rows
        assert len({e.created_at for e in events}) == 1

    rows = {e.pk: e for e in TaskEvent.objects.filter(task=task)}
    assert sorted(rows) == sorted(e.pk for e in events)
    for k, e in enumerate(events):
        stored = rows[e.pk]
        assert (stored.message, stored.data["attempt"], stored.data["placement"][0]["node"]) == (f"it’s #{k}", k, k)
        assert stored.created_at is not None and stored.created_at == e.created_at  # auto_now_add, as save() sets it
    stored = BackendObject.objects.get(pk=intent.pk)
    assert (stored.task_uid, stored.device_ids, stored.replicas, stored.state) == (
        intent.task_uid,
        [5, 6],
        2,
        "pending",
    )
    # The keys came from the table's own sequence: an ordinary insert afterwards does not collide.
    later = TaskEvent.objects.create(task=task, kind="running")
    assert later.pk > max(e.pk for e in events)
    assert not any(e._state.adding for e in events)


@pytest.mark.parametrize(
    "fields",
    [("name",), ("name", "status", "placement", "submitted_at", "queue"), "snapshot", ("env", "secret_env")],
)
def test_tasks_loaded_with_fields_deferred_hold_what_django_would_load(world, fields):
    """Task.from_db works out the deferred fields once per selection; the loaded rows must be Django's."""
    from django.db.models import Model

    from apps.control.scheduling import SNAPSHOT_FIELDS

    fields = SNAPSHOT_FIELDS if fields == "snapshot" else fields
    TaskFactory.create_batch(
        2,
        project=world.project,
        owner=world.member,
        vdc=world.vdc,
        queue=world.low,
        env={"A": "1"},
        placement=[{"node": 3}],
    )
    full = {t.pk: t for t in Task.objects.all()}
    selected = {"id", *(Task._meta.get_field(name).attname for name in fields)}
    for loaded in (list(Task.objects.only(*fields)), list(Task.objects.only(*fields))):  # the second: cached mask
        for task in loaded:
            names = [f.attname for f in Task._meta.concrete_fields if f.attname in task.__dict__]
            assert set(names) == selected  # exactly the selected columns were loaded, the rest deferred
            reference = Model.from_db.__func__(Task, "default", names, [getattr(task, n) for n in names])
            assert task.get_deferred_fields() == reference.get_deferred_fields()
            for name in names:
                assert getattr(task, name) == getattr(full[task.pk], name)
    deferred = Task.objects.only(*fields).first()
    assert deferred.image == full[deferred.pk].image or "image" in fields  # a deferred field still loads on access
