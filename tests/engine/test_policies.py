"""Queue policies beyond fifo / drf / backfill (docs/engine.md, "Queue policies"): non-strict FIFO, 2D-LAS, SJF and
weighted fair
share; FGD's rolling target workload; the simulator's preemption cost."""

from __future__ import annotations

import dataclasses
import warnings
from collections import Counter

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from apps.queues.engine import (
    BACKFILL,
    FAIR_SHARE,
    FIFO,
    LAS,
    NONSTRICT_FIFO,
    SJF,
    ProjectQuota,
    Queue,
    Reason,
    Resources,
    Scheduler,
    schedule,
)
from apps.queues.engine.policies import LAS_THRESHOLDS_GPU_S, las_level, queue_order
from apps.queues.engine.sim import SimTask, replay

from .builders import MODELS, node, running, snap, started, task, waiting
from .test_invariants import _final_allocation, snapshots

HOUR = 3600.0


def _queues(policy):
    return (Queue("high", "high", policy), Queue("medium", "medium", policy), Queue("low", "low", policy))


def _gang_blocked(policy):
    """Two 4-card nodes, 5 cards busy without expected ends; a 4-card head, then four 1-GPU tasks."""
    busy = [
        running(task("a", "high"), [("n1", [0, 1])], started_at=0),
        running(task("b", "high"), [("n2", [0, 1, 2])], started_at=10),
    ]
    queued = [task("head", gpu=4, submit_time=1)] + [task(f"s{i}", submit_time=2 + i) for i in range(4)]
    return snap([node("n1"), node("n2")], queued, busy, qs=_queues(policy), now=50)


def test_fifo_holds_one_gpu_tasks_behind_a_blocked_gang_head():
    d = schedule(_gang_blocked(FIFO))
    assert started(d) == []
    assert waiting(d)["s0"].reason == Reason.QUEUE_ORDER


def test_nonstrict_fifo_runs_later_tasks_that_fit_and_keeps_the_heads_nodes():
    d = schedule(_gang_blocked(NONSTRICT_FIFO))
    # n1 (its task started first) is drained for the head: its two free cards stay free; n2's last card is used.
    assert started(d) == ["s0"]
    assert d.starts[0].placements[0].node_id == "n2"
    w = waiting(d)
    assert w["head"].reason == Reason.INSUFFICIENT_CAPACITY
    assert w["s1"].reason == Reason.WAITING_FOR_RESERVATION


def test_backfill_without_estimates_gives_the_heads_nodes_away_unlike_nonstrict_fifo():
    d = schedule(_gang_blocked(BACKFILL))
    # No running task has an expected end, so EASY backfill cannot reserve: every free card goes to later tasks.
    assert sorted(started(d)) == ["s0", "s1", "s2"]


def test_nonstrict_fifo_one_gpu_tasks_not_blocked_for_hours_behind_a_gang_head():
    """Replay: a stream of 1-GPU tasks behind an 8-GPU gang on a busy VDC (everything medium)."""

    def sim(policy):
        tasks = [
            SimTask(task(f"long{i}", "medium", gpu=5, expected_duration_s=6 * HOUR), 0.0, 6 * HOUR, 5) for i in (1, 2)
        ]
        tasks.append(SimTask(task("gang", "medium", gpu=8, expected_duration_s=HOUR, submit_time=1), 1.0, HOUR, 8))
        for i in range(40):
            t = 60.0 + i * 600
            tasks.append(SimTask(task(f"s{i}", "medium", expected_duration_s=900, submit_time=t), t, 900.0, 1))
        r = replay(policy, [node("n1", cards=8), node("n2", cards=8)], MODELS, _queues(policy), tasks)
        assert r.finished == len(tasks)
        return r

    fifo, nonstrict = sim(FIFO), sim(NONSTRICT_FIFO)
    # The gang needs a whole node, both are 5/8 busy for 6 h: under strict fifo every small task waits behind it.
    assert fifo.wait_p50["medium"] > 2 * HOUR
    assert nonstrict.wait_p50["medium"] < 60
    small_jct = [nonstrict.finish_times[f"s{i}"] - (60.0 + i * 600) for i in range(40)]
    assert max(small_jct) < 900 + 60
    # ... and the gang is not starved: it starts when the first long task ends (its node was kept for it).
    assert nonstrict.finish_times["gang"] == pytest.approx(7 * HOUR, abs=60)


