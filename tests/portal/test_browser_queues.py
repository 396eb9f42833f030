"""In Chromium: who is ahead of me in a queue, the dashboard's running tasks first,
new rows arriving live in lists, sorting, bulk stop with a confirmation, and the phone layout at 390 px.

Screenshots land in test-artifacts/screenshots/ under the names the report walks through.
"""

from __future__ import annotations

from datetime import timedelta
from decimal import Decimal

import pytest
from django.utils import timezone

from apps.billing.models import Account
from apps.billing.services import add_credit, generate_invoice, meter_usage, month_bounds, seed_demo_prices
from apps.control.scheduling import run_cycle
from apps.tasks.models import Task
from apps.tasks.services import submit_task
from tests.factories import TaskFactory
from tests.portal.test_browser import log_in, shot, watch_policy

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

PHONE = {"width": 390, "height": 844}
DESKTOP = {"width": 1366, "height": 900}


def submit(user, project, name, gpu_spec="1(A100)", kind="training", queue="high") -> Task:
    return submit_task(user, project=project, queue=queue, name=name, kind=kind, gpu_spec=gpu_spec, command="sleep 120")


def busy_queue(world) -> dict[str, int]:
    """Every card held by a high task, then beta's task and max's task waiting in the high queue, ranked."""
    blocker = submit(world.owner, world.project, "blocker", gpu_spec="8(A100)")
    run_cycle(world.vdc.pk)
    theirs = submit(world.outsider, world.other_project, "secret-beta-run", gpu_spec="2(A100)")
    mine = submit(world.member, world.project, "my-alpha-run")
    run_cycle(world.vdc.pk)
    return {"blocker": blocker.pk, "theirs": theirs.pk, "mine": mine.pk}


def another_outsider_task(world) -> None:
    submit(world.outsider, world.other_project, "secret-beta-second", gpu_spec="4(A100)")
    run_cycle(world.vdc.pk)


def test_queue_page_names_my_task_and_anonymises_another_projects(db_thread, browser, live_server_url, live_world):
    world, base = live_world, live_server_url
    ids = db_thread.run(busy_queue, world)
    page = browser.new_page(viewport=DESKTOP)
    violations: list[str] = []
    watch_policy(page, violations)
    log_in(page, base, "max")
    page.goto(f"{base}/task-queues/")
    lineup = page.locator(f'[data-lineup="{world.high.pk}"]')
    rows = lineup.locator("tbody tr")
    assert rows.count() == 2
    first, second = rows.nth(0).inner_text(), rows.nth(1).inner_text()
    assert first.startswith("1") and "another project's task, 2(A100), 1 CPU, 1 GiB, waiting 0 min" in first
    # Of another project's task only the kind of reason it waits for.
    assert rows.nth(0).locator('[data-field="reason"]').inner_text() == "waits for free capacity"
    assert second.startswith("2") and f"#{ids['mine']} my-alpha-run" in second and "yours · alpha" in second
    assert "estimated start" not in second.lower() or "unknown" in second or "20" in second
    assert rows.nth(1).locator(f'a[href="/task-monitoring/{ids["mine"]}/"]').count() == 1
    assert "secret-beta-run" not in page.content() and "oscar" not in page.content()
    shot(page, "queue-lineup")

    # Another project's task arrives: the line redraws live, still anonymised.
    page.locator('[data-live-status="open"]').wait_for()
    page.evaluate("window.__notReloaded = true")
    db_thread.run(another_outsider_task, world)
    selector = f'[data-lineup="{world.high.pk}"] [data-lineup-other]'
    page.wait_for_function(f"() => document.querySelectorAll('{selector}').length === 2", timeout=15000)
    assert page.evaluate("window.__notReloaded") is True
    assert "another project's task, 4(A100)" in lineup.inner_text()
    assert "secret-beta" not in page.content()
    shot(page, "queue-lineup-live")

    # The outsider sees their own tasks by name and alpha's anonymised.
    other = browser.new_page(viewport=DESKTOP)
    log_in(other, base, "oscar")
    other.goto(f"{base}/task-queues/")
    text = other.locator(f'[data-lineup="{world.high.pk}"]').inner_text()
    assert "secret-beta-run" in text and "my-alpha-run" not in text and "another project's task, 1(A100)" in text
    shot(other, "queue-lineup-outsider")

    # On a phone the reason stays in the line's table, which scrolls inside its card, not the page.
    phone = browser.new_page(viewport=PHONE, is_mobile=True, has_touch=True)
    log_in(phone, base, "max")
    phone.goto(f"{base}/task-queues/")
    reason = phone.locator(f'[data-lineup="{world.high.pk}"] [data-lineup-other] [data-field="reason"]').first
    reason.scroll_into_view_if_needed()
    assert reason.is_visible() and reason.inner_text() == "waits for free capacity"
    assert phone.evaluate("() => document.documentElement.scrollWidth") <= PHONE["width"]
    shot(phone, "phone-queue-lineup-reason")
    assert not violations, f"the Content Security Policy blocked: {violations}"


