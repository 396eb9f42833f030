"""The engine grants what an autoscaled service asks for (SPEC §4, §7): quota, class and placement rules."""

from apps.queues.engine import ProjectQuota, Resources, schedule

from .builders import node, preempted, running, snap, task


def service(tid, queue, desired, minimum=1, **kw):
    """An autoscaled inference service whose autoscaler asks for ``desired`` replicas."""
    return task(tid, queue, kind="inference", min_replicas=minimum, max_replicas=desired, autoscaled=True, **kw)


def resize_of(d, tid):
    return next((r for r in d.resizes if r.task_id == tid), None)


def test_autoscaled_service_grows_to_its_desired_count_and_no_further():
    svc = service("svc", "high", desired=3)
    d = schedule(snap([node("n1", cards=8)], running=[running(svc, [("n1", [0])])]))
    r = resize_of(d, "svc")
    assert r.replicas == 3 and len(r.added) == 2


def test_lower_desired_count_gives_replicas_back():
    svc = service("svc", "high", desired=2)
    d = schedule(snap([node("n1")], running=[running(svc, [("n1", [0]), ("n1", [1]), ("n1", [2]), ("n1", [3])])]))
    r = resize_of(d, "svc")
    assert r.replicas == 2 and len(r.removed) == 2
    assert "maximum of 2" in r.message


def test_autoscaled_growth_stays_within_the_project_quota():
    svc = service("svc", "high", desired=4)
    quota = ProjectQuota("p1", limit=Resources(64, 256, 2))
    d = schedule(snap([node("n1", cards=8)], running=[running(svc, [("n1", [0])])], quotas=[quota]))
    assert resize_of(d, "svc").replicas == 2


def test_high_service_needing_a_replica_shrinks_a_low_service_before_preempting_anyone():
    hi = service("hi", "high", desired=2)
    lo = service("lo", "low", desired=3)
    lone = task("lone", "low")
    rts = [
        running(hi, [("n1", [0])]),
        running(lo, [("n1", [1]), ("n1", [2])], started_at=10),
        running(lone, [("n1", [3])], started_at=90),
    ]
    d = schedule(snap([node("n1")], running=rts))
    assert preempted(d) == []
    assert resize_of(d, "hi").replicas == 2
    shrink = resize_of(d, "lo")
    assert shrink.replicas == 1 and "gives replicas back to service 'hi'" in shrink.message


def test_high_service_preempts_the_cheapest_low_task_once_no_replica_can_be_shrunk():
    hi = service("hi", "high", desired=3)
    lo = service("lo", "low", desired=1)  # at its minimum: nothing to shrink
    lone = task("lone", "low")
    rts = [
        running(hi, [("n1", [0]), ("n1", [1])]),
        running(lo, [("n1", [2])], started_at=0),
        running(lone, [("n1", [3])], started_at=90),
    ]
    d = schedule(snap([node("n1")], running=rts))
    assert preempted(d) == ["lone"]  # least work lost, as for a queued high task
    assert d.preemptions[0].by_task_id == "hi"
    assert resize_of(d, "hi").replicas == 3


def test_a_service_never_takes_replicas_from_its_own_class():
    a = service("a", "high", desired=3)
    b = service("b", "high", desired=2)
    rts = [running(a, [("n1", [0]), ("n1", [1])]), running(b, [("n1", [2]), ("n1", [3])])]
    d = schedule(snap([node("n1")], running=rts))
    assert d.resizes == () and preempted(d) == []


def test_plain_elastic_task_grows_only_into_idle_capacity():
    el = task("el", "high", min_replicas=1, max_replicas=3)
    lo = service("lo", "low", desired=3)
    rts = [running(el, [("n1", [0])]), running(lo, [("n1", [1]), ("n1", [2]), ("n1", [3])])]
    d = schedule(snap([node("n1")], running=rts))
    assert d.resizes == () and preempted(d) == []


def test_low_service_grows_back_when_the_high_service_shrinks():
    hi = service("hi", "high", desired=1)  # the pressure went: its autoscaler asks for one replica again
    lo = service("lo", "low", desired=3)
    rts = [running(hi, [("n1", [0]), ("n1", [1]), ("n1", [2])]), running(lo, [("n1", [3])])]
    d = schedule(snap([node("n1")], running=rts))
    assert resize_of(d, "hi").replicas == 1
    assert resize_of(d, "lo").replicas == 3
