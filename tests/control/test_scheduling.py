"""The Django scheduling service: snapshot loading, decisions applied atomically, bounded queries."""

from datetime import timedelta

from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from apps.control.models import BackendObject
from apps.control.scheduling import SnapshotLoader, run_cycle
from apps.queues.engine.model import Link
from apps.tasks.models import Task
from apps.tasks.services import submit_task
from tests.factories import TaskFactory


def submit(world, queue="high", **fields):
    fields.setdefault("kind", "training")
    fields.setdefault("name", "job")
    return submit_task(world.member, project=world.project, queue=queue, command="sleep 1", **fields)


def test_cycle_places_a_queued_task_on_devices_and_writes_a_scheduled_event(world):
    task = submit(world, gpu_spec="2(A100)")
    result = run_cycle(world.vdc.pk)
    task.refresh_from_db()
    assert result.started == 1
    assert task.status == "scheduled"
    assert task.cluster == world.cluster
    assert task.attempt == 1
    assert len(task.placement) == 1 and len(task.placement[0]["devices"]) == 2
    assert task.placement[0]["node_name"] == "gpu-node-1"
    assert float(task.allocated_gpu) == 2.0
    assert task.events.filter(kind="scheduled").exists()


def test_task_that_does_not_fit_gets_a_position_and_a_reason(world):
    submit(world, gpu_spec="8(A100)", name="big")
    waiting = submit(world, gpu_spec="1(A100)", name="small", queue="medium", expected_duration=timedelta(hours=1))
    run_cycle(world.vdc.pk)
    waiting.refresh_from_db()
    assert waiting.status == "queued"
    assert waiting.queue_position == 1
    assert waiting.pending_reason
    assert waiting.pending_message


def test_a_task_of_another_project_that_preempts_stays_anonymous(world):
    low = submit(world, gpu_spec="8(A100)", queue="low", name="batch")
    run_cycle(world.vdc.pk)
    other = submit_task(
        world.outsider,
        project=world.other_project,
        queue="high",
        kind="training",
        name="secret-project-run",
        gpu_spec="4(A100)",
        command="sleep 1",
    )
    run_cycle(world.vdc.pk)
    low.refresh_from_db()
    assert low.status == "suspended"
    assert low.status_message.startswith("Suspended for a high-class task of another project:")
    assert "secret-project-run" not in low.status_message and f"#{other.pk}" not in low.status_message


def test_high_task_preempts_low_task_and_low_is_suspended(world):
    world.quota.limit_gpu = 16
    world.quota.save()
    low = submit(world, gpu_spec="8(A100)", queue="low", name="batch")
    run_cycle(world.vdc.pk)
    low.refresh_from_db()
    assert low.status == "scheduled"
    high = submit(world, gpu_spec="4(A100)", name="urgent")
    run_cycle(world.vdc.pk)
    low.refresh_from_db()
    high.refresh_from_db()
    assert low.status == "suspended"
    event = low.events.get(kind="suspended")
    assert event.data["by_task"] == high.pk
    # Who took the resources, why, and what happens next; not a bare id.
    assert (
        event.message
        == low.status_message
        == (
            f"Suspended for task #{high.pk} “urgent” (high class): it needs these resources and its class comes first. "
            "Requeued; it starts again when resources are free."
        )
    )
    run_cycle(world.vdc.pk)
    high.refresh_from_db()
    assert high.status == "scheduled"


def test_snapshot_queries_do_not_grow_with_tasks(world):
    def queries_for(n):
        Task.objects.all().delete()
        TaskFactory.create_batch(
            n, project=world.project, owner=world.member, vdc=world.vdc, queue=world.low, gpu_spec="8(A100)"
        )
        with CaptureQueriesContext(connection) as load:
            SnapshotLoader(world.vdc).load(timezone.now())
        with CaptureQueriesContext(connection) as cycle:
            run_cycle(world.vdc.pk)
        return len(load.captured_queries), len(cycle.captured_queries)

    (load_small, cycle_small), (load_large, cycle_large) = queries_for(5), queries_for(300)
    assert load_large == load_small
    # Writes are bulk statements in batches, so 60 times the tasks costs at most a few more statements.
    assert cycle_large <= cycle_small + 3, (cycle_small, cycle_large)


