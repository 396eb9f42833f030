"""The monitoring page follows a running job's log in Chromium: new output is appended as it is written,
each line once, through the API's log cursor."""

from __future__ import annotations

import time

import pytest

from apps.control.scheduling import run_cycle
from apps.tasks.models import Task
from apps.tasks.services import submit_task
from tests.control import drive
from tests.portal.test_browser import log_in, shot

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

LINES = "".join(f"tick {n}\n" for n in range(1, 9))


def submit_ticker(world) -> int:
    command = 'for n in 1 2 3 4 5 6 7 8; do echo "tick $n"; sleep 0.7; done'
    task = submit_task(
        world.member,
        project=world.project,
        queue="high",
        name="ticker",
        kind="training",
        gpu_spec="1(A100)",
        command=command,
    )
    return task.pk


def beat_until_ended(task_id: int) -> str:
    """Cycles and status sync, as beat runs them, until the job has ended."""
    task = Task.objects.get(pk=task_id)
    deadline = time.monotonic() + 60
    while task.status not in ("completed", "failed", "stopped") and time.monotonic() < deadline:
        run_cycle(task.vdc_id)
        drive.reconcile_all()
        time.sleep(0.3)
        task.refresh_from_db()
    return task.status


def test_the_monitoring_page_appends_a_running_jobs_output_live(db_thread, browser, live_server_url, live_world):
    base = live_server_url
    task_id = db_thread.run(submit_ticker, live_world)
    page = browser.new_page(viewport={"width": 1366, "height": 900})
    log_in(page, base, "max")
    page.goto(f"{base}/task-monitoring/{task_id}/")
    requests = []
    page.on("request", lambda r: requests.append(r.url) if "/api/v1/tasks/" in r.url else None)
    assert db_thread.run(beat_until_ended, task_id) == "completed"
    page.wait_for_function(
        "(expected) => document.querySelector('[data-log-url]').textContent === expected", arg=LINES, timeout=20000
    )
    shot(page, "logs-01-followed-to-the-end")
    assert any("after=" in url for url in requests), "the page should read only new output through the cursor"
    page.wait_for_timeout(1500)  # later reads do not repeat what the page shows
    assert page.locator("[data-log-url]").text_content() == LINES
