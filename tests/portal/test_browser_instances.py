"""The monitoring page of a running two-instance task on the local cluster, in Chromium: each rank with its
state, node, address, CPU and memory against what it asked for and its cards, the figures redrawn live. Saves the
screenshot docs/img/monitoring-two-instances.png is made from."""

from __future__ import annotations

import os
import shutil
import time
from decimal import Decimal
from pathlib import Path

import pytest

from apps.clusters.backends import executor_for
from apps.clusters.models import Device
from apps.control.scheduling import run_cycle
from apps.tasks.models import Task
from apps.tasks.services import submit_task
from tests.control import drive
from tests.portal.conftest import SCREENSHOTS
from tests.portal.test_browser import log_in, shot

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

# Rank 0 keeps a core busy; rank 1 grows its memory by 16 MiB a second, so its figure moves at every refresh.
COMMAND = (
    'echo "rank $HCS_RANK of $HCS_WORLD_SIZE up"; '
    'if [ "$HCS_RANK" = 0 ]; then while :; do :; done; fi; '
    "exec python3 -c 'import time\nheld = []\nwhile True:\n    held.append(b\"x\" * (16 << 20))\n    time.sleep(1)'"
)


def submit_gang(world) -> int:
    task = submit_task(
        world.member,
        project=world.project,
        queue="high",
        name="two-ranks",
        kind="training",
        gpu_spec="1(A100)",
        instances=2,
        cpu=Decimal(1),
        memory_gib=Decimal(2),
        command=COMMAND,
        secret_env={"WANDB_API_KEY": "never-shown"},
    )
    # The node agent's last report of the cards (what Device rows hold).
    for index, (util, used) in enumerate(((91, "37.5"), (64, "22.0"))):
        Device.objects.filter(node=world.node, index=index).update(
            utilization=util, vram_used_gib=Decimal(used), temperature_c=60 + index
        )
    return task.pk


def beat_until_running(task_id: int) -> Task:
    task = Task.objects.get(pk=task_id)
    deadline = time.monotonic() + 60
    while task.status != "running" and time.monotonic() < deadline:
        run_cycle(task.vdc_id)
        drive.reconcile_all()
        time.sleep(0.3)
        task.refresh_from_db()
    return task


def kill(task_id: int) -> None:
    task = Task.objects.select_related("cluster").get(pk=task_id)
    if task.external_id:
        executor_for(task.cluster).kill(task.external_id)


def figures(page) -> list[dict]:
    return page.evaluate(
        """() => [...document.querySelectorAll('tr[data-instance]')].map(row => ({
            state: row.querySelector('[data-field="instance-state"]').textContent.trim(),
            cpu: parseFloat(row.querySelector('[data-field="cpu"] [data-value]')?.dataset.value),
            memory: parseFloat(row.querySelector('[data-field="memory"] [data-value]')?.dataset.value),
        }))"""
    )


def test_the_monitoring_page_shows_both_ranks_with_live_figures(db_thread, browser, live_server_url, live_world):
    base = live_server_url
    task_id = db_thread.run(submit_gang, live_world)
    try:
        task = db_thread.run(beat_until_running, task_id)
        assert task.status == "running" and len(task.placement) == 2, (task.status, task.status_message)
        page = browser.new_page(viewport={"width": 1600, "height": 1000})
        log_in(page, base, "max")
        page.goto(f"{base}/task-monitoring/{task_id}/")
        page.wait_for_selector('tr[data-instance="1"]')
        # Both ranks run, each measured: rank 0 busy on its core, rank 1 holding its growing memory.
        page.wait_for_function(
            """() => [...document.querySelectorAll('tr[data-instance] [data-field="memory"] [data-value]')]
                     .length === 2""",
            timeout=15000,
        )
        first = figures(page)
        assert [row["state"] for row in first] == ["running", "running"], first
        assert first[0]["cpu"] > 0.05 and first[1]["memory"] > 0, first  # a shared 2-core host: any real share
        table = page.locator("table.instances")
        text = table.inner_text()
        assert f"{task.external_id}/rank-0" in text and f"{task.external_id}/rank-1" in text, text
        assert "/ 1 cores" in text and "/ 2 GiB" in text  # used against requested, per instance
        assert "91% · 37.5 / 80 GiB" in text and "64% · 22 / 80 GiB" in text  # each rank's own card
        assert "WANDB_API_KEY" in text and "never-shown" not in page.content()
        # The figures are redrawn from the backend every few seconds without reloading the page.
        page.evaluate("() => { window.__notReloaded = true; }")
        page.wait_for_function(
            """(before) => {
                const cell = document.querySelector('tr[data-instance="1"] [data-field="memory"] [data-value]');
                return cell && parseFloat(cell.dataset.value) > before + 0.01;
            }""",
            arg=first[1]["memory"],
            timeout=20000,
        )
        assert page.evaluate("() => window.__notReloaded") is True
        page.wait_for_timeout(3500)  # one more refresh, so the screenshot shows settled figures
        page.locator("#instances").scroll_into_view_if_needed()
        shot(page, "monitoring-two-instances")
        if os.environ.get("HCS_SCREENSHOT_DIR"):
            target = Path(os.environ["HCS_SCREENSHOT_DIR"])
            target.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(SCREENSHOTS / "monitoring-two-instances.png", target / "monitoring-two-instances.png")
    finally:
        db_thread.run(kill, task_id)
