"""Bulk actions call the services, report what they did, and land in the admin history."""

from __future__ import annotations

from django.contrib.admin.models import LogEntry
from django.contrib.messages import get_messages

from apps.clusters.models import Cluster
from apps.queues.models import TaskQueue
from apps.tasks.models import Sweep, Task, TaskEvent
from tests.admin.conftest import admin_url
from tests.factories import ClusterFactory, TaskFactory


def _act(client, model, action: str, objects, **extra):
    response = client.post(
        admin_url(model, "changelist"), {"action": action, "_selected_action": [obj.pk for obj in objects], **extra}
    )
    assert response.status_code == 302
    return [str(message) for message in get_messages(response.wsgi_request)]


def test_disable_and_enable_clusters(admin_web, world):
    other = ClusterFactory(vdc=world.vdc)
    assert _act(admin_web, Cluster, "disable", [world.cluster, other]) == ["2 cluster(s) disabled."]
    assert not Cluster.objects.filter(enabled=True).exists()
    assert LogEntry.objects.filter(change_message="disabled").count() == 2
    _act(admin_web, Cluster, "enable", [other])
    assert list(Cluster.objects.filter(enabled=True)) == [other]


def test_maintenance_on_and_off(admin_web, world):
    assert _act(admin_web, Cluster, "maintenance_on", [world.cluster]) == ["1 cluster(s) put into maintenance."]
    world.cluster.refresh_from_db()
    assert (world.cluster.status, world.cluster.status_message) == ("maintenance", "Maintenance set by an admin")
    _act(admin_web, Cluster, "maintenance_off", [world.cluster])
    world.cluster.refresh_from_db()
    assert world.cluster.status == "healthy"


def test_close_and_open_queues(admin_web, world):
    assert _act(admin_web, TaskQueue, "close_queues", [world.low, world.medium]) == ["2 queue(s) closed."]
    assert set(TaskQueue.objects.filter(is_open=False)) == {world.low, world.medium}
    _act(admin_web, TaskQueue, "open_queues", [world.low])
    assert list(TaskQueue.objects.filter(is_open=False)) == [world.medium]


def test_cancel_stops_tasks_with_an_event_and_reports_each_failure(admin_web, world):
    fields = {"project": world.project, "owner": world.member, "vdc": world.vdc, "queue": world.high}
    queued, running = TaskFactory(status="queued", **fields), TaskFactory(status="running", **fields)
    done = TaskFactory(status="completed", **fields)

    messages = _act(admin_web, Task, "cancel", [queued, running, done], confirm="yes")

    assert messages == [f"{done}: Task is already completed; nothing to stop.", "2 task(s) stopped."]
    for task in (queued, running):
        task.refresh_from_db()
        assert task.status == "stopped" and task.finished_at is not None
        event = TaskEvent.objects.get(task=task)
        assert (event.kind, event.to_status, event.actor) == ("stopped", "stopped", world.admin)
        assert "cancelled by an admin" in event.message
    done.refresh_from_db()
    assert done.status == "completed" and not done.events.exists()
    assert LogEntry.objects.filter(change_message="cancelled by an admin").count() == 2


def test_cancel_asks_first_naming_what_runs_and_what_waits(admin_web, world):
    fields = {"project": world.project, "owner": world.member, "vdc": world.vdc, "queue": world.high}
    queued, running = TaskFactory(status="queued", **fields), TaskFactory(status="running", **fields)
    response = admin_web.post(
        admin_url(Task, "changelist"), {"action": "cancel", "_selected_action": [queued.pk, running.pk]}
    )
    assert response.status_code == 200
    page = response.content.decode()
    assert "Stop 2 selected tasks: 1 running or starting, 1 waiting." in page
    assert 'name="confirm" value="Yes, stop 2 tasks"' in page
    assert f'name="_selected_action" value="{queued.pk}"' in page
    assert set(Task.objects.values_list("status", flat=True)) == {"queued", "running"}
    assert _act(admin_web, Task, "cancel", [queued, running], confirm="Yes") == ["2 task(s) stopped."]


def test_task_list_has_no_bulk_delete(admin_web, world):
    response = admin_web.get(admin_url(Task, "changelist"))
    actions = [name for name, _label in response.context["action_form"].fields["action"].choices]
    assert "cancel" in actions and "delete_selected" not in actions


def test_only_ended_tasks_can_be_deleted_and_through_the_service(admin_web, world):
    fields = {"project": world.project, "owner": world.member, "vdc": world.vdc, "queue": world.high}
    running, stopped = TaskFactory(status="running", **fields), TaskFactory(status="stopped", **fields)
    assert admin_web.get(admin_url(running, "delete")).status_code == 403
    assert admin_web.post(admin_url(stopped, "delete"), {"post": "yes"}).status_code == 302
    assert list(Task.objects.all()) == [running]


