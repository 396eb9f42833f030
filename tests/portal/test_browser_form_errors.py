"""The create form in Chromium: a queue's default wall time is shown before submit, a submission that would be
stopped by it is refused, and the refused form opens on a summary with the focus on the field to fix."""

from __future__ import annotations

from datetime import timedelta

import pytest

from apps.tasks.models import Task
from tests.portal.test_browser import log_in, shot

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def short_default_wall_time(world) -> None:
    world.high.default_wall_time = timedelta(seconds=30)
    world.high.save(update_fields=["default_wall_time"])


@pytest.mark.parametrize("width", [390, 1366])
def test_a_refused_submit_shows_a_summary_and_focuses_the_field_to_fix(
    db_thread, browser, live_server_url, live_world, width
):
    world, base = live_world, live_server_url
    db_thread.run(short_default_wall_time, world)
    page = browser.new_page(viewport={"width": width, "height": 900})
    log_in(page, base, "max")
    page.goto(f"{base}/training-jobs/new/")
    page.fill("#id_name", "ten-minute-job")
    page.select_option("#id_project", str(world.project.pk))
    page.select_option("#id_queue", str(world.high.pk))
    wall = page.locator(f'.queue-rules li[data-queue-id="{world.high.pk}"] [data-queue-wall]')
    assert "a job is stopped after 30 s unless you set one" in wall.inner_text()
    assert wall.is_visible()
    page.fill("#id_gpu_spec", "1(A100)")
    page.fill("#id_expected_duration", "10m")
    page.fill("#id_command", "sleep 600")
    page.click("text=Create and submit")
    summary = page.locator("[data-error-summary]")
    summary.wait_for()
    assert "not submitted" in summary.inner_text()
    assert "30 s (its default wall time)" in summary.inner_text() and "10 min" in summary.inner_text()
    page.wait_for_function("() => document.activeElement && document.activeElement.id === 'id_wall_time'")
    box = page.locator("#id_wall_time").bounding_box()
    assert 0 <= box["y"] <= 900, "the field in error is scrolled into view"
    shot(page, f"form-refused-wall-time-{width}")
    assert not db_thread.run(lambda: Task.objects.filter(name="ten-minute-job").exists())
