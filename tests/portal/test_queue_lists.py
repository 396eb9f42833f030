"""Who is ahead of me in a queue (names of my projects' tasks only), the dashboard's running
tasks first, sortable lists and bulk stop for users."""

from __future__ import annotations

import re
from datetime import timedelta

import pytest
from django.urls import reverse
from django.utils import timezone

from apps.control.scheduling import run_cycle
from apps.tasks.models import Task, TaskEvent
from apps.tasks.services import submit_task
from tests.api.base import API, client_for
from tests.factories import TaskFactory, TaskQueueFactory, VDCFactory

pytestmark = pytest.mark.django_db


def submit(world, user, project, name, gpu_spec="1(A100)", queue="high"):
    return submit_task(
        user, project=project, queue=queue, name=name, kind="training", gpu_spec=gpu_spec, command="sleep 60"
    )


@pytest.fixture
def line(world):
    """All eight cards busy, then beta's task, then alpha's (max's) and alpha's (olivia's), ranked by a cycle."""
    blocker = submit(world, world.owner, world.project, "blocker", gpu_spec="8(A100)")
    run_cycle(world.vdc.pk)
    blocker.refresh_from_db()
    assert blocker.status == "scheduled"
    theirs = submit(world, world.outsider, world.other_project, "secret-beta-run", gpu_spec="2(A100)")
    mine = submit(world, world.member, world.project, "my-alpha-run")
    colleague = submit(world, world.owner, world.project, "olivia-alpha-run")
    run_cycle(world.vdc.pk)
    for task in (theirs, mine, colleague):
        task.refresh_from_db()
    assert (theirs.queue_position, mine.queue_position, colleague.queue_position) == (1, 2, 3)
    return theirs, mine, colleague


def test_queue_page_names_my_projects_tasks_and_anonymises_the_others(client, world, line):
    theirs, mine, colleague = line
    client.force_login(world.member)
    html = client.get(reverse("portal:task-queues")).content.decode()
    assert "secret-beta-run" not in html and "oscar" not in html and "beta" not in html
    assert f'href="/task-monitoring/{theirs.pk}/"' not in html
    assert "another project&#x27;s task, 2(A100), 1 CPU, 1 GiB, waiting 0 min" in html
    lineup = html[html.index(f'data-lineup="{world.high.pk}"') :]
    table = lineup[lineup.index("<table") :]
    assert table.index("another project") < table.index("my-alpha-run") < table.index("olivia-alpha-run")
    assert f'<a href="/task-monitoring/{mine.pk}/">#{mine.pk} my-alpha-run</a>' in lineup
    assert "yours · alpha" in lineup and "olivia's · alpha" in lineup
    place = re.search(rf'data-my-place="{mine.pk}">(.*?)</li>', lineup).group(1)
    assert re.sub("<[^>]+>", "", place).startswith(f"Your #{mine.pk} my-alpha-run: position 2 of 3, estimated start ")


def test_an_outsider_sees_only_their_own_task_by_name(client, world, line):
    theirs, mine, colleague = line
    client.force_login(world.outsider)
    html = client.get(reverse("portal:task-queues")).content.decode()
    assert "secret-beta-run" in html
    for secret in ("my-alpha-run", "olivia-alpha-run", "blocker", "alpha", "max's", "olivia"):
        assert secret not in html, secret
    assert html.count("another project&#x27;s task") == 2


def test_lineup_api_follows_the_same_privacy(world, line):
    theirs, mine, colleague = line
    url = f"{API}queues/{world.high.pk}/lineup/"
    body = client_for(world.member).get(url).json()
    assert body["waiting"] == 3 and body["shown"] == 3
    first, second, third = body["entries"]
    assert first == {
        "position": 1,
        "status": "queued",
        "request": "2(A100), 1 CPU, 1 GiB",
        "waiting_seconds": first["waiting_seconds"],
        "waiting_for": "0 min",
        "visible": False,
        "mine": False,
        "task": None,
        "name": None,
        "project": None,
        "owner": None,
        "estimated_start": None,
        "reason": None,
        "reason_kind": "free capacity",
        "label": "another project's task, 2(A100), 1 CPU, 1 GiB, waiting 0 min",
    }
    assert (second["task"], second["name"], second["mine"], second["owner"]) == (mine.pk, "my-alpha-run", True, "max")
    assert (third["name"], third["mine"], third["project"]) == ("olivia-alpha-run", False, "alpha")
    assert second["estimated_start"] is not None or mine.estimated_start is None

    outsider = client_for(world.outsider).get(url).json()["entries"]
    assert [e["name"] for e in outsider] == ["secret-beta-run", None, None]
    assert "alpha" not in str(outsider) and "olivia" not in str(outsider)

    viewer = client_for(world.viewer).get(url).json()["entries"]
    assert [e["name"] for e in viewer] == [None, "my-alpha-run", "olivia-alpha-run"]
    assert not any(e["mine"] for e in viewer)


