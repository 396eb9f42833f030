"""Two scheduling cycles at once on PostgreSQL never place a task twice."""

import threading

import pytest
from django.db import connection

from apps.control.scheduling import run_cycle
from apps.tasks.models import Task, TaskEvent
from tests.factories import TaskFactory


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_two_concurrent_cycles_never_double_place_a_task(world):
    TaskFactory.create_batch(
        40,
        project=world.project,
        owner=world.member,
        vdc=world.vdc,
        queue=world.high,
        gpu_spec="1(A100)",
        status="queued",
    )
    world.quota.limit_gpu = 100
    world.quota.save()
    barrier = threading.Barrier(2)
    results, errors = [], []

    def cycle():
        try:
            barrier.wait()
            results.append(run_cycle(world.vdc.pk))
        except Exception as exc:  # surfaced by the assertion below
            errors.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=cycle) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert not errors
    placed = Task.objects.filter(status="scheduled")
    assert placed.count() == 8  # one node of 8 cards
    assert sum(r.started for r in results) == 8
    assert TaskEvent.objects.filter(kind="scheduled").count() == 8
    assert all(t.attempt == 1 for t in placed)
    used = [d["id"] for t in placed for p in t.placement for d in p["devices"]]
    assert len(used) == len(set(used)) == 8
