"""The pages, the admin's dashboard and /metrics ask the same policy as the API: staff see and do what their model
permissions give them, no more (apps.vdc.policy)."""

import pytest
from django.urls import reverse

from apps.tasks import access
from apps.vdc.policy import OPEN_ANY_CONSOLE, OPERATIONS
from tests.factories import ClusterFactory, TaskFactory, staff_user

pytestmark = pytest.mark.django_db


@pytest.fixture
def running(world):
    return TaskFactory(
        project=world.project,
        vdc=world.vdc,
        queue=world.high,
        owner=world.member,
        status="running",
        kind="dev_env",
        cluster=world.cluster,
        external_id="hcs-task-1-1",
    )


def test_view_only_staff_sees_the_task_without_actions_and_cannot_post_them(client, world, running):
    client.force_login(staff_user("ops-viewer", "vdc.view_project", "tasks.view_task"))
    page = client.get(reverse("portal:task-monitoring", args=[running.pk])).content.decode()
    assert running.name in page
    for action in ("portal:task-stop", "portal:task-delete", "portal:task-terminal", "portal:task-autoscaling"):
        assert reverse(action, args=[running.pk]) not in page
    assert "/connect/" not in page
    assert client.post(reverse("portal:task-stop", args=[running.pk])).status_code == 403
    running.refresh_from_db()
    assert running.status == "running"
    assert client.post(reverse("portal:queue-open", args=[world.high.pk]), {"open": "0"}).status_code == 403
    world.high.refresh_from_db()
    assert world.high.is_open


def test_staff_allowed_any_console_gets_a_terminal_button_and_no_connect(client, world, running):
    client.force_login(staff_user("ops-console", "tasks.view_task", OPEN_ANY_CONSOLE))
    page = client.get(reverse("portal:task-monitoring", args=[running.pk])).content.decode()
    assert reverse("portal:task-terminal", args=[running.pk]) in page
    assert "data-connect" not in page
    terminal = client.get(reverse("portal:task-terminal", args=[running.pk])).content.decode()
    assert "visitor" in terminal and "data-socket" in terminal


def test_a_member_gets_a_terminal_and_connect_only_once_the_ide_answers(client, world, running):
    # No job answers for this task: the member is told the IDE is not up, with no Connect button yet.
    client.force_login(world.member)
    page = client.get(reverse("portal:task-monitoring", args=[running.pk])).content.decode()
    assert reverse("portal:task-terminal", args=[running.pk]) in page
    assert "data-connect" not in page and "data-ide-down" in page and "not up yet" in page


def test_staff_allowed_to_stop_sees_stop_but_not_delete(client, world, running):
    client.force_login(staff_user("ops-stopper", "tasks.view_task", "tasks.change_task"))
    page = client.get(reverse("portal:task-monitoring", args=[running.pk])).content.decode()
    assert reverse("portal:task-stop", args=[running.pk]) in page
    assert reverse("portal:task-delete", args=[running.pk]) not in page


def test_metrics_and_the_operator_dashboard_need_the_platform_view_permissions(client, world):
    client.force_login(staff_user("ops-bare"))
    assert client.get("/metrics").status_code == 403
    index = client.get(reverse("admin:index"))
    assert index.status_code == 200 and b"dashboard-alerts" not in index.content
    client.force_login(staff_user("ops-watcher", *OPERATIONS))
    assert client.get("/metrics").status_code == 200
    assert b"dashboard-alerts" in client.get(reverse("admin:index")).content


@pytest.mark.parametrize("cluster_type", ["slurm", "kubernetes"])
def test_a_visitors_console_is_refused_where_the_shell_would_hold_the_jobs_secrets(world, cluster_type):
    cluster = ClusterFactory(vdc=world.vdc, cluster_type=cluster_type, endpoint="https://backend.example:6443")
    cluster.set_credentials({"token": "t", "user": "hcs"})
    cluster.save()
    task = TaskFactory(
        project=world.project,
        vdc=world.vdc,
        queue=world.high,
        owner=world.member,
        status="running",
        cluster=cluster,
        external_id="team-a/pod/hcs-7-1",
    )
    with pytest.raises(access.Refused) as refused:
        access.terminal_target(staff_user("ops-console", "tasks.view_task", OPEN_ANY_CONSOLE), task.pk, 0)
    assert refused.value.code == 4403 and "hide the job's secrets" in str(refused.value)
    assert not access.terminal_target(world.member, task.pk, 0).visitor
