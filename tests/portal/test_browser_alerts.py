"""In Chromium: an alert for the member's project arrives live on a page already open (a notice) and in the
dashboard's list, and leaves the list when it clears; nothing reloads."""

from __future__ import annotations

from decimal import Decimal

import pytest

from apps.billing import project_alerts
from apps.tasks.models import Task
from tests.factories import TaskFactory
from tests.portal.conftest import SCREENSHOTS
from tests.portal.test_browser import log_in

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def fill_the_quota(world) -> None:
    TaskFactory(
        project=world.project,
        owner=world.member,
        vdc=world.vdc,
        queue=world.high,
        status="running",
        allocated_gpu=Decimal(world.quota.limit_gpu),
        replicas=1,
        name="big",
    )


def test_an_alert_is_pushed_live_to_the_members_pages(db_thread, browser, live_server_url, live_world):
    world = live_world
    page = browser.new_page(viewport={"width": 1366, "height": 900})
    log_in(page, live_server_url, "max")
    page.goto(f"{live_server_url}/")
    page.locator('[data-live-status="open"]').wait_for()
    page.evaluate("() => { window.__notReloaded = true; }")
    assert page.locator("[data-alerts]").is_hidden()

    db_thread.run(fill_the_quota, world)
    db_thread.run(project_alerts.refresh)
    toast = page.locator("[data-toast]")
    toast.first.wait_for()
    assert "Quota used up" in toast.first.inner_text()
    item = page.locator("[data-alert-list] li")
    item.first.wait_for()
    assert "GPU quota used up" in item.first.inner_text() and page.locator("[data-alerts]").is_visible()
    page.screenshot(path=str(SCREENSHOTS / "alerts-dashboard.png"), full_page=True)

    db_thread.run(lambda: Task.objects.filter(name="big").update(status="completed"))
    db_thread.run(project_alerts.refresh)
    page.wait_for_function("() => !document.querySelector('[data-alert-list] li')")
    assert page.locator("[data-alerts]").is_hidden()
    assert page.evaluate("() => window.__notReloaded") is True
