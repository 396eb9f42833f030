"""Template pages: owners save a task as a template from its page, edit and delete it; "Use" fills the kind's
submit form from it and submitting that form creates the task; members use, viewers read, outsiders see nothing."""

from __future__ import annotations

import pytest
from django.urls import reverse

from apps.tasks import task_templates
from apps.tasks.models import Task, TaskTemplate
from apps.tasks.services import submit_task

pytestmark = pytest.mark.django_db


@pytest.fixture
def task(world):
    return submit_task(
        world.member,
        project=world.project,
        queue=world.high,
        name="resnet",
        kind="training",
        command="python train.py --epochs 3",
        env={"EPOCHS": "3"},
        secret_env={"WANDB_API_KEY": "wandb-s3cret"},
        epochs=3,
    )


@pytest.fixture
def template(world, task):
    return task_templates.template_from_task(world.owner, task, "resnet", "ResNet-50")


def save_url(task):
    return reverse("portal:task-save-template", args=[task.pk])


def test_an_owner_saves_a_task_as_a_template_from_its_page(client, world, task):
    client.force_login(world.owner)
    page = client.get(reverse("portal:task-monitoring", args=[task.pk])).content.decode()
    assert 'data-action="save-template"' in page
    response = client.post(save_url(task), {"name": "resnet-base", "description": "a good run"})
    template = TaskTemplate.objects.get()
    assert response.status_code == 302 and response.url == reverse("portal:template", args=[template.pk])
    assert template.name == "resnet-base" and template.project == world.project and template.created_by == world.owner
    assert "wandb-s3cret" not in str(template.task_file) and "secret_env" not in template.task_file
    page = client.get(response.url).content.decode()
    assert "command: python train.py --epochs 3" in page and 'data-action="delete-template"' in page
    # The same name again is refused and sends back to the task's page, saying why.
    response = client.post(save_url(task), {"name": "resnet-base"}, follow=True)
    assert "already has a template resnet-base" in response.content.decode()
    assert TaskTemplate.objects.count() == 1


@pytest.mark.parametrize("role", ["member", "viewer"])
def test_members_and_viewers_are_not_offered_save_and_cannot_save(client, world, task, role):
    client.force_login(world.user(role))
    page = client.get(reverse("portal:task-monitoring", args=[task.pk])).content.decode()
    assert 'data-action="save-template"' not in page
    response = client.post(save_url(task), {"name": "mine"}, follow=True)
    assert "Only owners of project alpha" in response.content.decode()
    assert not TaskTemplate.objects.exists()


def test_use_fills_the_kinds_form_and_submitting_it_creates_the_task(client, world, template):
    client.force_login(world.member)
    listing = client.get(reverse("portal:templates")).content.decode()
    use = f"{reverse('portal:training-jobs-new')}?template={template.pk}"
    assert f'data-template="{template.pk}"' in listing and use in listing
    assert 'data-action="edit"' not in listing
    form_page = client.get(use)
    assert form_page.status_code == 200
    form = form_page.context["form"]
    assert form.initial["name"] == "resnet" and form.initial["command"] == "python train.py --epochs 3"
    assert form.initial["project"] == world.project.pk and form.initial["queue"] == world.high.pk
    assert 'data-field="template-source"' in form_page.content.decode()
    before = Task.objects.count()
    # What a browser sends back: every field as the page shows it, the name changed.
    data = {name: form[name].value() for name in form.fields if form[name].value() not in (None, False)}
    data.update(name="resnet-again", framework="pytorch", max_retries=0)
    response = client.post(reverse("portal:training-jobs-new"), data)
    assert response.status_code == 302, response.context["form"].errors if response.context else response
    assert Task.objects.count() == before + 1
    assert Task.objects.get(name="resnet-again").command == "python train.py --epochs 3"


def test_an_owner_edits_a_template_and_a_bad_file_is_refused_on_the_page(client, world, template):
    client.force_login(world.owner)
    url = reverse("portal:template", args=[template.pk])
    response = client.post(url, {"name": "resnet", "description": "v2", "task_file": "kind: training\ngpus: 2\n"})
    assert response.status_code == 400
    assert "gpus: Unknown key" in response.content.decode()
    response = client.post(url, {"name": "resnet", "description": "v2", "task_file": "kind: training\nepochs: 9\n"})
    assert response.status_code == 302
    template.refresh_from_db()
    assert template.description == "v2" and template.task_file == {"kind": "training", "epochs": 9}


def test_an_owner_deletes_a_template(client, world, template):
    client.force_login(world.owner)
    page = client.get(reverse("portal:template", args=[template.pk])).content.decode()
    assert "data-confirm=" in page and "Delete template" in page
    response = client.post(reverse("portal:template-delete", args=[template.pk]))
    assert response.status_code == 302 and not TaskTemplate.objects.exists()


def test_a_viewer_reads_but_neither_edits_nor_uses(client, world, template):
    client.force_login(world.viewer)
    page = client.get(reverse("portal:template", args=[template.pk])).content.decode()
    assert 'data-field="task-file"' in page and 'data-form="template"' not in page
    assert 'data-action="use"' not in page and 'data-action="delete-template"' not in page
    response = client.post(reverse("portal:template", args=[template.pk]), {"name": "x", "task_file": "kind: training"})
    assert response.status_code == 400 and "Only owners of project alpha" in response.content.decode()
    response = client.post(reverse("portal:template-delete", args=[template.pk]))
    assert TaskTemplate.objects.filter(pk=template.pk, name="resnet").exists()


def test_outsiders_see_no_template(client, world, template):
    client.force_login(world.outsider)
    assert client.get(reverse("portal:template", args=[template.pk])).status_code == 404
    assert client.get(f"{reverse('portal:training-jobs-new')}?template={template.pk}").status_code == 404
    assert client.post(reverse("portal:template-delete", args=[template.pk])).status_code == 404
    assert f'data-template="{template.pk}"' not in client.get(reverse("portal:templates")).content.decode()
