"""Sweep pages: the form previews (a dry run) and submits through the API's checks, the sweep's page counts its
tasks and links each one, Stop all stops them; viewers read, outsiders see nothing."""

from __future__ import annotations

import pytest
from django.urls import reverse

from apps.tasks.models import Sweep, Task
from apps.tasks.services import submit_task

pytestmark = pytest.mark.django_db

TASK_FILE = "name: lr\nkind: training\nproject: alpha\nqueue: high\ncommand: sleep 60\n"


def post(client, parameters: str, preview: bool = False, task_file: str = TASK_FILE):
    data = {"task_file": task_file, "parameters": parameters, **({"preview": "1"} if preview else {})}
    return client.post(reverse("portal:sweep-new"), data)


def test_preview_creates_nothing_and_submit_creates_the_sweep(client, world):
    client.force_login(world.member)
    page = post(client, "lr: [0.1, 0.01]\nbatch_size: [32, 64]", preview=True)
    assert page.status_code == 200
    text = page.content.decode()
    assert "Preview: 4 tasks (nothing submitted yet)" in text and "lr=0.01" in text and "batch_size=64" in text
    assert not Sweep.objects.exists() and not Task.objects.exists()
    response = post(client, "lr: [0.1, 0.01]\nbatch_size: [32, 64]")
    sweep = Sweep.objects.get()
    assert response.status_code == 302 and response.url == reverse("portal:sweep", args=[sweep.pk])
    page = client.get(response.url).content.decode()
    assert "{&quot;lr&quot;: [0.1, 0.01], &quot;batch_size&quot;: [32, 64]}" in page
    assert 'data-count="total">4<' in page and 'data-count="waiting">4<' in page and "Stop all" in page
    for task in sweep.tasks.all():
        assert reverse("portal:task-monitoring", args=[task.pk]) in page
    monitoring = client.get(reverse("portal:task-monitoring", args=[sweep.tasks.first().pk])).content.decode()
    assert f'href="{reverse("portal:sweep", args=[sweep.pk])}"' in monitoring
    listing = client.get(reverse("portal:sweeps")).content.decode()
    assert f'data-sweep="{sweep.pk}"' in listing and "4 queued" in listing


def test_refusals_are_listed_and_nothing_is_written(client, world):
    client.force_login(world.member)
    world.quota.max_training_tasks = 1
    world.quota.save()
    page = post(client, "lr: [1, 2]").content.decode()
    assert "The sweep was not submitted" in page and "Sweep element 2 of 2 (lr=2) refused" in page
    page = post(client, "lr: [1, 2", task_file="gpus: 2\n").content.decode()
    assert "Task file: gpus: Unknown key" in page and "Parameters: expected YAML or JSON" in page
    page = post(client, "lr: []").content.decode()
    assert "lr: expected a non-empty list of values" in page
    assert not Sweep.objects.exists() and not Task.objects.exists()


def test_the_sweep_form_is_filled_from_a_task(client, world):
    task = submit_task(
        world.member, project=world.project, queue="high", name="base", kind="training", epochs=3, command="true"
    )
    client.force_login(world.member)
    page = client.get(reverse("portal:sweep-new") + f"?from={task.pk}").content.decode()
    assert "name: base" in page and "epochs: 3" in page
    assert (
        f"{reverse('portal:sweep-new')}?from={task.pk}"
        in client.get(reverse("portal:task-monitoring", args=[task.pk])).content.decode()
    )


def test_stop_all_and_roles(client, world):
    client.force_login(world.member)
    post(client, "lr: [1, 2, 3]")
    sweep = Sweep.objects.get()
    Task.objects.filter(name="lr-1").update(status="completed")
    client.force_login(world.viewer)
    page = client.get(reverse("portal:sweep", args=[sweep.pk])).content.decode()
    assert "Stop all" not in page and 'data-count="finished">1<' in page
    client.post(reverse("portal:sweep-stop", args=[sweep.pk]))
    assert sweep.tasks.filter(status="queued").count() == 2
    client.force_login(world.outsider)
    assert client.get(reverse("portal:sweep", args=[sweep.pk])).status_code == 404
    assert client.post(reverse("portal:sweep-stop", args=[sweep.pk])).status_code == 404
    assert f'data-sweep="{sweep.pk}"' not in client.get(reverse("portal:sweeps")).content.decode()
    client.force_login(world.owner)
    response = client.post(reverse("portal:sweep-stop", args=[sweep.pk]), follow=True)
    assert "Sweep lr: 2 task(s) stopped." in response.content.decode()
    assert sorted(sweep.tasks.values_list("status", flat=True)) == ["completed", "stopped", "stopped"]


def test_the_page_shows_each_metric_and_the_best(client, world):
    client.force_login(world.member)
    post(client, "lr: [1, 2]")
    sweep = Sweep.objects.get()
    page = client.get(reverse("portal:sweep", args=[sweep.pk])).content.decode()
    assert "no metric reported yet" in page
    Task.objects.filter(name="lr-1").update(metric_name="acc", metric_value=0.5)
    Task.objects.filter(name="lr-2").update(metric_name="acc", metric_value=0.75)
    page = client.get(reverse("portal:sweep", args=[sweep.pk])).content.decode()
    best = Task.objects.get(name="lr-2")
    assert f'data-element="{best.pk}" class="best" data-best' in page and "acc=0.75" in page and "acc=0.5" in page
    assert "Highest metric is best:" in page
