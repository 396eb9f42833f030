"""The utilisation history and the idle autostop warning on a dev environment's monitoring page, in Chromium, at
desktop width and at 390 px (docs/monitoring.md "Utilisation history"). Saves usage-01-desktop.png and
usage-02-phone.png."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from apps.clusters.models import Device
from apps.tasks import usage
from apps.tasks.models import TaskUsageSample
from tests.factories import TaskFactory
from tests.portal.test_browser import log_in, shot

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def idle_notebook(world) -> int:
    world.project.idle_stop_percent, world.project.idle_stop_minutes = 10, 30
    world.project.save()
    card = Device.objects.get(node=world.node, index=0)
    task = TaskFactory(
        project=world.project,
        owner=world.member,
        vdc=world.vdc,
        queue=world.high,
        kind="dev_env",
        ide_type="jupyter",
        name="notebook",
        status="running",
        cluster=world.cluster,
        started_at=timezone.now() - timedelta(hours=3),
        placement=[{"node": world.node.pk, "node_name": world.node.name, "devices": [{"id": card.pk, "milli": 1000}]}],
    )
    top = usage.minute_of(timezone.now())
    # Two busy hours, then 25 idle minutes: the stop is 5 minutes away, inside the warning lead.
    TaskUsageSample.objects.bulk_create(
        TaskUsageSample(
            task=task,
            at=top - timedelta(minutes=i),
            gpu_percent=2 if i < 25 else 60 + i % 30,
            vram_used_gib=12 if i < 25 else 40,
            vram_gib=80,
            cards=1,
        )
        for i in range(150)
    )
    return task.pk


@pytest.mark.parametrize(("width", "name"), [(1400, "usage-01-desktop"), (390, "usage-02-phone")])
def test_the_page_charts_the_history_and_warns_before_the_stop(
    db_thread, browser, live_server_url, live_world, width, name
):
    task_id = db_thread.run(idle_notebook, live_world)
    page = browser.new_page(viewport={"width": width, "height": 900})
    log_in(page, live_server_url, "max")
    page.goto(f"{live_server_url}/task-monitoring/{task_id}/")
    warning = page.locator('[data-field="idle-warning"]')
    assert warning.is_visible()
    assert "idle for 25 min under 10% GPU" in warning.inner_text() and "will be stopped at" in warning.inner_text()
    chart = page.locator('[data-field="usage-chart"] svg')
    chart.scroll_into_view_if_needed()
    assert chart.is_visible() and chart.bounding_box()["width"] <= width
    assert page.locator('[data-field="usage-chart"] polyline').count() == 2
    mean = page.locator('[data-field="mean-gpu"]').inner_text()
    assert "Mean GPU utilisation" in mean and "over 150 min recorded" in mean
    assert "stops it after 30 min under 10% GPU utilisation" in page.locator('[data-field="idle-stop"]').inner_text()
    assert page.evaluate("() => document.documentElement.scrollWidth") <= width
    shot(page, name)