def test_naming_the_running_tasks_waiting_work_waits_for_costs_no_query_per_task(world):
    """Waiting messages name the running task each waiting one waits for. Its name is part of the snapshot:
    once it was deferred and read with one query per named task, so statements grew with the backlog."""
    world.quota.limit_gpu = 16  # the waiting tasks wait for cards, not for the quota
    world.quota.save()
    world.high.policy = "nonstrict_fifo"  # each waiting task has its own estimate, not "behind an earlier task"
    world.high.save()

    def cycle_with(waiting_count):
        # Gone from the backend too: a job of a deleted task would keep its card until its backend confirms it gone.
        BackendObject.objects.all().delete()
        Task.objects.all().delete()
        for k in range(8):  # fill the node's eight cards, ending one hour apart
            submit(world, gpu_spec="1(A100)", name=f"running-{k}", expected_duration=timedelta(hours=k + 1))
        run_cycle(world.vdc.pk)  # they start; the next cycle loads them from the database
        waiting = [submit(world, gpu_spec="1(A100)", name=f"waiting-{k}") for k in range(waiting_count)]
        with CaptureQueriesContext(connection) as cycle:
            run_cycle(world.vdc.pk)
        messages = Task.objects.filter(pk__in=[t.pk for t in waiting]).values_list("pending_message", flat=True)
        return len(cycle.captured_queries), {m.split("“")[1].split("”")[0] for m in messages}

    few, named_few = cycle_with(2)
    many, named_many = cycle_with(8)
    assert named_few == {"running-0", "running-1"}
    assert named_many == {f"running-{k}" for k in range(8)}
    assert many == few, (few, many)


def test_cycle_of_a_disabled_vdc_is_skipped(world):
    world.vdc.enabled = False
    world.vdc.save()
    assert run_cycle(world.vdc.pk).skipped


def test_a_task_the_engine_cannot_take_is_set_aside_and_the_cycle_goes_on(world):
    """List-valued labels and absurd durations once made every cycle of the VDC fail."""
    bad_labels = submit(world, gpu_spec="1(A100)", name="labels")
    Task.objects.filter(pk=bad_labels.pk).update(required_labels={"gpu": ["a100"]})  # got past the doors
    bad_duration = submit(world, gpu_spec="1(A100)", name="forever")
    Task.objects.filter(pk=bad_duration.pk).update(expected_duration=timedelta(days=999_999))
    good = submit(world, gpu_spec="1(A100)", name="fine")

    result = run_cycle(world.vdc.pk)

    assert result.started == 1
    for task, words in ((bad_labels, "required labels"), (bad_duration, "expected duration")):
        task.refresh_from_db()
        assert (task.status, task.pending_reason) == ("queued", "invalid_request")
        assert words in task.pending_message
    good.refresh_from_db()
    assert good.status == "scheduled"


def test_a_task_that_makes_the_engine_fail_is_found_and_set_aside(world, monkeypatch):
    from apps.queues import engine

    culprit = submit(world, gpu_spec="1(A100)", name="culprit")
    others = [submit(world, gpu_spec="1(A100)", name=f"ok-{i}") for i in range(5)]
    real = engine.schedule

    def fragile(snapshot):
        if any(t.id == culprit.pk for t in snapshot.queued):
            raise TypeError("unhashable type: 'list'")
        return real(snapshot)

    monkeypatch.setattr(engine, "schedule", fragile)
    result = run_cycle(world.vdc.pk)

    assert result.started == 5
    culprit.refresh_from_db()
    assert culprit.pending_reason == "invalid_request" and "could not handle" in culprit.pending_message
    assert all(Task.objects.get(pk=t.pk).status == "scheduled" for t in others)


