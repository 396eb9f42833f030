"""In Chromium: the operator dashboard at /admin/ and the admin's wide lists at 1366 px.

Screenshots land in test-artifacts/screenshots/ (admin-dashboard.png, admin-task-changelist.png).
"""

from __future__ import annotations

import pytest

from apps.control.scheduling import run_cycle
from apps.tasks.services import submit_task
from tests.factories import ClusterFactory, TaskFactory
from tests.portal.test_browser import PASSWORD, shot, watch_policy

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

LAPTOP = {"width": 1366, "height": 900}


def operator_world(world) -> None:
    """A running task holding 4 A100s, one waiting behind it, a cluster never checked, one down, many tasks."""
    world.admin.set_password(PASSWORD)
    world.admin.save()
    submit_task(
        world.owner,
        project=world.project,
        queue="high",
        name="big-run",
        kind="training",
        gpu_spec="4(A100)",
        command="sleep 120",
    )
    run_cycle(world.vdc.pk)
    submit_task(
        world.outsider,
        project=world.other_project,
        queue="high",
        name="waits",
        kind="training",
        gpu_spec="8(A100)",
        command="sleep 120",
    )
    run_cycle(world.vdc.pk)
    ClusterFactory(vdc=world.vdc, name="new-slurm", cluster_type="slurm", status="unknown")
    ClusterFactory(
        vdc=world.vdc,
        name="old-k8s",
        cluster_type="kubernetes",
        status="unavailable",
        status_message="connection refused by 10.0.0.5:6443",
    )
    TaskFactory.create_batch(
        30,
        project=world.project,
        owner=world.member,
        vdc=world.vdc,
        queue=world.low,
        status="stopped",
        name="a-rather-long-task-name-for-the-changelist-columns",
    )


# Where the operator dashboard ends against the column of "Recent actions" beside the app list, and its column titles
# and first cells (the alert's severity and rule, the cluster's name) that take more than one line.
LAYOUT = """() => {
    const lines = el => {
        const range = document.createRange();
        range.selectNodeContents(el);
        return new Set([...range.getClientRects()].map(r => Math.round(r.top))).size;
    };
    const cells = [...document.querySelectorAll(
        '.hcs-dashboard thead th, #dashboard-alerts td:nth-child(-n+2), .dashboard-clusters tbody td:first-child a')];
    return {
        dashboard: document.querySelector('.hcs-dashboard').getBoundingClientRect().right,
        recent_actions: document.querySelector('#content-related').getBoundingClientRect().right,
        broken: cells.filter(el => lines(el) > 1).map(el => el.innerText),
    };
}"""


def admin_log_in(page, base: str) -> None:
    page.goto(f"{base}/admin/")
    assert "/admin/login/" in page.url
    page.fill("#id_username", "admin")
    page.fill("#id_password", PASSWORD)
    page.click("input[type=submit]")
    page.wait_for_url(f"{base}/admin/")


def test_operator_dashboard_and_task_list_fit_a_laptop_screen(db_thread, browser, live_server_url, live_world):
    base = live_server_url
    db_thread.run(operator_world, live_world)
    page = browser.new_page(viewport=LAPTOP)
    violations: list[str] = []
    watch_policy(page, violations)
    admin_log_in(page, base)

    dashboard = page.locator("section.hcs-dashboard")
    assert dashboard.is_visible()
    text = dashboard.inner_text()
    for expected in (
        "Alerts firing",
        "ClusterUnavailable",
        "Check the backend endpoint and credentials",
        "connection refused",
        "Not checked yet",
        "A100-80G: 4 / 8",
        "Top projects by use",
        "alpha",
        "Top projects by wait",
        "beta",
        "Queue backlog and waits",
    ):
        assert expected in text, expected
    assert dashboard.locator("figure.chart svg polyline").count() == 5
    assert page.locator("#content-main .app-tasks").is_visible(), "the app list stays below the dashboard"
    width = page.evaluate("() => document.documentElement.scrollWidth")
    shot(page, "admin-dashboard")
    assert width <= LAPTOP["width"], width
    # The tables use the page's width (not a column beside an empty quarter) and no title or word is broken.
    layout = page.evaluate(LAYOUT)
    assert layout["dashboard"] >= layout["recent_actions"] - 2, layout
    assert layout["broken"] == [], layout

    page.goto(f"{base}/admin/tasks/task/")
    assert page.locator("#result_list tbody tr").count() >= 32
    width = page.evaluate("() => document.documentElement.scrollWidth")
    # Every column of the list shows: the table does not scroll inside its box either.
    hidden = page.evaluate(
        "() => { const r = document.querySelector('#changelist .results'); return r.scrollWidth - r.clientWidth; }"
    )
    shot(page, "admin-task-changelist")
    assert width <= LAPTOP["width"], width
    assert hidden <= 0, f"{hidden} px of the task list are cut off"
    assert not page.locator("#nav-sidebar").is_visible()
    assert not violations, f"the Content Security Policy blocked: {violations}"