def running_and_30_queued(world) -> int:
    now = timezone.now()
    running = TaskFactory(
        project=world.project,
        owner=world.member,
        vdc=world.vdc,
        queue=world.high,
        status="running",
        name="my-running-run",
        cluster=world.cluster,
        started_at=now - timedelta(hours=1),
    )
    Task.objects.filter(pk=running.pk).update(submitted_at=now - timedelta(hours=2))
    for position in range(1, 31):
        TaskFactory(
            project=world.project,
            owner=world.member,
            vdc=world.vdc,
            queue=world.low,
            status="queued",
            name=f"flood-{position:02d}",
            queue_position=position,
        )
    return running.pk


def test_dashboard_shows_my_running_task_despite_30_newer_queued_ones(db_thread, browser, live_server_url, live_world):
    world, base = live_world, live_server_url
    running = db_thread.run(running_and_30_queued, world)
    page = browser.new_page(viewport=DESKTOP)
    log_in(page, base, "max")
    page.goto(f"{base}/")
    rows = page.locator("table.tasks tbody tr")
    assert rows.count() == 20
    assert rows.nth(0).get_attribute("data-live-task") == str(running)
    assert "my-running-run" in rows.nth(0).inner_text() and "flood-01" in rows.nth(1).inner_text()
    more = page.locator("[data-more-tasks]")
    assert more.inner_text() == "11 more running or waiting tasks of yours →"
    shot(page, "dashboard-running-first")
    more.click()
    page.wait_for_url("**/compute-tasks/**")
    assert page.locator("table.tasks tbody tr").count() == 31
    assert "my-running-run" in page.locator("table.tasks tbody tr").nth(0).inner_text()


def colleague_submits(world, name: str) -> None:
    submit(world.owner, world.project, name)


def others_submit(world) -> None:
    submit(world.outsider, world.other_project, "outsider-training")
    submit(world.owner, world.project, "olivia-notebook", kind="dev_env")


def test_a_new_task_appears_live_in_an_open_list(db_thread, browser, live_server_url, live_world):
    world, base = live_world, live_server_url
    db_thread.run(colleague_submits, world, "first-run")
    page = browser.new_page(viewport=DESKTOP)
    log_in(page, base, "max")
    page.goto(f"{base}/training-jobs/?sort=name")
    page.locator('[data-live-status="open"]').wait_for()
    page.evaluate("window.__notReloaded = true")
    assert page.locator("table.tasks tbody tr").count() == 1

    db_thread.run(others_submit, world)
    db_thread.run(colleague_submits, world, "a-colleague-run")
    page.wait_for_function(
        "() => document.querySelector('table.tasks tbody').textContent.includes('a-colleague-run')", timeout=15000
    )
    assert page.evaluate("window.__notReloaded") is True
    names = page.locator("table.tasks tbody tr td.name a").all_inner_texts()
    # The list keeps its kind (training jobs) and sort (name), and shows only alpha's tasks.
    assert names == ["a-colleague-run", "first-run"]
    assert "outsider-training" not in page.content() and "olivia-notebook" not in page.content()
    shot(page, "list-new-row-live")


def three_of_mine(world) -> list[int]:
    """Three queued tasks of max's that cannot start: a high task of olivia's holds every card."""
    submit(world.owner, world.project, "blocker", gpu_spec="8(A100)")
    run_cycle(world.vdc.pk)
    return [
        TaskFactory(
            project=world.project, owner=world.member, vdc=world.vdc, queue=world.high, status="queued", name=name
        ).pk
        for name in ("b-run", "a-run", "c-run")
    ]