def test_las_runs_a_short_job_ahead_of_a_long_one_that_has_run_a_lot():
    long_ = task("long", submit_time=1, attained_gpu_s=20 * HOUR)
    short = task("short", submit_time=5)
    busy = running(task("x", "high", gpu=3), [("n1", [0, 1, 2])])
    assert started(schedule(snap([node("n1")], [long_, short], [busy], qs=_queues(FIFO), now=10))) == ["long"]
    assert started(schedule(snap([node("n1")], [long_, short], [busy], qs=_queues(LAS), now=10))) == ["short"]


def test_las_levels_and_starvation_guard():
    t = task("t", gpu=2, submit_time=0)
    assert las_level(t, 10) == 0
    ran_s = LAS_THRESHOLDS_GPU_S[1] / 2  # on 2 GPUs: the top threshold, level 2
    big = task("t", gpu=2, submit_time=0, attained_gpu_s=LAS_THRESHOLDS_GPU_S[1])
    assert las_level(big, ran_s + 10) == 2
    # Waited (time since submission minus time run) more than twice its run time: promoted to level 0.
    assert las_level(big, ran_s + 2 * ran_s + 1) == 0
    a = task("a", submit_time=1, attained_gpu_s=2 * HOUR)
    b = task("b", submit_time=2, attained_gpu_s=3 * HOUR)  # same level as a: FIFO within the level
    c = task("c", submit_time=3)
    order = [x.id for x in queue_order(LAS, [b, c, a], lambda p: 0.0, now=4 * HOUR)]
    assert order == ["c", "a", "b"]


def test_las_demoted_running_task_is_preempted_by_a_new_short_task():
    """Tiresias: a running task whose attained service crossed a threshold gives way to a new task of its las
    queue in a higher level; a high task never does, nor a medium one inside its window, nor one just started."""
    qs = (Queue("high", "high", LAS), Queue("medium", "medium", LAS, window_floor_s=60), Queue("low", "low", LAS))
    hours = 2 * HOUR  # on 4 GPUs: 8 GPU-hours, level 1 of the default thresholds (1 and 10 GPU-hours)
    for cls in ("low", "medium"):
        old = task("old", cls, gpu=4, expected_duration_s=HOUR, submit_time=0)
        new = task("new", cls, gpu=1, expected_duration_s=600, submit_time=hours - 5)
        d = schedule(snap([node("n1")], [new], [running(old, [("n1", [0, 1, 2, 3])], window=HOUR)], qs=qs, now=hours))
        assert started(d) == ["new"] and [(p.task_id, p.reason) for p in d.preemptions] == [("old", "las_demotion")]
    # Medium inside its guaranteed window: not preempted.
    old = task("old", "medium", gpu=4, expected_duration_s=3 * HOUR, submit_time=0)
    new = task("new", "medium", gpu=1, expected_duration_s=600, submit_time=hours - 5)
    d = schedule(snap([node("n1")], [new], [running(old, [("n1", [0, 1, 2, 3])], window=3 * HOUR)], qs=qs, now=hours))
    assert not d.preemptions and not started(d)
    # A high task is never preempted, however much service it has.
    old = task("old", "high", gpu=4, submit_time=0)
    new = task("new", "high", gpu=1, submit_time=hours - 5)
    d = schedule(snap([node("n1")], [new], [running(old, [("n1", [0, 1, 2, 3])])], qs=qs, now=hours))
    assert not d.preemptions
    # Still in level 0 (under a GPU-hour): not demoted, not preempted.
    old = task("old", "low", gpu=4, submit_time=0)
    new = task("new", "low", gpu=1, submit_time=600)
    d = schedule(snap([node("n1")], [new], [running(old, [("n1", [0, 1, 2, 3])])], qs=qs, now=700))
    assert not d.preemptions
    # Per-queue thresholds: with a first threshold of 30 GPU-minutes the same task is demoted.
    low = dataclasses.replace(qs[2], las_thresholds_gpu_s=(1_800.0, 36_000.0))
    d = schedule(snap([node("n1")], [new], [running(old, [("n1", [0, 1, 2, 3])])], qs=(*qs[:2], low), now=700))
    assert [(p.task_id, p.reason) for p in d.preemptions] == [("old", "las_demotion")]
    # A fifo queue does not preempt for attained service.
    fifo = dataclasses.replace(qs[2], policy=FIFO)
    d = schedule(snap([node("n1")], [new], [running(old, [("n1", [0, 1, 2, 3])])], qs=(*qs[:2], fifo), now=hours))
    assert not d.preemptions
    # Anti-churn: a task preempted twice before is demoted only after 4 x 300 s of its current run.
    again = task("old", "low", gpu=4, submit_time=0, attained_gpu_s=hours * 4, preemptions=2)
    for ran, expect in ((1000.0, []), (1300.0, ["old"])):
        rt = running(again, [("n1", [0, 1, 2, 3])], started_at=hours - ran)
        d = schedule(snap([node("n1")], [task("new", "low", gpu=1, submit_time=hours - 5)], [rt], qs=qs, now=hours))
        assert [p.task_id for p in d.preemptions] == expect, ran
    with pytest.raises(ValueError, match="ascending"):
        Scheduler(snap([node("n1")], qs=(dataclasses.replace(low, las_thresholds_gpu_s=(10.0, 5.0)),)))