def test_cancelling_a_thousand_tasks_takes_as_many_statements_as_ten(admin_web, world):
    # A bulk cancel of 400 ran task by task and hit the browser's 30 s timeout, leaving 270 stopped.
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    fields = {"project": world.project, "owner": world.member, "vdc": world.vdc, "queue": world.low}

    def cancel(n: int) -> int:
        # As an admin does it: filter the list, "select all n", run the action.
        tasks = TaskFactory.create_batch(n, status="queued", **fields)
        with CaptureQueriesContext(connection) as queries:
            response = admin_web.post(
                admin_url(Task, "changelist") + "?status__exact=queued",
                {
                    "action": "cancel",
                    "select_across": "1",
                    "index": "0",
                    "_selected_action": [tasks[0].pk],
                    "confirm": "yes",
                },
            )
        assert response.status_code == 302
        messages = [str(message) for message in get_messages(response.wsgi_request)]
        assert messages[-1] == f"{n} task(s) stopped."
        assert Task.objects.filter(pk__in=[t.pk for t in tasks], status="stopped").count() == n
        return len(queries.captured_queries)

    ten = cancel(10)
    assert cancel(1000) <= ten + 2
    assert TaskEvent.objects.filter(kind="stopped").count() == 1010
    assert LogEntry.objects.filter(change_message="cancelled by an admin").count() == 1010


def test_a_new_cluster_is_unknown_until_checked_and_test_connection_checks_it(admin_web, world, tmp_path, settings):
    # A new cluster showed "Healthy" before it was ever checked.
    settings.HCS_LOCAL_EXECUTOR_DIR = tmp_path / "jobs"
    fresh = Cluster.objects.create(vdc=world.vdc, name="fresh", cluster_type="local")
    assert fresh.status == "unknown" and not fresh.is_schedulable
    messages = _act(admin_web, Cluster, "check_now", [fresh])
    fresh.refresh_from_db()
    assert fresh.status == "healthy" and fresh.last_heartbeat is not None
    assert messages == [f"fresh: Healthy: {fresh.status_message}"]
    broken = Cluster.objects.create(
        vdc=world.vdc, name="broken", cluster_type="slurm", endpoint="http://127.0.0.1:9", api_version="v0.0.38"
    )
    messages = _act(admin_web, Cluster, "check_now", [broken])
    broken.refresh_from_db()
    assert broken.status == "degraded" and messages[-1].startswith("broken: Degraded: "), messages


def test_discover_nodes_reads_the_local_host(admin_web, world, tmp_path, settings):
    import os

    settings.HCS_LOCAL_EXECUTOR_DIR = tmp_path / "jobs"
    messages = _act(admin_web, Cluster, "discover", [world.cluster])
    host = world.cluster.nodes.get(name=os.uname().nodename)
    assert host.cpu == os.cpu_count() and host.memory_gib > 1
    # The host's cards come from the node agent: discovery leaves the world's node and its cards alone.
    assert world.node.devices.count() == 8
    assert messages == [f"{world.cluster.name}: 1 node(s) (1 new), 0 card(s); not reported any more: gpu-node-1"]


def test_stop_all_stops_the_unfinished_tasks_of_sweeps_and_the_sweep_page_lists_them(admin_web, world):
    sweep = Sweep.objects.create(project=world.project, name="grid", created_by=world.member, parameters={"lr": [1]})
    fields = {"project": world.project, "owner": world.member, "vdc": world.vdc, "queue": world.high, "sweep": sweep}
    queued = TaskFactory(status="queued", name="grid-1", sweep_values={"lr": "1"}, **fields)
    done = TaskFactory(status="completed", name="grid-2", **fields)
    page = admin_web.get(admin_url(sweep))
    assert page.status_code == 200 and b"grid-1" in page.content and b"grid-2" in page.content
    listing = admin_web.get(admin_url(Sweep, "changelist")).content.decode()
    assert "1 queued, 1 completed" in listing
    asked = admin_web.post(
        admin_url(Sweep, "changelist"), {"action": "stop_all", "_selected_action": [sweep.pk]}
    ).content.decode()
    assert "Stop 1 selected task: 0 running or starting, 1 waiting" in asked and "grid-1" in asked
    assert 'name="action" value="stop_all"' in asked
    queued.refresh_from_db()
    assert queued.status == "queued"
    assert _act(admin_web, Sweep, "stop_all", [sweep], confirm="yes") == ["Stopped 1 task(s)."]
    queued.refresh_from_db()
    done.refresh_from_db()
    assert (queued.status, done.status) == ("stopped", "completed")


def test_task_templates_are_listed_filtered_by_project_and_deleted_through_the_service(admin_web, world):
    from apps.tasks.models import TaskTemplate

    kept = TaskTemplate.objects.create(project=world.other_project, name="bert", task_file={"kind": "training"})
    gone = TaskTemplate.objects.create(project=world.project, name="resnet", task_file={"kind": "training"})
    listing = admin_web.get(admin_url(TaskTemplate, "changelist"), {"project__id__exact": world.project.pk})
    assert [row.pk for row in listing.context["cl"].result_list] == [gone.pk]
    found = admin_web.get(admin_url(TaskTemplate, "changelist"), {"q": "bert"}).context["cl"].result_list
    assert [row.pk for row in found] == [kept.pk]
    assert admin_web.get(admin_url(gone)).status_code == 200
    _act(admin_web, TaskTemplate, "delete_selected", [gone], post="yes")
    assert list(TaskTemplate.objects.all()) == [kept]
