"""Sweeps in Chromium at a phone's width and a desktop's: the form previews a grid with its price and submits
it, the sweep's page counts its tasks and links each one, Stop all asks first; nothing overflows at 390 px.

Screenshots: test-artifacts/screenshots/sweep-*-{390,1366}.png.
"""

from __future__ import annotations

from decimal import Decimal

import pytest

from apps.billing.models import PriceRule
from apps.tasks.models import Sweep, Task
from apps.tasks.services import stop_task
from tests.control import drive
from tests.portal.test_browser import log_in, shot

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

TASK_FILE = "name: lr\nkind: training\nproject: alpha\nqueue: high\ngpu_spec: 8(A100)\ncpu: 2\ncommand: sleep 600\n"


def end_all(world) -> None:
    for task in Task.objects.exclude(status__in=("stopped", "completed", "failed")):
        stop_task(task, world.member, reason="test over")
    drive.wait_objects_ended(world.cluster)


def overflow(page) -> int:
    return page.evaluate("() => document.documentElement.scrollWidth - document.documentElement.clientWidth")


@pytest.mark.parametrize("width", [390, 1366])
def test_sweep_form_page_and_stop_all(db_thread, browser, live_server_url, live_world, width):
    world, base = live_world, live_server_url
    db_thread.run(lambda: PriceRule.objects.create(resource_type="cpu", price_per_hour=Decimal("0.5")))
    page = browser.new_page(viewport={"width": width, "height": 900})
    violations: list[str] = []
    page.on("console", lambda m: "Content Security Policy" in m.text and violations.append(m.text))
    log_in(page, base, "max")
    try:
        page.goto(f"{base}/sweeps/new/")
        page.fill("#id_task_file", TASK_FILE)
        page.fill("#id_parameters", "lr: [0.1, 0.01]\nbatch_size: [32, 64]")
        page.click("button[name=preview]")
        preview = page.locator("[data-field=preview]")
        assert "Preview: 4 tasks" in preview.inner_text()
        assert page.locator("[data-price]").inner_text().startswith("4.00 ")  # 2 CPU x 0.5 x 4 tasks
        assert db_thread.run(lambda: Sweep.objects.count()) == 0
        assert overflow(page) <= 0
        shot(page, f"sweep-01-preview-{width}")

        page.click("form[data-form=sweep] button.primary")
        page.wait_for_url(f"{base}/sweeps/*/")
        sweep = db_thread.run(lambda: Sweep.objects.get())
        tasks = db_thread.run(lambda: list(sweep.tasks.order_by("pk")))
        assert page.locator("[data-count=total]").inner_text() == "4"
        rows = page.locator("[data-table=elements] tbody tr")
        assert rows.count() == 4
        assert "0.01" in rows.nth(3).inner_text() and "64" in rows.nth(3).inner_text()
        assert page.locator(f'[data-element="{tasks[0].pk}"] a').first.get_attribute("href") == (
            f"/task-monitoring/{tasks[0].pk}/"
        )
        assert overflow(page) <= 0
        shot(page, f"sweep-02-page-{width}")

        questions: list[str] = []
        page.once("dialog", lambda dialog: (questions.append(dialog.message), dialog.dismiss()))
        page.click("[data-action=stop-sweep]")
        page.wait_for_timeout(300)
        assert db_thread.run(lambda: sweep.tasks.filter(status="stopped").count()) == 0
        page.once("dialog", lambda dialog: (questions.append(dialog.message), dialog.accept()))
        page.click("[data-action=stop-sweep]")
        page.locator(".messages").wait_for()
        assert "Sweep lr: 4 task(s) stopped." in page.locator(".messages").inner_text()
        assert questions[0].startswith("Stop the 4 task(s) of sweep “lr”")
        assert page.locator("[data-count=finished]").inner_text() == "4"
        assert page.locator("[data-action=stop-sweep]").count() == 0
        shot(page, f"sweep-03-stopped-{width}")

        page.goto(f"{base}/sweeps/")
        assert page.locator(f'[data-sweep="{sweep.pk}"]').is_visible() and overflow(page) <= 0
        shot(page, f"sweep-04-list-{width}")
    finally:
        db_thread.run(end_all, world)
    assert not violations, f"the Content Security Policy blocked: {violations}"
