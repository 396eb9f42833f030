"""The engine grants what an autoscaled service asks for (docs/rules.md#autoscaling): quota, class and placement
rules."""

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from apps.queues.engine import Cluster, ProjectQuota, Resources, RunningTask, schedule

from .builders import node, preempted, running, snap, started, task, waiting
from .builders import running as running_task


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


def test_on_slurm_each_replica_of_a_service_gets_a_node_of_its_own():
    # Replica jobs share their node's network on Slurm: two on one node would both listen on the service's port.
    svc = service("svc", "high", desired=3)
    slurm = (Cluster("c1", type="slurm"),)
    d = schedule(
        snap([node("n1", cards=8), node("n2", cards=8)], running=[running(svc, [("n1", [0])])], clusters=slurm)
    )
    r = resize_of(d, "svc")
    assert r.replicas == 2 and [p.node_id for p in r.added] == ["n2"]  # not a third: no node left without one
    # The same service on a local cluster packs its replicas (each has a network of its own there).
    d = schedule(snap([node("n1", cards=8), node("n2", cards=8)], running=[running(svc, [("n1", [0])])]))
    assert resize_of(d, "svc").replicas == 3


def test_on_slurm_a_service_starting_with_several_replicas_puts_each_on_a_node_of_its_own():
    # The first start of a service with min 2 places its replicas together, as a gang would; on Slurm two replica
    # jobs on one node would both listen on the service's port, so they go to distinct nodes there.
    svc = service("svc", "high", desired=3, minimum=2)
    slurm = (Cluster("c1", type="slurm"),)
    d = schedule(snap([node("n1", cards=8), node("n2", cards=8)], queued=[svc], clusters=slurm))
    (start,) = d.starts
    assert sorted(p.node_id for p in start.placements) == ["n1", "n2"]
    # One node cannot hold two replicas there: the service waits rather than doubling up.
    d = schedule(snap([node("n1", cards=8)], queued=[svc], clusters=slurm))
    assert started(d) == [] and waiting(d)["svc"].reason == "insufficient_capacity"
    # A plain gang of the same shape on Slurm, and the service on a local cluster, still pack onto one node.
    gang = task("gang", "high", instances=2)
    d = schedule(snap([node("n1", cards=8)], queued=[gang], clusters=slurm))
    assert started(d) == ["gang"]
    d = schedule(snap([node("n1", cards=8), node("n2", cards=8)], queued=[svc]))
    assert {p.node_id for p in d.starts[0].placements} == {"n1"}


def test_a_service_keeps_one_replica_per_slurm_node_beside_a_plain_gang_of_its_shape():
    # Demands are shared per request shape; a plain gang of the service's shape, considered first, must not
    # hand the service its packed placement.
    gang = task("gang", "high", instances=2, submit_time=1.0)
    svc = service("svc", "high", desired=3, minimum=2, submit_time=2.0)
    slurm = (Cluster("c1", type="slurm"),)
    d = schedule(snap([node("n1", cards=8), node("n2", cards=8)], queued=[gang, svc], clusters=slurm))
    placed = {s.task_id: [p.node_id for p in s.placements] for s in d.starts}
    assert len(set(placed["gang"])) == 1 and sorted(placed["svc"]) == ["n1", "n2"]


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


CLASSES = ("high", "medium", "low")


@st.composite
def crowded(draw):
    """One full-ish node of 4 cards shared by services and tasks of every class, each replica on one card."""
    cards = iter(range(4))
    running = []
    for i in range(draw(st.integers(1, 4))):
        cls = draw(st.sampled_from(CLASSES))
        extra = {"expected_duration_s": 50.0} if cls == "medium" else {}
        if draw(st.booleans()):
            t = service(f"s{i}", cls, desired=draw(st.integers(1, 4)), **extra)
        else:
            t = task(f"t{i}", cls, **extra)
        where = []
        for _ in range(draw(st.integers(1, 2)) if t.autoscaled else 1):
            card = next(cards, None)
            if card is not None:
                where.append(("n1", [card]))
        if not where:
            break
        running.append(running_task(t, where, started_at=float(draw(st.integers(0, 90)))))
    window = {rt.task.id: rt.task.expected_duration_s for rt in running}
    running = [
        RunningTask(rt.task, rt.cluster_id, rt.placements, rt.started_at, window.get(rt.task.id)) for rt in running
    ]
    return snap([node("n1")], running=running)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(crowded())
def test_services_competing_for_replicas_keep_the_class_rules(s):
    d = schedule(s)
    by_id = {rt.task.id: rt for rt in s.running}
    rank = {"low": 0, "medium": 1, "high": 2}
    gone = {p.task_id for p in d.preemptions}
    for p in d.preemptions:
        victim, by = by_id[p.task_id], by_id[p.by_task_id]
        assert victim.task.queue_id != "high"
        assert rank[victim.task.queue_id] < rank[by.task.queue_id]
        if victim.task.queue_id == "medium":
            assert s.now >= victim.started_at + victim.window_s
    growers = {r.task_id for r in d.resizes if r.added}
    used: dict = {}
    for r in d.resizes:
        rt = by_id[r.task_id]
        t = rt.task
        assert r.replicas >= t.min_replicas  # never below the minimum
        if r.removed and "gives replicas back" in r.message:
            # taken only by a higher-class service that grew in this cycle
            assert any(rank[by_id[g].task.queue_id] > rank[t.queue_id] for g in growers)
        if r.added:
            assert r.replicas <= t.max_replicas
    removed = {(r.task_id, pl) for r in d.resizes for pl in r.removed}
    for rt in s.running:
        if rt.task.id in gone:
            continue
        for pl in rt.placements:
            if (rt.task.id, pl) not in removed:
                for share in pl.devices:
                    used[share.device_id] = used.get(share.device_id, 0) + share.milli
    for r in d.resizes:
        for pl in r.added:
            for share in pl.devices:
                used[share.device_id] = used.get(share.device_id, 0) + share.milli
    assert all(v <= 1000 for v in used.values())
