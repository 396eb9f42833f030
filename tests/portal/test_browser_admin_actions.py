"""In Chromium: an operator selects every queued task of a filtered admin list and cancels them in one
action; the clusters list tests a connection. Screenshots kept as artifacts."""

from __future__ import annotations

import pytest

from apps.clusters.models import Cluster
from apps.tasks.models import Task
from tests.factories import TaskFactory
from tests.portal.test_browser import shot, watch_policy
from tests.portal.test_browser_admin import admin_log_in

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def test_select_all_and_cancel_four_hundred_queued_tasks(db_thread, browser, live_server_url, live_world):
    world = live_world

    def queue_many():
        TaskFactory.create_batch(
            400, project=world.project, owner=world.member, vdc=world.vdc, queue=world.low, status="queued"
        )
        TaskFactory(project=world.project, owner=world.member, vdc=world.vdc, queue=world.high, status="running")

    db_thread.run(queue_many)
    page = browser.new_page(viewport={"width": 1366, "height": 900})
    violations: list[str] = []
    watch_policy(page, violations)
    admin_log_in(page, live_server_url)
    page.goto(f"{live_server_url}/admin/tasks/task/?status__exact=queued")
    page.check("#action-toggle")
    page.click(".question a")  # "Select all 400 tasks"
    page.select_option("select[name=action]", "cancel")
    page.click("button[name=index]")
    # A confirmation page first: nothing is stopped until "Yes".
    summary = page.locator("[data-cancel-summary]")
    assert "Stop 400 selected tasks: 0 running or starting, 400 waiting." in summary.inner_text()
    shot(page, "admin-00-bulk-cancel-confirm")
    assert db_thread.run(lambda: Task.objects.filter(status="stopped").count()) == 0
    page.click("input[name=confirm]")
    page.wait_for_selector(".messagelist")
    assert "400 task(s) stopped." in page.locator(".messagelist").inner_text()
    shot(page, "admin-01-bulk-cancel-400")
    counts = db_thread.run(
        lambda: (Task.objects.filter(status="stopped").count(), Task.objects.filter(status="running").count())
    )
    assert counts == (400, 1)  # all of the filtered list, and nothing outside it

    page.goto(f"{live_server_url}/admin/clusters/cluster/")
    page.check(f"input[name=_selected_action][value='{world.cluster.pk}']")
    page.select_option("select[name=action]", "check_now")
    page.click("button[name=index]")
    page.wait_for_selector(".messagelist")
    shown = page.locator(".messagelist").inner_text().lower()
    assert f"{world.cluster.name}: healthy: local executor ready" in shown
    shot(page, "admin-02-test-connection")
    assert db_thread.run(lambda: Cluster.objects.get(pk=world.cluster.pk).last_heartbeat) is not None