def test_lineup_api_hides_queues_of_vdcs_you_cannot_see(world):
    hidden = TaskQueueFactory(vdc=VDCFactory(name="elsewhere"), name="q")
    assert client_for(world.member).get(f"{API}queues/{hidden.pk}/lineup/").status_code == 404
    assert client_for(None).get(f"{API}queues/{world.high.pk}/lineup/").status_code in (401, 403)


def test_a_long_queue_shows_its_head_and_my_tasks_beyond_it(client, world, django_assert_max_num_queries):
    now = timezone.now()
    TaskFactory.create_batch(
        40,
        project=world.other_project,
        owner=world.outsider,
        vdc=world.vdc,
        queue=world.high,
        status="queued",
        queue_position=None,
    )
    for i, task in enumerate(Task.objects.order_by("pk"), start=1):
        Task.objects.filter(pk=task.pk).update(queue_position=i, submitted_at=now - timedelta(minutes=100 - i))
    late = TaskFactory(
        project=world.project,
        owner=world.member,
        vdc=world.vdc,
        queue=world.high,
        status="queued",
        queue_position=41,
        name="late-alpha-run",
    )
    client.force_login(world.member)
    html = client.get(reverse("portal:task-queues")).content.decode()
    lineup = html[html.index(f'data-lineup="{world.high.pk}"') :]
    assert lineup.count("data-lineup-other") == 20
    assert "20 more tasks waiting" in lineup
    table = lineup[lineup.index("<table") :]
    assert table.index("20 more tasks waiting") < table.index("late-alpha-run")
    assert f"#{late.pk} late-alpha-run</a>: position 41 of 41, estimated start unknown" in lineup
    assert f"#{late.pk} late-alpha-run" in lineup


# --- dashboard ---------------------------------------------------------------------------------------------


def test_dashboard_shows_my_running_task_before_30_newer_queued_ones(client, world):
    now = timezone.now()
    running = TaskFactory(
        project=world.project,
        owner=world.member,
        vdc=world.vdc,
        queue=world.high,
        status="running",
        name="the-running-one",
        cluster=world.cluster,
        started_at=now - timedelta(hours=1),
    )
    Task.objects.filter(pk=running.pk).update(submitted_at=now - timedelta(hours=2))
    queued = TaskFactory.create_batch(
        30, project=world.project, owner=world.member, vdc=world.vdc, queue=world.low, status="queued"
    )
    for position, task in enumerate(reversed(queued), start=1):
        Task.objects.filter(pk=task.pk).update(queue_position=position)
    client.force_login(world.member)
    response = client.get(reverse("portal:dashboard"))
    rows = [t.pk for t in response.context["tasks"]]
    assert rows[0] == running.pk and len(rows) == 20
    assert rows[1:] == [t.pk for t in reversed(queued)][:19]
    html = response.content.decode()
    assert "the-running-one" in html
    assert "11 more running or waiting tasks of yours" in html
    more = re.search(r'href="([^"]+)" data-more-tasks', html).group(1).replace("&amp;", "&")
    listed = client.get(more)
    assert listed.context["page"].paginator.count == 31
    assert listed.context["tasks"][0].pk == running.pk


# --- sorting ----------------------------------------------------------------------------------------------


@pytest.fixture
def named(world):
    now = timezone.now()
    tasks = {}
    for i, (name, status, queue) in enumerate(
        [
            ("beta-b", "queued", "low"),
            ("alpha-a", "stopped", "high"),
            ("Gamma-c", "running", "medium"),
            ("delta-d", "queued", "high"),
        ]
    ):
        task = TaskFactory(
            project=world.project,
            owner=world.member,
            vdc=world.vdc,
            queue=getattr(world, queue),
            status=status,
            name=name,
        )
        Task.objects.filter(pk=task.pk).update(submitted_at=now - timedelta(minutes=10 - i))
        tasks[name] = task
    return tasks


