"""Concurrent submissions on PostgreSQL never admit more tasks of a kind than the project's limit."""

import threading

import psycopg
import pytest
from django.core.exceptions import ValidationError
from django.db import OperationalError, connection

from apps.tasks.models import Task, TaskEvent
from apps.tasks.services import submit_task

CLIENTS = 20
LIMIT = 5


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_concurrent_submits_admit_exactly_the_per_kind_limit(world):
    world.quota.max_training_tasks = LIMIT
    world.quota.save()
    barrier = threading.Barrier(CLIENTS)
    accepted, refused, errors = [], [], []

    def submit(number: int) -> None:
        try:
            barrier.wait()
            task = submit_task(
                world.member,
                project=world.project,
                queue="high",
                name=f"job-{number}",
                kind="training",
                command="echo hi",
            )
            accepted.append(task.pk)
        except ValidationError as exc:
            refused.append(exc.message_dict)
        except Exception as exc:  # surfaced by the assertion below
            errors.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=submit, args=(n,)) for n in range(CLIENTS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors
    assert len(accepted) == LIMIT
    assert len(refused) == CLIENTS - LIMIT
    assert all("limit" in r["kind"][0] for r in refused)
    assert Task.objects.count() == LIMIT
    assert TaskEvent.objects.filter(kind="submitted").count() == LIMIT


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_only_a_per_kind_limit_makes_a_submit_wait_for_the_quota_row(world):
    params = connection.get_connection_params()
    params.pop("cursor_factory", None)
    with connection.cursor() as cursor:
        cursor.execute("SET lock_timeout = '2s'")
    try:
        with psycopg.connect(**params) as holder:  # another session holds the quota row, as a slow submit would
            holder.execute("SELECT 1 FROM vdc_projectquota WHERE id = %s FOR UPDATE", [world.quota.pk])
            task = submit_task(
                world.member, project=world.project, queue="high", name="free", kind="training", command="echo hi"
            )
            assert task.status == "queued"
        world.quota.max_training_tasks = LIMIT
        world.quota.save()
        with psycopg.connect(**params) as holder:
            holder.execute("SELECT 1 FROM vdc_projectquota WHERE id = %s FOR UPDATE", [world.quota.pk])
            with pytest.raises(OperationalError, match="lock"):
                submit_task(
                    world.member,
                    project=world.project,
                    queue="high",
                    name="counted",
                    kind="training",
                    command="echo hi",
                )
    finally:
        with connection.cursor() as cursor:
            cursor.execute("RESET lock_timeout")
    assert list(Task.objects.values_list("name", flat=True)) == ["free"]