def test_sjf_orders_by_expected_duration_then_submit_time():
    ts = [
        task("none", submit_time=0),
        task("long", expected_duration_s=500, submit_time=1),
        task("short2", expected_duration_s=50, submit_time=3),
        task("short1", expected_duration_s=50, submit_time=2),
    ]
    assert [t.id for t in queue_order(SJF, ts, lambda p: 0.0)] == ["short1", "short2", "long", "none"]
    d = schedule(snap([node("n1", cards=1)], ts, qs=_queues(SJF)))
    assert started(d) == ["short1"]


def test_weighted_fair_share_splits_two_to_one_with_weights_two_to_one():
    queued = [task(f"a{i}", project="A", submit_time=i) for i in range(8)]
    queued += [task(f"b{i}", project="B", submit_time=i) for i in range(8)]
    quotas = [ProjectQuota("A", weight=2), ProjectQuota("B", weight=1)]
    nodes = [node("n1"), node("n2"), node("n3", cards=1)]  # 9 cards

    def split(policy):
        d = schedule(snap(nodes, queued, quotas=quotas, qs=_queues(policy)))
        return Counter(tid[0] for tid in started(d))

    assert split(FAIR_SHARE) == {"a": 6, "b": 3}
    assert split("drf") == {"a": 5, "b": 4} or split("drf") == {"a": 4, "b": 5}


def test_fair_share_weight_must_be_positive_and_policy_known():
    with pytest.raises(ValueError, match="weight must be > 0"):
        ProjectQuota("A", weight=0)
    with pytest.raises(ValueError, match="unknown policy 'lifo'"):
        schedule(snap([node("n1")], [task("t")], qs=_queues("lifo")))


def test_fgd_learns_its_target_from_a_rolling_window_of_submissions():
    s = Scheduler(snap([node("n1"), node("n2")], [], now=0, node_scorer="fgd"))
    assert s.fgd_uses_default
    for i in range(5):
        s.submit(task(f"t{i}", gpu=0.5))
    s.cycle(1.0)
    assert not s.fgd_uses_default and s.fgd_default_cycles == 0
    assert len(s.fgd_window) == 5
    # Bounded: the window keeps only the most recent requests.
    s2 = Scheduler(snap([node("n1")], [], now=0, node_scorer="fgd"))
    for i in range(s2.fgd_window.maxlen + 10):
        s2.submit(task(f"u{i}", gpu=1))
    assert len(s2.fgd_window) == s2.fgd_window.maxlen


def test_fgd_configured_workload_wins_and_an_empty_cycle_counts_as_default():
    from apps.queues.engine import WorkloadShape

    s = Scheduler(snap([node("n1")], [], now=0, node_scorer="fgd"))
    s.cycle(0.0)
    assert s.fgd_uses_default and s.fgd_default_cycles == 1
    wl = (WorkloadShape(1.0, 1.0, 1.0, 2.0),)
    s = Scheduler(snap([node("n1")], [], now=0, node_scorer="fgd", fgd_workload=wl))
    s.submit(task("t", gpu=0.5))
    s.cycle(0.0)
    assert not s.fgd_uses_default and s.fgd_default_cycles == 0 and not s.fgd_window