def test_one_vdcs_failing_cycle_does_not_stop_the_others(world, monkeypatch):
    from apps.control import scheduling
    from tests.factories import ClusterFactory, DeviceFactory, NodeFactory, TaskQueueFactory, VDCFactory

    broken = VDCFactory(name="broken")
    node = NodeFactory(cluster=ClusterFactory(vdc=broken, name="c-broken"))
    DeviceFactory(node=node, index=0)
    TaskQueueFactory(vdc=broken, name="high", priority_class="high")
    task = submit(world, gpu_spec="1(A100)")
    real = scheduling.run_cycle

    def run_cycle_breaking(vdc_id):
        if vdc_id == broken.pk:
            raise RuntimeError("database hiccup")
        return real(vdc_id)

    monkeypatch.setattr(scheduling, "run_cycle", run_cycle_breaking)
    results = scheduling.run_all_cycles()

    assert {r.vdc: r.failed for r in results} == {str(broken.pk): True, "main": False}
    task.refresh_from_db()
    assert task.status == "scheduled"


def test_an_estimate_beyond_what_a_date_holds_is_left_empty(world):
    running = submit(world, gpu_spec="8(A100)", name="long", queue="medium", expected_duration=timedelta(days=1))
    run_cycle(world.vdc.pk)
    Task.objects.filter(pk=running.pk).update(expected_duration=timedelta(days=3_000_000))
    waiting = submit(world, gpu_spec="1(A100)", name="after", queue="medium", expected_duration=timedelta(hours=1))
    run_cycle(world.vdc.pk)
    waiting.refresh_from_db()
    assert waiting.status == "queued" and waiting.estimated_start is None


def _clock(when, now):
    """The time of day in the server's zone, with the date when it is not the day of ``now`` (the cycle's time):
    a test run shortly before midnight gets an estimate on the next day."""
    local = timezone.localtime(when)
    same_day = local.date() == timezone.localtime(now).date()
    return local.strftime("%H:%M:%S %Z" if same_day else "%Y-%m-%d %H:%M:%S %Z")


def test_a_waiting_task_is_told_which_running_task_it_waits_for_and_until_when(world):
    # Not just "not enough free capacity".
    world.quota.limit_gpu = 16
    world.quota.save()
    running = submit(world, gpu_spec="8(A100)", name="pretrain", expected_duration=timedelta(minutes=30))
    run_cycle(world.vdc.pk)
    waiting = submit(world, gpu_spec="4(A100)", name="next", queue="low")
    cycle_time = timezone.now()
    run_cycle(world.vdc.pk)
    running.refresh_from_db()
    waiting.refresh_from_db()
    expected_end = running.started_at + timedelta(minutes=30)
    assert abs((waiting.estimated_start - expected_end).total_seconds()) < 2
    assert waiting.pending_reason == "insufficient_capacity"
    assert waiting.pending_message == (
        f"not enough free capacity; enough frees up when task #{running.pk} “pretrain” (high class) is expected "
        f"to end, {_clock(waiting.estimated_start, cycle_time)}"
    )
    assert _clock(waiting.estimated_start, cycle_time).endswith(" UTC")


def test_a_high_task_waits_for_a_medium_tasks_guaranteed_window_not_its_end(world):
    world.quota.limit_gpu = 16
    world.quota.save()
    medium = submit(world, gpu_spec="8(A100)", name="finetune", queue="medium", expected_duration=timedelta(hours=2))
    run_cycle(world.vdc.pk)
    # A requeued medium task runs with a halved window: protected for 10 minutes, expected to run 2 hours.
    Task.objects.filter(pk=medium.pk).update(window=timedelta(minutes=10))
    high = submit(world, gpu_spec="8(A100)", name="urgent")
    cycle_time = timezone.now()
    run_cycle(world.vdc.pk)
    medium.refresh_from_db()
    high.refresh_from_db()
    assert medium.status == "scheduled", "inside its window a medium task is never preempted"
    window_end = medium.started_at + timedelta(minutes=10)
    assert abs((high.estimated_start - window_end).total_seconds()) < 2
    assert high.pending_message == (
        f"waiting for task #{medium.pk} “finetune” (medium class)'s guaranteed window, which ends "
        f"{_clock(high.estimated_start, cycle_time)}; it may be preempted then"
    )