@pytest.mark.parametrize(
    ("sort", "expected"),
    [
        ("name", ["alpha-a", "beta-b", "delta-d", "Gamma-c"]),
        ("-name", ["Gamma-c", "delta-d", "beta-b", "alpha-a"]),
        ("status", ["Gamma-c", "beta-b", "delta-d", "alpha-a"]),
        ("queue", ["alpha-a", "delta-d", "beta-b", "Gamma-c"]),
        ("-submitted", ["delta-d", "Gamma-c", "alpha-a", "beta-b"]),
        ("submitted", ["beta-b", "alpha-a", "Gamma-c", "delta-d"]),
        ("bogus", ["delta-d", "Gamma-c", "alpha-a", "beta-b"]),
    ],
)
def test_lists_sort_by_a_column(client, world, named, sort, expected):
    client.force_login(world.member)
    response = client.get(reverse("portal:compute-tasks"), {"sort": sort})
    assert [t.name for t in response.context["tasks"]] == expected


def test_sorting_keeps_filters_and_pages(client, world, named):
    TaskFactory.create_batch(
        60,
        project=world.project,
        owner=world.member,
        vdc=world.vdc,
        queue=world.high,
        status="queued",
        name=factory_name(),
    )
    client.force_login(world.member)
    url = reverse("portal:training-jobs")
    first = client.get(url, {"status": "queued", "sort": "name"})
    second = client.get(url, {"status": "queued", "sort": "name", "page": 2})
    names = [t.name for t in first.context["tasks"]] + [t.name for t in second.context["tasks"]]
    assert len(names) == 62 and names == sorted(names, key=str.lower)
    html = first.content.decode()
    assert "status=queued&amp;sort=name&amp;page=2" in html
    assert 'href="?status=queued&amp;sort=-name" data-sort="name">Name▲' in html
    assert 'href="?status=queued&amp;sort=status" data-sort="status">Status<' in html


def factory_name():
    import factory

    return factory.Sequence(lambda n: f"bulk-{n:03d}")


# --- bulk stop --------------------------------------------------------------------------------------------


def test_bulk_stop_stops_only_what_the_user_may_stop(client, world):
    mine = TaskFactory.create_batch(
        3, project=world.project, owner=world.member, vdc=world.vdc, queue=world.high, status="queued"
    )
    finished = TaskFactory(
        project=world.project, owner=world.member, vdc=world.vdc, queue=world.high, status="completed"
    )
    theirs = TaskFactory(
        project=world.other_project, owner=world.outsider, vdc=world.vdc, queue=world.high, status="queued"
    )
    client.force_login(world.member)
    ids = [t.pk for t in mine[:2]] + [finished.pk, theirs.pk]
    response = client.post(reverse("portal:tasks-stop-selected"), {"task": ids, "next": "/training-jobs/"}, follow=True)
    assert response.redirect_chain[-1][0] == "/training-jobs/"
    statuses = dict(Task.objects.values_list("pk", "status"))
    assert [statuses[t.pk] for t in mine] == ["stopped", "stopped", "queued"]
    assert statuses[theirs.pk] == "queued" and statuses[finished.pk] == "completed"
    text = " ".join(str(m) for m in response.context["messages"])
    assert f"2 tasks stopped: #{mine[0].pk}, #{mine[1].pk}." in text
    assert "2 selected tasks not stopped" in text
    events = TaskEvent.objects.filter(task__in=mine[:2], kind="stopped")
    assert events.count() == 2 and all(e.actor_id == world.member.pk and e.to_status == "stopped" for e in events)


def test_a_viewer_cannot_bulk_stop(client, world):
    task = TaskFactory(project=world.project, owner=world.member, vdc=world.vdc, queue=world.high, status="queued")
    client.force_login(world.viewer)
    assert client.post(reverse("portal:tasks-stop-selected"), {"task": [task.pk]}).status_code == 403
    assert Task.objects.get(pk=task.pk).status == "queued"
    page = client.get(reverse("portal:compute-tasks")).content.decode()
    assert "Stop selected" not in page and 'name="task"' not in page


@pytest.mark.parametrize("n", [3, 50])
def test_bulk_stop_takes_a_fixed_number_of_statements(client, world, django_assert_max_num_queries, n):
    tasks = TaskFactory.create_batch(
        n, project=world.project, owner=world.member, vdc=world.vdc, queue=world.high, status="queued"
    )
    client.force_login(world.member)
    with django_assert_max_num_queries(16):
        client.post(reverse("portal:tasks-stop-selected"), {"task": [t.pk for t in tasks]})
    assert set(Task.objects.values_list("status", flat=True)) == {"stopped"}


