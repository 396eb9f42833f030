"""Capacity reservations: admin-held windows the engine leaves free (apps/queues/engine/reservations.py)."""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from apps.queues.engine import CapacityReservation, Cluster, PreemptReason, Reason, Scheduler, schedule
from apps.queues.engine.reservations import Holds

from .builders import node, preempted, running, snap, started, task, waiting
from .test_invariants import PROJECTS, snapshots

NOW = 1000.0


def res(rid="maint", start=NOW - 10, end=NOW + 3600, **kw) -> CapacityReservation:
    return CapacityReservation(rid, start, end, **kw)


def with_res(s, *reservations):
    return replace(s, reservations=tuple(reservations))


def node_of(d, task_id):
    return next(s.placements[0].node_id for s in d.starts if s.task_id == task_id)


def test_held_nodes_are_skipped_during_the_window():
    s = snap([node("n1", cards=1), node("n2", cards=1)], [task("a"), task("b", submit_time=1)], now=NOW)
    d = schedule(with_res(s, res(node_ids=("n1",))))
    assert started(d) == ["a"] and node_of(d, "a") == "n2"
    w = waiting(d)["b"]
    assert w.reason == Reason.CAPACITY_RESERVED
    assert w.message.startswith("capacity reserved for maintenance until ")
    assert w.estimated_start == NOW + 3600  # not before the window ends


def test_allowed_project_uses_the_held_nodes():
    s = snap([node("n1", cards=2)], [task("other", project="p2"), task("event", project="p1", submit_time=1)], now=NOW)
    d = schedule(with_res(s, res("hackathon", projects=frozenset({"p1"}), name="Hackathon")))
    assert started(d) == ["event"]
    w = waiting(d)["other"]
    assert w.reason == Reason.CAPACITY_RESERVED and "an event (“Hackathon”)" in w.message


def test_no_reservation_after_its_end():
    s = snap([node("n1", cards=1)], [task("a")], now=NOW)
    assert started(schedule(with_res(s, res(start=NOW - 100, end=NOW - 1)))) == ["a"]


def test_before_the_window_a_long_task_keeps_off_held_capacity_but_a_short_one_uses_it():
    window = res(start=NOW + 600, end=NOW + 4200, node_ids=("n1",))
    long_ = task("long", "high", expected_duration_s=3600)
    short = task("short", "high", expected_duration_s=300, submit_time=1)
    d = schedule(with_res(snap([node("n1", cards=1)], [long_, short], now=NOW), window))
    assert started(d) == ["short"]
    w = waiting(d)["long"]
    assert w.reason == Reason.CAPACITY_RESERVED and "this task could still be running then" in w.message


def test_wall_time_limit_is_trusted_before_the_expected_duration():
    window = res(start=NOW + 600, end=NOW + 4200, node_ids=("n1",))
    bounded = task("bounded", expected_duration_s=3600, wall_time_s=500)
    assert started(schedule(with_res(snap([node("n1", cards=1)], [bounded], now=NOW), window))) == ["bounded"]


def test_a_task_without_estimate_keeps_off_within_the_lead_time():
    unknown = task("unknown")
    far = res(start=NOW + 7200, end=NOW + 9000, node_ids=("n1",), lead_s=3600)
    near = replace(far, start=NOW + 1800, end=NOW + 3000)
    assert started(schedule(with_res(snap([node("n1", cards=1)], [unknown], now=NOW), far))) == ["unknown"]
    d = schedule(with_res(snap([node("n1", cards=1)], [unknown], now=NOW), near))
    assert waiting(d)["unknown"].reason == Reason.CAPACITY_RESERVED


def test_running_work_is_not_preempted_when_the_window_starts():
    low = task("low", "low")
    s = snap([node("n1", cards=1)], [task("hi")], [running(low, [("n1", [0])])], now=NOW)
    d = schedule(with_res(s, res(node_ids=("n1",))))
    assert preempted(d) == [] and started(d) == []
    assert waiting(d)["hi"].reason == Reason.INSUFFICIENT_CAPACITY


def test_high_task_does_not_preempt_work_on_held_nodes():
    low = task("low", "low")
    s = snap([node("n1", cards=1), node("n2", cards=1)], [task("hi")], [running(low, [("n1", [0])])], now=NOW)
    d = schedule(with_res(s, res(node_ids=("n1", "n2"))))
    assert preempted(d) == [] and started(d) == []


def test_drain_preempts_preemptible_work_at_the_start():
    low = task("low", "low")
    keep = task("keep", "low", preemptible=False)
    hi = task("hi-run", "high")
    nodes = [node("n1", cards=1), node("n2", cards=1), node("n3", cards=1)]
    runs = [running(low, [("n1", [0])]), running(keep, [("n2", [0])]), running(hi, [("n3", [0])])]
    drain = res(preempt_at_start=True)
    d = schedule(with_res(snap(nodes, [], runs, now=NOW), drain))
    assert preempted(d) == ["low"]
    p = d.preemptions[0]
    assert p.reason == PreemptReason.CAPACITY_RESERVATION and p.by_task_id is None and p.requeue
    before = replace(drain, start=NOW + 10)
    assert preempted(schedule(with_res(snap(nodes, [], runs, now=NOW), before))) == []


