"""In Chromium: a training job's parameters reach its process, and its monitoring page links TensorBoard while
it runs. The scheduler and the status sync are driven by the test; the page updates live."""

from __future__ import annotations

import re

import pytest

from apps.control.scheduling import run_cycle
from apps.tasks.models import Task
from apps.tasks.services import stop_task
from tests.portal.test_browser import free_the_gpus_and_run, log_in, occupy_all_gpus, shot, watch_policy

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def test_parameters_reach_the_job_and_the_page_links_tensorboard_while_it_runs(
    db_thread, browser, live_server_url, live_world
):
    world, base = live_world, live_server_url
    blocker = db_thread.run(occupy_all_gpus, world)  # the job waits first: no link before it runs
    page = browser.new_page(viewport={"width": 1366, "height": 900})
    violations: list[str] = []
    watch_policy(page, violations)
    log_in(page, base, "max")
    page.goto(f"{base}/training-jobs/new/")
    page.fill("#id_name", "resnet")
    page.select_option("#id_project", str(world.project.pk))
    page.select_option("#id_framework", "pytorch")
    page.fill("#id_model_path", "/models/resnet50")
    page.select_option("#id_queue", str(world.high.pk))
    page.fill("#id_gpu_spec", "1(A100)")
    page.fill("#id_epochs", "7")
    page.fill("#id_batch_size", "128")
    page.fill("#id_tensorboard_dir", "/hcs/checkpoint/tb")
    page.fill("#id_command", 'env | grep "^HCS_" | sort; sleep 120')
    assert (
        "$HCS_CHECKPOINT_DIR"
        in page.locator("#id_checkpoint_path ~ .help, .field:has(#id_checkpoint_path) .help").first.inner_text()
    )
    shot(page, "params-01-training-form")
    page.click("text=Create and submit")
    page.wait_for_url(re.compile(r"/task-monitoring/\d+/$"))
    task_id = int(re.search(r"/task-monitoring/(\d+)/", page.url).group(1))
    page.locator('[data-live-status="open"]').wait_for()
    assert "a requeue onto another cluster starts fresh" in page.locator('[data-field="checkpoints"]').inner_text()

    db_thread.run(run_cycle, world.vdc.pk)
    page.wait_for_function(
        "() => document.querySelector('.status-card [data-field=\"summary\"]').textContent.includes('position 1')"
    )
    assert page.locator('[data-field="tensorboard"]').count() == 0
    assert db_thread.run(free_the_gpus_and_run, world, blocker, task_id) == "running"
    link = page.locator('[data-field="tensorboard"]')
    link.wait_for()  # arrives with the live update, without a reload
    assert link.get_attribute("href") == f"/tasks/{task_id}/connect/6006/"
    page.wait_for_function("() => document.querySelector('[data-log-url]').textContent.includes('HCS_EPOCHS=')")
    log = page.locator("[data-log-url]").inner_text()
    for line in (
        "HCS_EPOCHS=7",
        "HCS_BATCH_SIZE=128",
        "HCS_FRAMEWORK=pytorch",
        "HCS_MODEL_PATH=/models/resnet50",
        "HCS_TENSORBOARD_DIR=/hcs/checkpoint/tb",
        "HCS_TENSORBOARD_PORT=6006",
        "HCS_CHECKPOINT_DIR=/hcs/checkpoint",
    ):
        assert line in log, log
    shot(page, "params-02-monitoring-tensorboard-link")

    db_thread.run(lambda: stop_task(Task.objects.get(pk=task_id), world.member))
    page.reload()
    assert page.locator('[data-field="tensorboard"]').count() == 0  # the link goes with the run
    assert not violations, f"the Content Security Policy blocked: {violations}"
