"""Delete is offered only for tasks it can remove: one that ran and was metered is kept for billing."""

from __future__ import annotations

import pytest
from django.urls import reverse

from apps.billing import services
from apps.tasks.services import stop_task, submit_task
from tests.billing.conftest import at, start_task

pytestmark = pytest.mark.django_db


def test_a_task_that_ran_offers_no_delete_and_one_stopped_before_it_ran_does(client, world, prices, account):
    ran = start_task(world, gpu_spec="1(A100)")
    services.accrue_task(ran.pk, now=at(minutes=30))
    stop_task(ran, world.member)
    never = submit_task(
        world.member,
        project=world.project,
        queue="high",
        name="never-ran",
        kind="training",
        gpu_spec="8(A100)",
        command="sleep 1",
    )
    stop_task(never, world.member)
    client.force_login(world.member)
    for url in (reverse("portal:compute-tasks"), reverse("portal:task-monitoring", args=[ran.pk])):
        assert reverse("portal:task-delete", args=[ran.pk]) not in client.get(url).content.decode()
    listing = client.get(reverse("portal:compute-tasks")).content.decode()
    assert reverse("portal:task-delete", args=[never.pk]) in listing