def test_amount_holds_whole_nodes_preferring_those_free_at_the_start():
    nodes = [node("n1", cards=4), node("n2", cards=4), node("n3", cards=2)]
    busy = running(task("busy", "low"), [("n1", [0])])  # no estimate: still runs at the start
    queued = [task(f"t{i}", submit_time=i) for i in range(8)]
    held = res(gpu_model="A100-80G", cards=4)
    d = schedule(with_res(snap(nodes, queued, [busy], now=NOW), held))
    # n2 alone covers the 4 cards and is idle: held; n1 (busy) and n3 take work (3 + 2 cards).
    used = {s.placements[0].node_id for s in d.starts}
    assert used == {"n1", "n3"} and len(d.starts) == 5
    assert all(w.reason == Reason.CAPACITY_RESERVED for w in d.waiting)


def test_gpu_equivalent_amount_and_cluster_scope():
    nodes = [node("a1", cluster="c1", cards=2), node("b1", cluster="c2", cards=2)]
    s = snap(nodes, [task("x"), task("y", submit_time=1)], now=NOW, clusters=[Cluster("c1"), Cluster("c2")])
    d = schedule(with_res(s, res(cluster_ids=("c2",), gpu=1.5)))
    assert {node_of(d, t) for t in started(d)} == {"a1"} and len(started(d)) == 2


def test_elastic_task_does_not_grow_into_held_nodes():
    el = task("el", "low", instances=1, min_replicas=1, max_replicas=3)
    s = snap([node("n1", cards=1), node("n2", cards=2)], [], [running(el, [("n1", [0])])], now=NOW)
    d = schedule(with_res(s, res(node_ids=("n2",))))
    assert d.resizes == ()
    assert schedule(s).resizes  # without the reservation it grows


def test_kept_scheduler_follows_the_window():
    sched = Scheduler(with_res(snap([node("n1", cards=1)], [task("a", "low")], now=NOW), res(end=NOW + 100)))
    assert started(sched.cycle(NOW)) == []
    assert started(sched.cycle(NOW + 100)) == ["a"]


def test_invalid_reservation_is_refused():
    with pytest.raises(ValueError, match="end must be after start"):
        CapacityReservation("r", NOW, NOW)
    with pytest.raises(ValueError, match="cards need a gpu_model"):
        CapacityReservation("r", NOW, NOW + 1, cards=2)


@st.composite
def reserved_snapshots(draw):
    """A random snapshot (as in the invariant tests) with one random capacity reservation."""
    s = draw(snapshots())
    node_ids = [n.id for n in s.nodes]
    mode = draw(st.sampled_from(["nodes", "cluster", "cards", "gpu"]))
    fields: dict = {}
    if mode == "nodes":
        fields["node_ids"] = tuple(draw(st.lists(st.sampled_from(node_ids), min_size=1, max_size=3, unique=True)))
    elif mode == "cluster":
        fields["cluster_ids"] = (draw(st.sampled_from(["c1", "c2"])),)
    elif mode == "cards":
        fields.update(gpu_model=draw(st.sampled_from(["A100-80G", "T4", "V100"])), cards=draw(st.integers(1, 4)))
    else:
        fields["gpu"] = float(draw(st.integers(1, 4)))
    start = s.now + draw(st.sampled_from([-100.0, 0.0, 300.0, 1500.0, 5000.0]))
    r = CapacityReservation(
        "r",
        start,
        start + 3600,
        projects=frozenset(draw(st.sets(st.sampled_from(PROJECTS), max_size=2))),
        lead_s=float(draw(st.sampled_from([0, 1000, 86400]))),
        preempt_at_start=draw(st.booleans()),
        **fields,
    )
    return replace(s, reservations=(r,))


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(reserved_snapshots())
def test_no_new_work_lands_on_held_nodes_unless_allowed_or_gone_in_time(s):
    sched = Scheduler(s)
    holds = Holds(sched, s.reservations, s.now)
    d = sched.cycle(s.now)
    held_ids = {sched.nodes[pos].node.id for _r, nodes in holds.held for pos in nodes}
    tasks = {t.id: t for t in s.queued} | {rt.task.id: rt.task for rt in s.running}
    (r,) = s.reservations
    for task_id, placements in [(x.task_id, x.placements) for x in d.starts] + [
        (x.task_id, x.added) for x in d.resizes
    ]:
        if holds.applies(r, tasks[task_id]):
            assert not {p.node_id for p in placements} & held_ids, (task_id, r)
    for p in d.preemptions:
        if p.reason == PreemptReason.CAPACITY_RESERVATION:
            assert r.preempt_at_start and r.start <= s.now
        elif p.by_task_id is not None and holds.applies(r, tasks[p.by_task_id]):
            victim = next(rt for rt in s.running if rt.task.id == p.task_id)
            assert not {pl.node_id for pl in victim.placements} & held_ids  # nobody preempts to get in
