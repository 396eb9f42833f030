"""Templates in Chromium at a phone's width and a desktop's: an owner saves a task as a template from its page,
Use fills the training form from it and submits a task, the list shows it, Delete asks first; nothing overflows
at 390 px and the Content Security Policy blocks nothing.

Screenshots: test-artifacts/screenshots/template-*-{390,1366}.png.
"""

from __future__ import annotations

import pytest

from apps.tasks.models import Task, TaskTemplate
from apps.tasks.services import submit_task
from tests.portal.test_browser import log_in, shot
from tests.portal.test_browser_sweeps import end_all, overflow

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


@pytest.mark.parametrize("width", [390, 1366])
def test_save_use_and_delete_a_template(db_thread, browser, live_server_url, live_world, width):
    world, base = live_world, live_server_url
    task = db_thread.run(
        lambda: submit_task(
            world.member,
            project=world.project,
            queue=world.high,
            name="resnet",
            kind="training",
            gpu_spec="8(A100)",
            command="sleep 600",
            env={"EPOCHS": "3"},
            secret_env={"WANDB_API_KEY": "never-in-a-template"},
        )
    )
    page = browser.new_page(viewport={"width": width, "height": 900})
    violations: list[str] = []
    page.on("console", lambda m: "Content Security Policy" in m.text and violations.append(m.text))
    log_in(page, base, "olivia")
    try:
        page.goto(f"{base}/task-monitoring/{task.pk}/")
        page.fill("#id_template_name", "resnet-base")
        page.click("[data-action=save-template]")
        page.wait_for_url(f"{base}/templates/*/")
        assert "Saved as template resnet-base of project alpha." in page.locator(".messages").inner_text()
        template = db_thread.run(lambda: TaskTemplate.objects.get())
        assert "never-in-a-template" not in page.content()
        assert overflow(page) <= 0
        shot(page, f"template-01-page-{width}")

        page.click(".page-head [data-action=use]")
        page.wait_for_url(f"{base}/training-jobs/new/?template={template.pk}")
        assert page.locator("[data-field=template-source]").is_visible()
        assert page.input_value("#id_name") == "resnet" and page.input_value("#id_command") == "sleep 600"
        page.fill("#id_name", "resnet-again")
        shot(page, f"template-02-use-{width}")
        page.click("form button.primary:has-text('Create and submit')")
        page.wait_for_url(f"{base}/task-monitoring/*/")
        again = db_thread.run(lambda: Task.objects.get(name="resnet-again"))
        assert (again.command, again.env, again.gpu_spec) == ("sleep 600", {"EPOCHS": "3"}, "8(A100)")

        page.goto(f"{base}/templates/")
        assert page.locator(f'[data-template="{template.pk}"]').is_visible() and overflow(page) <= 0
        shot(page, f"template-03-list-{width}")

        page.goto(f"{base}/templates/{template.pk}/")
        questions: list[str] = []
        page.once("dialog", lambda dialog: (questions.append(dialog.message), dialog.dismiss()))
        page.click("[data-action=delete-template]")
        page.wait_for_timeout(300)
        assert db_thread.run(lambda: TaskTemplate.objects.count()) == 1
        page.once("dialog", lambda dialog: (questions.append(dialog.message), dialog.accept()))
        page.click("[data-action=delete-template]")
        page.wait_for_url(f"{base}/templates/")
        assert "Template resnet-base of project alpha deleted." in page.locator(".messages").inner_text()
        assert questions[0].startswith("Delete template “resnet-base” of project alpha?")
        assert db_thread.run(lambda: TaskTemplate.objects.count()) == 0
    finally:
        db_thread.run(end_all, world)
    assert not violations, f"the Content Security Policy blocked: {violations}"