def test_the_running_task_waited_for_stays_anonymous_across_projects(world):
    other = submit_task(
        world.outsider,
        project=world.other_project,
        queue="high",
        kind="training",
        name="secret-project-run",
        gpu_spec="8(A100)",
        command="sleep 1",
        expected_duration=timedelta(minutes=20),
    )
    run_cycle(world.vdc.pk)
    waiting = submit(world, gpu_spec="2(A100)", name="mine", queue="low")
    run_cycle(world.vdc.pk)
    waiting.refresh_from_db()
    assert "a high-class task of another project is expected to end" in waiting.pending_message
    assert "secret-project-run" not in waiting.pending_message and f"#{other.pk}" not in waiting.pending_message


def test_a_projects_quota_priority_reaches_the_engine(world):
    # The admin's quota priority changed nothing.
    from apps.vdc.models import ProjectQuota

    mine = submit(world, gpu_spec="8(A100)", name="mine", queue="low")
    ProjectQuota.objects.filter(project=world.other_project).update(priority=10)
    theirs = submit_task(
        world.outsider,
        project=world.other_project,
        queue="low",
        kind="training",
        name="theirs",
        gpu_spec="8(A100)",
        command="sleep 1",
    )
    run_cycle(world.vdc.pk)
    mine.refresh_from_db()
    theirs.refresh_from_db()
    assert (theirs.status, mine.status) == ("scheduled", "queued")


def test_card_links_reach_the_snapshot_parsed_once_per_distinct_json(world):
    from django.db.models import JSONField, Value

    from apps.clusters.models import Device
    from tests.factories import DeviceFactory, NodeFactory

    nvlink = [{"peer": 1, "type": "nvlink", "bandwidth_gbps": 600}, {"peer": "x"}, "junk", {"type": "pcie"}]
    first = world.node.devices.order_by("index")
    Device.objects.filter(pk=first[0].pk).update(links=nvlink)
    Device.objects.filter(pk=first[1].pk).update(links=[{"peer": 0}])
    Device.objects.filter(pk=first[2].pk).update(links=Value(None, JSONField()))  # JSON null
    twin = NodeFactory(cluster=world.cluster, name="gpu-node-2")
    DeviceFactory(node=twin, index=0, links=nvlink)
    snapshot = SnapshotLoader(world.vdc).load(timezone.now())
    cards = {(n.id, d.index): d.links for n in snapshot.nodes for d in n.devices}
    expected = (Link(peer_index=1, kind="nvlink", bandwidth_gbps=600),)  # entries without an integer peer left out
    assert cards[(world.node.pk, 0)] == expected and cards[(twin.pk, 0)] == expected
    assert cards[(world.node.pk, 0)] is cards[(twin.pk, 0)]  # one parse for the same JSON
    assert cards[(world.node.pk, 1)] == (Link(peer_index=0, kind="pcie", bandwidth_gbps=0),)
    assert cards[(world.node.pk, 2)] == () and cards[(world.node.pk, 3)] == ()


def test_a_task_held_by_its_projects_quota_waits_for_the_projects_own_task_that_ends_first(world):
    world.quota.limit_gpu = 2
    world.quota.save()
    first = submit(world, gpu_spec="1(A100)", name="first", expected_duration=timedelta(hours=1))
    submit(world, gpu_spec="1(A100)", name="second")
    run_cycle(world.vdc.pk)
    third = submit(world, gpu_spec="1(A100)", name="third")
    run_cycle(world.vdc.pk)
    third.refresh_from_db()
    first.refresh_from_db()
    assert third.pending_reason == "quota_exceeded"
    # Free cards are there now; the quota frees one GPU when "first" is expected to end.
    assert third.estimated_start is not None
    assert third.estimated_start >= timezone.now() + timedelta(minutes=55)
    assert third.pending_message.startswith(
        f"the project's quota limit would be exceeded; enough of it frees up when task #{first.pk} “first” "
        "(high class) is expected to end, "
    )
