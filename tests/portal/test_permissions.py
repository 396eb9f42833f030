"""Roles decide what the pages show and allow: viewers read, outsiders see nothing, admins manage queues."""

import pytest
from django.urls import reverse

from apps.tasks.models import Task
from apps.tasks.services import stop_task, submit_task

pytestmark = pytest.mark.django_db


@pytest.fixture
def task(world):
    return submit_task(
        world.member,
        project=world.project,
        queue="high",
        name="job",
        kind="training",
        gpu_spec="1(A100)",
        command="sleep 1",
    )


def test_viewer_sees_the_task_without_stop_or_delete_buttons(client, world, task):
    client.force_login(world.viewer)
    for url in (reverse("portal:compute-tasks"), reverse("portal:task-monitoring", args=[task.pk])):
        page = client.get(url).content.decode()
        assert "job" in page
        assert reverse("portal:task-stop", args=[task.pk]) not in page
        assert reverse("portal:task-delete", args=[task.pk]) not in page


def test_viewer_cannot_stop_or_delete_by_posting(client, world, task):
    client.force_login(world.viewer)
    assert client.post(reverse("portal:task-stop", args=[task.pk])).status_code == 403
    task.refresh_from_db()
    assert task.status == "queued"
    stop_task(task, world.member)
    assert client.post(reverse("portal:task-delete", args=[task.pk])).status_code == 403
    assert Task.objects.filter(pk=task.pk).exists()


def test_member_sees_the_buttons_and_stops_then_deletes(client, world, task):
    client.force_login(world.member)
    page = client.get(reverse("portal:compute-tasks")).content.decode()
    assert reverse("portal:task-stop", args=[task.pk]) in page
    response = client.post(reverse("portal:task-stop", args=[task.pk]), {"next": "/compute-tasks/"})
    assert response.status_code == 302 and response.url == "/compute-tasks/"
    task.refresh_from_db()
    assert task.status == "stopped"
    response = client.post(reverse("portal:task-delete", args=[task.pk]))
    assert response.status_code == 302 and not Task.objects.filter(pk=task.pk).exists()


def test_stop_and_delete_need_post_and_csrf(world, task):
    from django.test import Client  # a client that enforces CSRF like a browser

    client = Client(enforce_csrf_checks=True)
    client.force_login(world.member)
    assert client.get(reverse("portal:task-stop", args=[task.pk])).status_code == 405
    assert client.post(reverse("portal:task-stop", args=[task.pk])).status_code == 403
    task.refresh_from_db()
    assert task.status == "queued"


@pytest.mark.parametrize("name", ["portal:task-monitoring", "portal:task-logs"])
def test_outsider_gets_404_on_another_projects_task_pages(client, world, task, name):
    client.force_login(world.outsider)
    assert client.get(reverse(name, args=[task.pk])).status_code == 404


@pytest.mark.parametrize("name", ["portal:task-stop", "portal:task-delete"])
def test_outsider_gets_404_on_another_projects_task_actions(client, world, task, name):
    client.force_login(world.outsider)
    assert client.post(reverse(name, args=[task.pk])).status_code == 404
    task.refresh_from_db()
    assert task.status == "queued"


def test_outsider_lists_do_not_show_other_projects_tasks(client, world, task):
    client.force_login(world.outsider)
    for name in ("portal:compute-tasks", "portal:training-jobs", "portal:dashboard"):
        assert f"#{task.pk}" not in client.get(reverse(name)).content.decode()


def test_outsider_cannot_submit_into_another_project(client, world):
    client.force_login(world.outsider)
    data = {
        "name": "x",
        "project": world.project.pk,
        "kind": "training",
        "framework": "pytorch",
        "vdc": world.vdc.pk,
        "queue": world.high.pk,
        "cpu": "1",
        "memory_gib": "1",
        "instances": "1",
        "max_retries": "0",
    }
    response = client.post(reverse("portal:training-jobs-new"), data)
    assert response.status_code == 200 and "project" in response.context["form"].errors
    assert not Task.objects.exists()


def test_viewer_cannot_pick_a_project_they_only_view(client, world):
    client.force_login(world.viewer)
    form = client.get(reverse("portal:training-jobs-new")).context["form"]
    assert list(form.fields["project"].queryset) == []


@pytest.mark.parametrize("role", ["owner", "member", "viewer", "outsider"])
def test_only_platform_admins_change_queues(client, world, role):
    client.force_login(world.user(role))
    assert 'name="policy"' not in client.get(reverse("portal:task-queues")).content.decode()
    assert client.post(reverse("portal:queue-policy", args=[world.high.pk]), {"policy": "drf"}).status_code == 403
    assert client.post(reverse("portal:queue-open", args=[world.high.pk]), {"open": "0"}).status_code == 403
    world.high.refresh_from_db()
    assert world.high.policy == "fifo" and world.high.is_open


def test_admin_gets_an_error_for_an_unknown_policy(client, world):
    client.force_login(world.admin)
    response = client.post(reverse("portal:queue-policy", args=[world.high.pk]), {"policy": "lottery"}, follow=True)
    assert "lottery" in response.content.decode()
    world.high.refresh_from_db()
    assert world.high.policy == "fifo"