def test_simulator_warns_when_fgd_ran_on_the_default_workload():
    from apps.queues.engine import VdcSettings

    tasks = [SimTask(task("t", expected_duration_s=10), 0.0, 10.0, 1)]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        r = replay("fgd", [node("n1")], MODELS, _queues(FIFO), tasks, VdcSettings(node_scorer="fgd"))
    assert r.fgd_default_cycles == 0 and not [w for w in caught if "FGD" in str(w.message)]
    # Only invalid requests (a model the catalog lacks): nothing to learn from, the default mix is all there is.
    bad = [SimTask(task("bad", models=("H100",), expected_duration_s=10), 0.0, 10.0, 1)]
    with pytest.warns(UserWarning, match="FGD"):
        r = replay("fgd", [node("n1")], MODELS, _queues(FIFO), bad, VdcSettings(node_scorer="fgd"))
    assert r.fgd_default_cycles >= 1


def _preempt_sim(checkpoint, overhead=0.0):
    low = SimTask(task("low", "low", expected_duration_s=1000), 0.0, 1000.0, 1, checkpoint_s=checkpoint)
    hi = SimTask(task("hi", expected_duration_s=100, submit_time=700), 700.0, 100.0, 1)
    return replay(
        "p", [node("n1", cards=1)], MODELS, _queues(FIFO), [low, hi], restart_overhead_s=overhead, cycle_interval=0
    )


def test_simulator_preemption_loses_work_since_the_last_checkpoint():
    # No checkpoints: the 700 s the low task ran are lost; it restarts at 800 and needs 1000 s again.
    r = _preempt_sim(None)
    assert r.preemptions == 1 and r.lost_gpu_hours == pytest.approx(700 / HOUR)
    assert r.finish_times["low"] == pytest.approx(1800.0)
    # Checkpoints every 300 s: 600 s are kept, 100 s lost, 400 s left after the restart.
    r = _preempt_sim(300.0)
    assert r.lost_gpu_hours == pytest.approx(100 / HOUR)
    assert r.finish_times["low"] == pytest.approx(1200.0)
    # A restart overhead is paid on every restart and counted as lost.
    r = _preempt_sim(300.0, overhead=60.0)
    assert r.finish_times["low"] == pytest.approx(1260.0)
    assert r.lost_gpu_hours == pytest.approx(160 / HOUR)


def test_simulator_keeps_attained_service_for_las():
    low = SimTask(task("low", "low", expected_duration_s=1000), 0.0, 1000.0, 1, checkpoint_s=100.0)
    hi = SimTask(task("hi", expected_duration_s=100, submit_time=500), 500.0, 100.0, 1)
    seen = {}

    class Spy(Scheduler):
        def cycle(self, now):
            if "low" in self.queued:
                seen[now] = self.queued["low"].attained_gpu_s
            return super().cycle(now)

    from apps.queues.engine import sim

    original = sim.Scheduler
    sim.Scheduler = Spy
    try:
        replay("p", [node("n1", cards=1)], MODELS, _queues(FIFO), [low, hi])
    finally:
        sim.Scheduler = original
    assert seen[600.0] == pytest.approx(500.0)


def test_quota_weight_is_resources_independent():
    assert ProjectQuota("A", Resources(gpu=1)).weight == 1.0


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(snapshots(), st.sampled_from([NONSTRICT_FIFO, LAS, SJF, FAIR_SHARE]))
def test_new_policies_keep_the_invariants(s, policy):
    s = dataclasses.replace(s, queues=tuple(dataclasses.replace(q, policy=policy) for q in s.queues))
    d = schedule(s)
    assert d == schedule(s)
    dev_use: dict = {}
    cpu_use: dict = {}
    for t, pl in _final_allocation(s, d):
        cpu_use[pl.node_id] = cpu_use.get(pl.node_id, 0) + t.cpu
        for share in pl.devices:
            dev_use[share.device_id] = dev_use.get(share.device_id, 0) + share.milli
    assert all(v <= 1000 for v in dev_use.values())
    assert all(v <= 16 + 1e-9 for v in cpu_use.values())
    assert {x.task_id for x in d.starts} | {w.task_id for w in d.waiting} == {t.id for t in s.queued}
    classes = {q.id: q.priority_class for q in s.queues}
    running = {rt.task.id: rt for rt in s.running}
    assert all(classes[running[p.task_id].task.queue_id] != "high" for p in d.preemptions)
