"""The Web Console in Chromium: from the monitoring page's Terminal button to a prompt, a typed
command and its output, under the portal's Content Security Policy; a viewer gets no button and no shell.
"""

from __future__ import annotations

import time
from urllib.parse import urlsplit

import pytest

from apps.tasks.services import stop_task
from tests.control.drive import wait_status
from tests.portal.test_browser import log_in, shot, watch_policy
from tests.portal.test_terminal import start_running_task

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

ROWS = ".xterm-rows"


def rows_include(page, text: str, timeout_ms: int = 15000) -> None:
    script = "([sel, text]) => (document.querySelector(sel) || {textContent: ''}).textContent.includes(text)"
    page.wait_for_function(script, arg=[ROWS, text], timeout=timeout_ms)


def test_a_member_opens_the_terminal_types_a_command_and_sees_its_output(
    db_thread, browser, live_server_url, live_world
):
    base = live_server_url
    task = db_thread.run(start_running_task, live_world)
    page = browser.new_page(viewport={"width": 1366, "height": 900})
    violations: list[str] = []
    watch_policy(page, violations)
    log_in(page, base, "max")
    page.goto(f"{base}/task-monitoring/{task.pk}/")
    button = page.locator("[data-terminal-instance='0']")
    shot(page, "terminal-01-monitoring-button")

    clicked = time.monotonic()
    button.click()
    page.wait_for_url(f"{base}/task-monitoring/{task.pk}/terminal/?instance=0")
    rows_include(page, "$")
    prompt_s = time.monotonic() - clicked
    page.locator("[data-terminal-status][data-state=open]").wait_for()

    page.locator(".xterm").click()
    page.keyboard.type("echo hcs-$((40+2)) as $(id -un)")
    page.keyboard.press("Enter")
    rows_include(page, "hcs-42 as ")
    shot(page, "terminal-02-command-output")
    assert not violations, violations
    print(f"click -> terminal prompt: {prompt_s:.2f} s")  # the figure the issue asks for

    page.keyboard.type("exit")
    page.keyboard.press("Enter")
    page.locator("[data-terminal-status][data-state=closed]").wait_for()
    assert "The shell ended" in page.locator("[data-terminal-status]").inner_text()
    db_thread.run(lambda: (stop_task(task, live_world.member), wait_status(task, "stopped")))


def test_a_viewer_sees_no_terminal_button_and_the_page_says_why(db_thread, browser, live_server_url, live_world):
    base = live_server_url
    task = db_thread.run(start_running_task, live_world)
    page = browser.new_page(viewport={"width": 1366, "height": 900})
    log_in(page, base, "vera")
    page.goto(f"{base}/task-monitoring/{task.pk}/")
    assert page.locator("[data-terminal-instance]").count() == 0
    page.goto(f"{base}/task-monitoring/{task.pk}/terminal/")
    assert "viewers cannot open a terminal" in page.locator(".terminal-card").inner_text()
    assert page.locator(ROWS).count() == 0
    shot(page, "terminal-03-viewer-refused")
    db_thread.run(lambda: (stop_task(task, live_world.member), wait_status(task, "stopped")))


def test_an_inference_services_test_request_is_sent_by_the_portal_and_shows_the_answer(
    db_thread, browser, live_server_url, live_world
):
    from tests.portal.test_connect import start_inference

    base = live_server_url
    task = db_thread.run(start_inference, live_world)
    page = browser.new_page(viewport={"width": 1366, "height": 900})
    violations: list[str] = []
    watch_policy(page, violations)
    log_in(page, base, "max")
    page.goto(f"{base}/task-monitoring/{task.pk}/")
    assert "1 running / 1 desired" in page.locator("[data-field=replicas]").inner_text()
    port = urlsplit(base).port
    assert page.locator("[data-field=endpoint]").inner_text() == f"http://{task.pk}-8000.apps.localhost:{port}/"
    form = page.locator("form[data-test-request]")
    form.locator("input[name=path]").fill("v1/completions")
    form.locator("textarea[name=body]").fill('{"prompt": "hi"}')
    # The service needs a moment to listen after its job started: send until it answers.
    for _ in range(50):
        form.locator("button[type=submit]").click()
        page.wait_for_function("() => !document.querySelector('[data-test-response]').textContent.endsWith('…')")
        if page.locator("[data-test-response]").get_attribute("data-status") == "201":
            break
        time.sleep(0.2)
    assert 'got {"prompt": "hi"}' in page.locator("[data-test-response]").inner_text()
    shot(page, "service-01-test-request")
    assert not violations, violations
    db_thread.run(lambda: (stop_task(task, live_world.member), wait_status(task, "stopped")))


def test_underscores_are_drawn_at_normal_screen_density(db_thread, browser, live_server_url, live_world):
    """A row of underscores must not render like an empty row (the glyph sits below the baseline and was clipped)."""
    base = live_server_url
    task = db_thread.run(start_running_task, live_world)
    page = browser.new_page(viewport={"width": 1366, "height": 900}, device_scale_factor=1)
    log_in(page, base, "max")
    page.goto(f"{base}/task-monitoring/{task.pk}/terminal/?instance=0")
    rows_include(page, "$")
    page.locator(".xterm").click()
    page.keyboard.type("printf 'snake_case_name\\n%s\\n\\n' ________________")
    page.keyboard.press("Enter")
    script = "(sel) => [...document.querySelectorAll(sel)].some((row) => row.textContent.trim() === '_'.repeat(16))"
    page.wait_for_function(script, arg=f"{ROWS} > div", timeout=15000)
    rows = page.locator(f"{ROWS} > div")
    texts = rows.all_inner_texts()
    underscores = next(i for i, t in enumerate(texts) if t.strip() == "_" * 16)
    assert texts[underscores + 1].strip() == ""
    drawn, empty = rows.nth(underscores).bounding_box(), rows.nth(underscores + 1).bounding_box()
    clip = {"x": drawn["x"], "width": 100, "height": drawn["height"]}  # a strip over the first cells
    page.mouse.move(0, 0)
    underscore_pixels = page.screenshot(clip={**clip, "y": drawn["y"]})
    blank_pixels = page.screenshot(clip={**clip, "y": empty["y"]})
    shot(page, "terminal-04-underscores")
    assert underscore_pixels != blank_pixels, "the row of underscores renders exactly like an empty row"
    db_thread.run(lambda: (stop_task(task, live_world.member), wait_status(task, "stopped")))
