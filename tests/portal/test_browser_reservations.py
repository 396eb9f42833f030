"""In Chromium: the queue page shows a maintenance window and the waiting task says it waits for it."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from apps.clusters.models import CapacityReservation
from apps.control.scheduling import run_cycle
from apps.tasks.services import submit_task
from tests.portal.test_browser import log_in, shot, watch_policy

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def maintenance_with_a_waiting_task(world) -> int:
    now = timezone.now()
    window = CapacityReservation.objects.create(
        vdc=world.vdc,
        cluster=world.cluster,
        name="firmware",
        reason="GPU firmware upgrade",
        starts_at=now - timedelta(minutes=1),
        ends_at=now + timedelta(hours=2),
    )
    window.nodes.set([world.node])
    task = submit_task(
        world.member,
        project=world.project,
        queue="high",
        name="my-alpha-run",
        kind="training",
        gpu_spec="1(A100)",
        command="sleep 120",
    )
    run_cycle(world.vdc.pk)
    return task.pk


def test_queue_page_shows_the_maintenance_window_and_why_my_task_waits(db_thread, browser, live_server_url, live_world):
    world, base = live_world, live_server_url
    task_id = db_thread.run(maintenance_with_a_waiting_task, world)
    page = browser.new_page(viewport={"width": 1366, "height": 900})
    violations: list[str] = []
    watch_policy(page, violations)
    log_in(page, base, "max")
    page.goto(f"{base}/task-queues/")
    block = page.locator(f'[data-reservations="{world.vdc.pk}"]')
    text = block.inner_text()
    assert "firmware" in text and "GPU firmware upgrade" in text and "nodes gpu-node-1" in text
    assert "nobody (maintenance)" in text
    shot(page, "issue16-queue-page-reservation")
    page.goto(f"{base}/task-monitoring/{task_id}/")
    assert "capacity reserved for maintenance (“firmware”) until" in page.content()
    assert violations == []