def test_sort_and_bulk_stop_with_a_confirmation(db_thread, browser, live_server_url, live_world):
    world, base = live_world, live_server_url
    b, a, c = db_thread.run(three_of_mine, world)
    page = browser.new_page(viewport=DESKTOP)
    log_in(page, base, "max")
    page.goto(f"{base}/compute-tasks/?q=-run")
    names = page.locator("table.tasks tbody tr td.name a")
    assert names.all_inner_texts() == ["c-run", "a-run", "b-run"]  # newest first
    page.click("th a[data-sort=name]")
    page.wait_for_url("**sort=name")
    assert names.all_inner_texts() == ["a-run", "b-run", "c-run"]
    page.click("th a[data-sort=name]")
    page.wait_for_url("**sort=-name")
    assert names.all_inner_texts() == ["c-run", "b-run", "a-run"]
    shot(page, "list-sorted-by-name")

    page.check(f'input[name=task][value="{a}"]')
    page.check(f'input[name=task][value="{b}"]')
    questions: list[str] = []
    page.once("dialog", lambda dialog: (questions.append(dialog.message), dialog.dismiss()))
    page.click("#stop-selected button[type=submit]")
    page.wait_for_timeout(300)
    assert (
        db_thread.run(lambda: sorted(Task.objects.filter(pk__in=(a, b, c)).values_list("status", flat=True)))
        == ["queued"] * 3
    )
    page.once("dialog", lambda dialog: (questions.append(dialog.message), dialog.accept()))
    page.click("#stop-selected button[type=submit]")
    page.wait_for_load_state()
    page.locator(".messages").wait_for()
    assert questions[0].startswith("Stop 2 selected task(s)?") and len(questions) == 2
    assert page.locator(".messages").inner_text().startswith("2 tasks stopped")
    assert "sort=-name" in page.url
    statuses = db_thread.run(lambda: dict(Task.objects.values_list("pk", "status")))
    assert (statuses[a], statuses[b], statuses[c]) == ("stopped", "stopped", "queued")
    assert "q=-run" in page.url
    shot(page, "bulk-stopped")


def phone_world(world) -> int:
    """Tasks running and waiting, prices, an hour of metered usage, a ledger and an invoice to show."""
    seed_demo_prices()
    ids = busy_queue(world)
    submit(world.member, world.project, "a-training-job-with-a-rather-long-name-for-a-phone-screen", gpu_spec="1(A100)")
    now = timezone.now()
    meter_usage(now + timedelta(hours=1))
    account = Account.objects.get(project=world.project)
    add_credit(account, Decimal("250"), description="Top-up for the quarter's fine-tuning experiments, ticket 4711")
    start, end = month_bounds(now)
    generate_invoice(account, start, end)
    return ids["blocker"]


PHONE_PAGES = [
    ("/", "phone-dashboard"),
    ("/compute-tasks/", "phone-compute-tasks"),
    ("/training-jobs/", "phone-training-jobs"),
    ("/instances/", "phone-dev-environments"),
    ("/inference-services/", "phone-inference-services"),
    ("/task-queues/", "phone-task-queues"),
    ("/billing/", "phone-billing"),
]


def test_phone_layout_has_no_sideways_overflow_and_keeps_queue_and_actions(
    db_thread, browser, live_server_url, live_world
):
    world, base = live_world, live_server_url
    blocker = db_thread.run(phone_world, world)
    page = browser.new_page(viewport=PHONE, is_mobile=True, has_touch=True)
    violations: list[str] = []
    watch_policy(page, violations)
    log_in(page, base, "olivia")
    pages = [
        *PHONE_PAGES,
        (f"/task-monitoring/{blocker}/", "phone-monitoring"),
        (f"/billing/projects/{world.project.pk}/", "phone-billing-project"),
    ]
    widths = {}
    for path, name in pages:
        page.goto(base + path)
        widths[path] = page.evaluate("() => document.documentElement.scrollWidth")
        shot(page, name)
        rows = page.locator("table.tasks tbody tr[data-live-task]")
        if rows.count():
            for cell in ("td.queue", "td.actions"):
                box = rows.first.locator(cell).bounding_box()
                assert rows.first.locator(cell).is_visible(), (path, cell)
                assert box and box["x"] >= 0 and box["x"] + box["width"] <= PHONE["width"], (path, cell, box)
            stop = rows.first.locator("td.actions button").first
            assert stop.is_visible() and stop.bounding_box()["x"] + stop.bounding_box()["width"] <= PHONE["width"]
    assert all(width <= PHONE["width"] for width in widths.values()), widths
    page.goto(f"{base}/billing/projects/{world.project.pk}/")
    assert page.locator("text=Top-up for the quarter").count() == 1, "the billing page should show the seeded ledger"
    assert not violations, f"the Content Security Policy blocked: {violations}"