def test_bulk_stop_refuses_more_than_a_page(client, world):
    client.force_login(world.member)
    response = client.post(reverse("portal:tasks-stop-selected"), {"task": list(range(1, 60))}, follow=True)
    assert "Stop at most 50 tasks at once" in " ".join(str(m) for m in response.context["messages"])


def test_bulk_stop_through_the_api(world):
    mine = TaskFactory.create_batch(
        2, project=world.project, owner=world.member, vdc=world.vdc, queue=world.high, status="queued"
    )
    theirs = TaskFactory(
        project=world.other_project, owner=world.outsider, vdc=world.vdc, queue=world.high, status="queued"
    )
    url = f"{API}tasks/stop-selected/"
    ids = [t.pk for t in mine] + [theirs.pk, 999999]
    assert client_for(world.viewer).post(url, {"ids": ids}, format="json").status_code == 403
    response = client_for(world.member).post(url, {"ids": ids, "reason": "done for today"}, format="json")
    assert response.status_code == 200
    assert response.json() == {"stopped": [t.pk for t in mine], "left_alone": 2}
    assert Task.objects.get(pk=theirs.pk).status == "queued"
    assert TaskEvent.objects.get(task=mine[0], kind="stopped").message == "Stopped by max: done for today"
    assert client_for(world.member).post(url, {"ids": []}, format="json").status_code == 400
    assert client_for(world.member).post(url, {"ids": list(range(1, 502))}, format="json").status_code == 400


def test_a_waiting_task_says_why_and_a_passed_estimate_does_not_promise_any_moment_now(client, world, line):
    """A task the engine keeps waiting (here the project's quota) names the reason on the queue page and on its own
    page; an estimated start that passed long ago says so instead of "(any moment now)" forever."""
    _, mine, _ = line
    message = "the project's quota limit would be exceeded"
    Task.objects.filter(pk=mine.pk).update(
        pending_reason="quota_exceeded", pending_message=message, estimated_start=timezone.now() - timedelta(minutes=30)
    )
    client.force_login(world.member)
    html = client.get(reverse("portal:task-queues")).content.decode()
    row = re.search(rf'data-lineup-task="{mine.pk}">(.*?)</tr>', html, re.S).group(1)
    assert "quota limit would be exceeded" in row.replace("&#x27;", "'")
    assert "any moment now" not in row and "passed 30 min ago" in row
    page = client.get(reverse("portal:task-monitoring", args=[mine.pk])).content.decode().replace("&#x27;", "'")
    assert "any moment now" not in page
    assert f"passed 30 min ago), waiting because {message}" in page
    api = client_for(world.member).get(f"{API}queues/{world.high.pk}/lineup/").json()
    entry = next(e for e in api["entries"] if e["task"] == mine.pk)
    assert entry["reason"] == message


def test_a_task_held_by_its_projects_quota_says_so_without_a_false_estimate(client, world):
    """A real cycle: the project's quota is full with work of unknown end, so the next task has no estimated start
    and says what it waits for; a user of another project sees only the kind of reason."""
    world.quota.guaranteed_gpu = world.quota.limit_gpu = 1
    world.quota.save()
    first = submit(world, world.member, world.project, "first-alpha-run")
    run_cycle(world.vdc.pk)
    first.refresh_from_db()
    assert first.status == "scheduled"
    second = submit(world, world.member, world.project, "second-alpha-run")
    run_cycle(world.vdc.pk)
    second.refresh_from_db()
    assert second.pending_reason == "quota_exceeded"
    assert second.estimated_start is None
    assert second.pending_message.startswith("no estimate: waits for your project's quota (")
    assert second.pending_message.endswith(" of 1 GPUs in use)")

    client.force_login(world.member)
    html = client.get(reverse("portal:task-queues")).content.decode().replace("&#x27;", "'")
    row = re.search(rf'data-lineup-task="{second.pk}">(.*?)</tr>', html, re.S).group(1)
    assert "no estimate: waits for your project's quota" in row and "any moment now" not in row

    client.force_login(world.outsider)
    html = client.get(reverse("portal:task-queues")).content.decode().replace("&#x27;", "'")
    other = re.search(r"data-lineup-other>(.*?)</tr>", html, re.S).group(1)
    assert "waits for its project's quota" in other
    assert "no estimate" not in other and "second-alpha-run" not in html
    api = client_for(world.outsider).get(f"{API}queues/{world.high.pk}/lineup/").json()
    entry = next(e for e in api["entries"] if not e["visible"])
    assert (entry["reason"], entry["reason_kind"]) == (None, "its project's quota")
