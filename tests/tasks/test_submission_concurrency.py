"""Concurrent submissions on PostgreSQL never admit more tasks of a kind than the project's limit."""

import threading

import pytest
from django.core.exceptions import ValidationError
from django.db import connection

from apps.tasks.models import Task, TaskEvent
from apps.tasks.services import submit_task
from tests.services import requires_postgres

CLIENTS = 20
LIMIT = 5


@requires_postgres
@pytest.mark.django_db(transaction=True)
def test_concurrent_submits_admit_exactly_the_per_kind_limit(world):
    world.quota.max_training_tasks = LIMIT
    world.quota.save()
    barrier = threading.Barrier(CLIENTS)
    accepted, refused, errors = [], [], []

    def submit(number: int) -> None:
        try:
            barrier.wait()
            task = submit_task(world.member, project=world.project, queue="high", name=f"job-{number}",
                               kind="training", command="echo hi")  # fmt: skip
            accepted.append(task.pk)
        except ValidationError as exc:
            refused.append(exc.message_dict)
        except Exception as exc:  # noqa: BLE001 - surfaced by the assertion below
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
