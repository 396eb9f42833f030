"""End to end in Chromium against Daphne: log in, submit a training job, watch it queue and run live, stop it.

The scheduler and the status sync are called by the test (no Celery worker runs here); everything the
page shows after submission arrives over the WebSocket, without a reload.
"""

from __future__ import annotations

import re
import time

import pytest

from apps.control.scheduling import run_cycle
from apps.tasks.models import Task
from apps.tasks.services import stop_task, submit_task
from tests.control import drive
from tests.portal.conftest import SCREENSHOTS

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

PASSWORD = "pw-for-tests-1"


def shot(page, name: str) -> None:
    page.screenshot(path=str(SCREENSHOTS / f"{name}.png"), full_page=True)


def log_in(page, base: str, username: str) -> None:
    page.goto(f"{base}/compute-tasks/")
    assert "/accounts/login/" in page.url
    shot(page, "01-login")
    page.fill("#id_username", username)
    page.fill("#id_password", PASSWORD)
    page.click("button[type=submit]")
    page.wait_for_url(f"{base}/compute-tasks/")


def watch_policy(page, violations: list[str]) -> None:
    """Collect what the Content Security Policy blocked on the page (Chromium reports it on the console)."""
    page.on("console", lambda m: violations.append(m.text) if "Content Security Policy" in m.text else None)


def occupy_all_gpus(world) -> Task:
    blocker = submit_task(
        world.owner,
        project=world.project,
        queue="high",
        name="blocker",
        kind="training",
        gpu_spec="8(A100)",
        command="sleep 120",
    )
    run_cycle(world.vdc.pk)
    blocker.refresh_from_db()
    assert blocker.status in ("scheduled", "starting", "running")
    return blocker


def free_the_gpus_and_run(world, blocker: Task, task_id: int) -> str:
    stop_task(blocker, world.owner, reason="make room")
    run_cycle(world.vdc.pk)
    task = Task.objects.get(pk=task_id)
    if task.status == "scheduled":
        drive.launch(task)
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        drive.reconcile_all()
        task.refresh_from_db()
        if task.status == "running":
            return task.status
        time.sleep(0.3)
    return task.status


def test_submit_queue_run_and_stop_a_training_job_live(db_thread, browser, live_server_url, live_world):
    world = live_world
    base = live_server_url
    blocker = db_thread.run(occupy_all_gpus, world)
    page = browser.new_page(viewport={"width": 1366, "height": 900})
    violations: list[str] = []
    watch_policy(page, violations)
    log_in(page, base, "max")
    shot(page, "02-compute-tasks")

    # Functions, not expression strings, below: Playwright evaluates a string with eval(), which the policy blocks.
    page.goto(f"{base}/training-jobs/new/")
    page.fill("#id_name", "bert-finetune")
    page.select_option("#id_project", str(world.project.pk))
    page.select_option("#id_framework", "pytorch")
    page.fill("#id_model_path", "/models/bert-base")
    page.select_option("#id_queue", str(world.medium.pk))
    page.fill("#id_gpu_spec", "")
    page.click(".gpu-picker [data-gpu-pick]")
    assert page.input_value("#id_gpu_spec") == "1(A100-80G)"
    page.fill("#id_cpu", "4")
    page.fill("#id_memory_gib", "16")
    page.fill("#id_epochs", "3")
    page.fill("#id_command", "echo hello from bert; sleep 120")
    page.fill("#id_env", "EPOCHS=3")
    page.click("text=Create and submit")
    error = page.locator("#id_expected_duration-errors")
    error.wait_for()
    assert "expected duration" in error.inner_text()
    assert "medium" in error.inner_text()
    shot(page, "03-training-form-duration-error")

    page.fill("#id_expected_duration", "1h")
    page.click("text=Create and submit")
    page.wait_for_url(re.compile(r"/task-monitoring/\d+/$"))
    task_id = int(re.search(r"/task-monitoring/(\d+)/", page.url).group(1))
    summary = page.locator('.status-card [data-field="summary"]')
    # Submission asks for a cycle; here Celery runs it at once, and the test runs one more for good measure.
    db_thread.run(run_cycle, world.vdc.pk)
    page.wait_for_function(
        "() => document.querySelector('.status-card [data-field=\"summary\"]').textContent.includes('position 1')"
    )
    assert re.match(r"queued, position 1, estimated start (\d{4}-\d\d-\d\d \d\d:\d\d|unknown)", summary.inner_text())
    page.locator('[data-live-status="open"]').wait_for()
    page.evaluate("window.__notReloaded = true")
    shot(page, "04-monitoring-queued")

    assert db_thread.run(free_the_gpus_and_run, world, blocker, task_id) == "running"
    badge = page.locator('.page-head [data-field="status"]')
    page.wait_for_function(
        "() => document.querySelector('.page-head [data-field=\"status\"]').textContent === 'Running'"
    )
    assert page.evaluate("window.__notReloaded") is True, "the page reloaded instead of updating live"
    assert summary.inner_text().startswith("running on local-1")
    page.wait_for_function("() => document.querySelector('[data-log-url]').textContent.includes('hello from bert')")
    page.locator(".timeline .event-started").wait_for()
    shot(page, "05-monitoring-running")

    # Stop asks first: dismissed, nothing happens; accepted, the task stops.
    questions = []
    page.once("dialog", lambda dialog: (questions.append(dialog.message), dialog.dismiss()))
    page.click(".page-head form[data-show-when=live] button")
    page.wait_for_timeout(300)
    assert badge.inner_text() == "Running" and f"/task-monitoring/{task_id}/" in page.url
    page.once("dialog", lambda dialog: (questions.append(dialog.message), dialog.accept()))
    page.click(".page-head form[data-show-when=live] button")
    page.wait_for_url(f"{base}/task-monitoring/{task_id}/")
    assert badge.inner_text() == "Stopped"
    assert len(questions) == 2 and questions[0].startswith(f"Stop training job #{task_id} ")
    assert page.locator(".messages").inner_text().startswith("Task #")
    assert db_thread.run(lambda: Task.objects.get(pk=task_id).status) == "stopped"
    shot(page, "06-monitoring-stopped")

    pages = [
        ("/", "07-dashboard"),
        ("/task-queues/", "08-task-queues"),
        ("/inference-services/new/", "09-inference-form"),
        ("/instances/", "10-dev-environments"),
    ]
    for path, name in pages:
        page.goto(base + path)
        shot(page, name)
    narrow = browser.new_page(viewport={"width": 390, "height": 844}, is_mobile=True)
    watch_policy(narrow, violations)
    narrow.context.add_cookies(page.context.cookies())
    narrow.goto(f"{base}/compute-tasks/")
    shot(narrow, "11-narrow-compute-tasks")
    narrow.click(".nav-toggle-label")
    shot(narrow, "12-narrow-menu")
    assert not violations, f"the Content Security Policy blocked: {violations}"
