"""Task files in Chromium: a task's page shows its task file (no secret value) and downloads it, "Submit again"
opens the submit form filled from it, and the form takes the downloaded file as an upload (and names an unknown
key when refusing one), at a desktop width and a phone's."""

from __future__ import annotations

import re
from datetime import timedelta
from pathlib import Path

import pytest
import yaml

from apps.tasks.models import Task
from apps.tasks.services import stop_task, submit_task
from apps.tasks.taskfile import dump_yaml
from tests.control import drive
from tests.portal.test_browser import log_in, shot

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

SECRET = "browser-secret-9f3a"


def submit_original(world) -> Task:
    """A task holding every card of the cluster (so the others wait), with a secret variable."""
    return submit_task(
        world.member,
        project=world.project,
        queue="high",
        name="nightly",
        kind="training",
        gpu_spec="8(A100)",
        cpu=2,
        memory_gib=4,
        expected_duration=timedelta(minutes=30),
        command="sleep 600",
        env={"EPOCHS": "3"},
        secret_env={"WANDB_API_KEY": SECRET},
        framework="pytorch",
        epochs=3,
    )


def end_all(world) -> None:
    for task in Task.objects.exclude(status__in=("stopped", "completed", "failed")):
        stop_task(task, world.member, reason="test over")
    drive.wait_objects_ended(world.cluster)


def asked(task: Task) -> tuple:
    return (task.kind, task.gpu_spec, task.cpu, task.memory_gib, task.command, task.env, task.epochs, task.queue_id)


@pytest.mark.parametrize("width", [390, 1366])
def test_submit_again_and_a_task_file_downloaded_then_uploaded(
    db_thread, browser, live_server_url, live_world, tmp_path, width
):
    world, base = live_world, live_server_url
    original = db_thread.run(submit_original, world)
    page = browser.new_page(viewport={"width": width, "height": 900}, accept_downloads=True)
    violations: list[str] = []
    page.on("console", lambda m: "Content Security Policy" in m.text and violations.append(m.text))
    log_in(page, base, "max")
    try:
        check_the_pages(page, db_thread, world, base, original, tmp_path, width)
    finally:
        db_thread.run(end_all, world)
    assert not violations, f"the Content Security Policy blocked: {violations}"


def check_the_pages(page, db_thread, world, base: str, original: Task, tmp_path: Path, width: int) -> None:
    expected_file = db_thread.run(dump_yaml, original)
    page.goto(f"{base}/task-monitoring/{original.pk}/")
    shown = page.locator('[data-field="task-file"]')
    assert shown.inner_text().strip() == expected_file.strip()
    assert "name: nightly" in shown.inner_text() and SECRET not in page.content()
    assert "Secret variables left out (values are never shown): WANDB_API_KEY" in shown.inner_text()
    shot(page, f"task-file-01-task-page-{width}")
    with page.expect_download() as download:
        page.click('[data-action="download-task-file"]')
    assert download.value.suggested_filename == f"task-{original.pk}.yaml"
    downloaded = Path(download.value.path()).read_text()
    assert downloaded == expected_file

    # Submit again: the form of the task's kind, filled from its task file; change the name and submit.
    page.click('[data-action="submit-again"]')
    page.wait_for_url(re.compile(rf"/training-jobs/new/\?from={original.pk}$"))
    assert page.input_value("#id_name") == "nightly" and page.input_value("#id_gpu_spec") == "8(A100)"
    assert page.input_value("#id_env") == "EPOCHS=3" and page.input_value("#id_command") == "sleep 600"
    assert page.input_value("#id_queue") == str(world.high.pk) and page.input_value("#id_secret_env") == ""
    assert f"Filled from task #{original.pk} nightly" in page.locator('[data-field="submit-again-source"]').inner_text()
    shot(page, f"task-file-02-submit-again-form-{width}")
    page.fill("#id_name", "nightly-again")
    page.click("text=Create and submit")
    page.wait_for_url(re.compile(r"/task-monitoring/\d+/$"))
    again = db_thread.run(lambda: Task.objects.get(name="nightly-again"))
    assert asked(again) == asked(original) and again.secret_env_names == []

    # Upload: the downloaded file, renamed; then a file with an unknown key, refused by name.
    upload = tmp_path / "task.yaml"
    upload.write_text(yaml.safe_dump({**yaml.safe_load(downloaded), "name": "nightly-uploaded"}))
    page.goto(f"{base}/training-jobs/new/")
    page.set_input_files("#id_task_file", str(upload))
    shot(page, f"task-file-03-upload-{width}")
    page.click("text=Submit file")
    page.wait_for_url(re.compile(r"/task-monitoring/\d+/$"))
    assert asked(db_thread.run(lambda: Task.objects.get(name="nightly-uploaded"))) == asked(original)

    upload.write_text(downloaded.replace("name: nightly", "name: refused\ngpus: 2"))
    page.goto(f"{base}/training-jobs/new/")
    page.set_input_files("#id_task_file", str(upload))
    page.click("text=Submit file")
    summary = page.locator("[data-error-summary]")
    summary.wait_for()
    assert "The task file was not submitted" in summary.inner_text()
    assert "Task file task.yaml: gpus: Unknown key" in summary.inner_text()
    assert page.input_value("#id_name") == "refused"  # the form is filled from the file, to fix it there
    box = summary.bounding_box()
    assert box["width"] <= width
    shot(page, f"task-file-04-upload-refused-{width}")
    assert not db_thread.run(lambda: Task.objects.filter(name="refused").exists())
