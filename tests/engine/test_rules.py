"""One test per scheduling rule of docs/rules.md (priority classes, queue policies, quotas, gangs, preemption)."""

from __future__ import annotations

from decimal import Decimal

import pytest

from apps.queues.engine import (
    GpuRequest,
    ProjectQuota,
    Queue,
    Reason,
    Resources,
    Scheduler,
    schedule,
)
from apps.queues.engine.model import speedup

from .builders import node, preempted, queues, running, snap, started, task, waiting


def test_high_is_considered_before_medium_and_low():
    d = schedule(
        snap(
            [node("n1", cards=1)],
            [
                task("low", "low", submit_time=0),
                task("med", "medium", submit_time=1, expected_duration_s=100),
                task("hi", "high", submit_time=2),
            ],
        )
    )
    assert started(d) == ["hi"]
    assert waiting(d)["med"].reason == Reason.INSUFFICIENT_CAPACITY


def test_high_preempts_low():
    low = task("low", "low")
    d = schedule(snap([node("n1", cards=1)], [task("hi")], [running(low, [("n1", [0])])]))
    assert preempted(d) == ["low"]
    assert started(d) == ["hi"]
    p = d.preemptions[0]
    assert p.by_task_id == "hi" and p.reason == "higher_class" and p.requeue


def test_high_never_preempted():
    other = task("other-high", "high")
    d = schedule(snap([node("n1", cards=1)], [task("hi", submit_time=5)], [running(other, [("n1", [0])])]))
    assert preempted(d) == []
    assert waiting(d)["hi"].reason == Reason.INSUFFICIENT_CAPACITY


def test_high_preempts_medium_only_after_its_window():
    med = task("med", "medium", expected_duration_s=1000)
    inside = snap([node("n1", cards=1)], [task("hi")], [running(med, [("n1", [0])], started_at=0)], now=500)
    assert preempted(schedule(inside)) == []
    after = snap([node("n1", cards=1)], [task("hi")], [running(med, [("n1", [0])], started_at=0)], now=1500)
    assert preempted(schedule(after)) == ["med"]


def test_medium_preempted_after_window_requeues_with_half_window():
    med = task("med", "medium", expected_duration_s=1000)
    d = schedule(snap([node("n1", cards=1)], [task("hi")], [running(med, [("n1", [0])], started_at=0)], now=1001))
    assert d.preemptions[0].new_window_s == 500
    # The next run is guaranteed for the halved window only.
    requeued = task("med", "medium", expected_duration_s=1000, window_s=500)
    again = snap([node("n1", cards=1)], [task("hi2")], [running(requeued, [("n1", [0])], started_at=2000)], now=2501)
    d2 = schedule(again)
    assert preempted(d2) == ["med"]
    assert d2.preemptions[0].new_window_s == 250


def test_medium_window_halving_stops_at_queue_floor():
    med = task("med", "medium", expected_duration_s=1000, window_s=60)
    d = schedule(snap([node("n1", cards=1)], [task("hi")], [running(med, [("n1", [0])], started_at=0)], now=61))
    assert d.preemptions[0].new_window_s == 50  # floor of the medium queue in the builders


def test_halving_never_lengthens_a_window_shorter_than_the_floor():
    # A 90 s window with a 600 s floor became 600 s ("halved"); the floor only stops the halving.
    med = task("med", "medium", expected_duration_s=90)
    floor = (Queue("high", "high"), Queue("medium", "medium", window_floor_s=600), Queue("low", "low"))
    d = schedule(
        snap([node("n1", cards=1)], [task("hi")], [running(med, [("n1", [0])], started_at=0)], now=91, qs=floor)
    )
    assert d.preemptions[0].new_window_s == 90


def test_medium_start_carries_its_window():
    d = schedule(snap([node("n1")], [task("med", "medium", expected_duration_s=800, window_s=400)]))
    assert d.starts[0].window_s == 400


def test_medium_preempts_low_but_not_expired_medium():
    low = task("low", "low")
    d = schedule(
        snap([node("n1", cards=1)], [task("m2", "medium", expected_duration_s=10)], [running(low, [("n1", [0])])])
    )
    assert preempted(d) == ["low"]
    med = task("m1", "medium", expected_duration_s=10)
    d2 = schedule(
        snap(
            [node("n1", cards=1)],
            [task("m2", "medium", expected_duration_s=10)],
            [running(med, [("n1", [0])], started_at=0)],
            now=1000,
        )
    )
    assert preempted(d2) == []


def test_medium_without_expected_duration_is_rejected():
    d = schedule(snap([node("n1")], [task("med", "medium")]))
    assert started(d) == []
    assert waiting(d)["med"].reason == Reason.INVALID_REQUEST


def test_low_runs_only_on_idle_capacity():
    d = schedule(snap([node("n1", cards=2)], [task("low", "low")]))
    assert started(d) == ["low"]


def _high_waits_for_its_room(low):
    # The high task needs 2 cards on one node; one is held by another high task, so it waits.
    other = task("h0")
    return schedule(
        snap([node("n1", cards=2)], [task("hi", gpu=2, submit_time=1), low], [running(other, [("n1", [0])])])
    )


def test_low_is_not_restarted_while_high_waits_for_its_room():
    # docs/rules.md#priority-classes: a preempted low task is "started again only when no high or medium task that
    # could use those
    # resources is waiting".
    d = _high_waits_for_its_room(task("low", "low", submit_time=0, preemptions=1))
    assert started(d) == []
    assert waiting(d)["low"].reason == Reason.WAITING_FOR_HIGHER_CLASS


def test_low_never_preempted_takes_idle_cards_a_waiting_high_task_cannot_use_yet():
    # Low runs on otherwise idle capacity: the high task cannot start on the free card (its other card is held by
    # high work), so a low task that was never preempted may use it until the high task can start, and is preempted
    # then. Before this rule the card stayed idle, which cost the synthetic workload's low jobs most of their wait.
    d = _high_waits_for_its_room(task("low", "low", submit_time=0))
    assert started(d) == ["low"]
    assert waiting(d)["hi"].reason == Reason.INSUFFICIENT_CAPACITY


def test_non_preemptible_low_task_does_not_take_cards_a_waiting_high_task_needs():
    # It could not be suspended when the high task can start, so it keeps off as before.
    d = _high_waits_for_its_room(task("low", "low", submit_time=0, preemptible=False))
    assert started(d) == []
    assert waiting(d)["low"].reason == Reason.WAITING_FOR_HIGHER_CLASS


def test_kept_scheduler_counts_preemptions_so_a_suspended_low_task_waits_for_high_work():
    sched = Scheduler(snap([node("n1", cards=1)], [task("low", "low", submit_time=0)], now=0))
    assert started(sched.cycle(0)) == ["low"]
    sched.submit(task("hi", submit_time=1))
    d = sched.cycle(10)
    assert started(d) == ["hi"] and preempted(d) == ["low"]
    assert sched.queued["low"].preemptions == 1


def test_low_starts_when_waiting_high_needs_another_model():
    other = task("h0", models=["A100-80G"])
    d = schedule(
        snap(
            [node("n1", cards=1), node("n2", model="T4", cards=1)],
            [task("hi", models=["A100-80G"]), task("low", "low", models=["T4"])],
            [running(other, [("n1", [0])])],
        )
    )
    assert started(d) == ["low"]


def test_fifo_orders_by_submit_time():
    d = schedule(snap([node("n1", cards=1)], [task("late", submit_time=9), task("early", submit_time=1)]))
    assert started(d) == ["early"]
    assert waiting(d)["late"].position == 1


def test_fifo_head_blocks_later_tasks_of_the_same_model():
    d = schedule(
        snap([node("n1", cards=2)], [task("big", gpu=4, submit_time=0, instances=1), task("small", submit_time=1)])
    )
    # "big" cannot ever fit on a 2-card node, so it does not block anyone.
    assert started(d) == ["small"]
    busy = running(task("h0"), [("n1", [0])])
    d2 = schedule(snap([node("n1", cards=2)], [task("two", gpu=2, submit_time=0), task("one", submit_time=1)], [busy]))
    assert started(d2) == []
    assert waiting(d2)["one"].reason == Reason.QUEUE_ORDER


def test_drf_orders_projects_by_dominant_share():
    qs = (Queue("high", "high", policy="drf"), Queue("medium", "medium"), Queue("low", "low"))
    heavy = running(task("r1", project="heavy"), [("n1", [0])])
    d = schedule(
        snap(
            [node("n1", cards=2)],
            [task("h-new", project="heavy", submit_time=0), task("l-new", project="light", submit_time=5)],
            [heavy],
            qs=qs,
        )
    )
    assert started(d) == ["l-new"]


def test_drf_ties_break_by_submit_time():
    qs = (Queue("high", "high", policy="drf"), Queue("medium", "medium"), Queue("low", "low"))
    d = schedule(
        snap(
            [node("n1", cards=1)],
            [task("b", project="pb", submit_time=2), task("a", project="pa", submit_time=1)],
            qs=qs,
        )
    )
    assert started(d) == ["a"]


def _backfill_queues():
    return (Queue("high", "high", policy="backfill"), Queue("medium", "medium"), Queue("low", "low"))


def test_backfill_does_not_delay_reservation():
    # Two nodes: n1 busy until t=200 (expected), n2 has 2 of 4 cards busy for a long time.
    r1 = running(task("r1", gpu=4, expected_duration_s=200), [("n1", [0, 1, 2, 3])], started_at=0)
    r2 = running(task("r2", gpu=2, expected_duration_s=10_000), [("n2", [0, 1])], started_at=0)
    head = task("head", gpu=4, submit_time=0)
    long_small = task("long", gpu=2, submit_time=1, expected_duration_s=5000)
    d = schedule(snap([node("n1"), node("n2")], [head, long_small], [r1, r2], now=100, qs=_backfill_queues()))
    # "long" fits on n2 right now, which the head does not need: it starts.
    assert started(d) == ["long"]
    # If the only room is on the head's reserved node, a long task waits for the reservation.
    r2b = running(task("r2", gpu=4, expected_duration_s=10_000), [("n2", [0, 1, 2, 3])], started_at=0)
    r1b = running(task("r1", gpu=2, expected_duration_s=200), [("n1", [0, 1])], started_at=0)
    d2 = schedule(snap([node("n1"), node("n2")], [head, long_small], [r1b, r2b], now=100, qs=_backfill_queues()))
    assert started(d2) == []
    assert waiting(d2)["long"].reason == Reason.WAITING_FOR_RESERVATION


def test_backfill_starts_short_task_that_ends_before_reservation():
    r1b = running(task("r1", gpu=2, expected_duration_s=200), [("n1", [0, 1])], started_at=0)
    head = task("head", gpu=4, submit_time=0)
    short = task("short", gpu=2, submit_time=1, expected_duration_s=50)
    d = schedule(snap([node("n1")], [head, short], [r1b], now=100, qs=_backfill_queues()))
    assert started(d) == ["short"]


def test_quota_limit_is_never_exceeded_when_enforced():
    q = ProjectQuota("p1", limit=Resources(100, 1000, 1.0))
    d = schedule(snap([node("n1")], [task("a", submit_time=0), task("b", submit_time=1)], quotas=[q]))
    assert started(d) == ["a"]
    assert waiting(d)["b"].reason == Reason.QUOTA_EXCEEDED


def test_advisory_quota_does_not_block():
    q = ProjectQuota("p1", limit=Resources(100, 1000, 1.0), enforce=False, max_concurrent=1)
    d = schedule(snap([node("n1")], [task("a", submit_time=0), task("b", submit_time=1)], quotas=[q]))
    assert started(d) == ["a", "b"]


def test_quota_counts_gpu_equivalents():
    # 2 T4 = 0.5 equivalents: fits a 0.5 limit although it is two cards.
    q = ProjectQuota("p1", limit=Resources(100, 1000, 0.5))
    d = schedule(snap([node("n1", model="T4")], [task("a", gpu=2, models=["T4"])], quotas=[q]))
    assert started(d) == ["a"]


def test_max_concurrent_tasks():
    q = ProjectQuota("p1", max_concurrent=1)
    d = schedule(snap([node("n1")], [task("a", submit_time=0), task("b", submit_time=1)], quotas=[q]))
    assert waiting(d)["b"].reason == Reason.MAX_CONCURRENT


def test_max_tasks_per_kind():
    q = ProjectQuota("p1", max_per_kind={"inference": 1})
    d = schedule(
        snap(
            [node("n1")],
            [
                task("a", kind="inference", submit_time=0),
                task("b", kind="inference", submit_time=1),
                task("c", submit_time=2),
            ],
            quotas=[q],
        )
    )
    assert started(d) == ["a", "c"]
    assert waiting(d)["b"].reason == Reason.KIND_LIMIT


def test_budget_exhausted_blocks_new_starts():
    q = ProjectQuota("p1", budget_exhausted=True)
    d = schedule(snap([node("n1")], [task("a")], quotas=[q]))
    assert waiting(d)["a"].reason == Reason.BUDGET_EXHAUSTED


def test_borrowed_usage_is_reclaimed_for_project_below_guarantee():
    quotas = [
        ProjectQuota("poor", guaranteed=Resources(0, 0, 2.0)),
        ProjectQuota("rich", guaranteed=Resources(0, 0, 1.0)),
    ]
    old = running(task("old", "low", project="rich"), [("n1", [0])], started_at=0)
    new = running(task("new", "low", project="rich"), [("n1", [1])], started_at=50)
    # Both have run longer than the queue's minimum run before a reclaim (300 s by default).
    d = schedule(
        snap([node("n1", cards=2)], [task("mine", "low", project="poor")], [old, new], quotas=quotas, now=1000)
    )
    # Same class, so only the reclaim rule applies; the most recently started goes.
    assert preempted(d) == ["new"]
    assert d.preemptions[0].reason == "quota_reclaim"
    assert started(d) == ["mine"]


def test_no_reclaim_from_project_within_its_guarantee():
    quotas = [
        ProjectQuota("poor", guaranteed=Resources(0, 0, 2.0)),
        ProjectQuota("rich", guaranteed=Resources(0, 0, 2.0)),
    ]
    old = running(task("old", "low", project="rich"), [("n1", [0])], started_at=0)
    d = schedule(snap([node("n1", cards=1)], [task("mine", "low", project="poor")], [old], quotas=quotas))
    assert preempted(d) == []


def test_queue_never_exceeds_max_capacity():
    qs = (Queue("high", "high", max_gpu=1.0), Queue("medium", "medium"), Queue("low", "low"))
    d = schedule(snap([node("n1")], [task("a", submit_time=0), task("b", submit_time=1)], qs=qs))
    assert started(d) == ["a"]
    assert waiting(d)["b"].reason == Reason.QUEUE_CAPACITY


def test_queue_guarantee_reclaims_borrowed_capacity():
    qs = (Queue("high", "high"), Queue("low", "low", guaranteed_gpu=1.0), Queue("low2", "low"))
    other = running(task("other", "low2"), [("n1", [0])])
    d = schedule(snap([node("n1", cards=1)], [task("mine", "low")], [other], qs=qs, now=1000))
    assert preempted(d) == ["other"]
    assert d.preemptions[0].reason == "queue_reclaim"


def test_gang_never_partially_starts():
    d = schedule(snap([node("n1", cards=2), node("n2", cards=2)], [task("gang", gpu=2, instances=3)]))
    assert started(d) == []
    d2 = schedule(snap([node("n1", cards=2), node("n2", cards=2)], [task("gang", gpu=2, instances=2)]))
    assert len(d2.starts[0].placements) == 2


def test_gang_runs_in_one_cluster():
    from apps.queues.engine import Cluster

    clusters = [Cluster("c1"), Cluster("c2")]
    nodes = [node("a", cluster="c1", cards=2), node("b", cluster="c2", cards=2)]
    d = schedule(snap(nodes, [task("gang", gpu=2, instances=2)], clusters=clusters))
    assert started(d) == []


def test_preempting_a_gang_takes_the_whole_gang():
    gang = task("gang", "low", instances=2)
    d = schedule(
        snap([node("n1", cards=1), node("n2", cards=1)], [task("hi")], [running(gang, [("n1", [0]), ("n2", [0])])])
    )
    assert preempted(d) == ["gang"]


def test_elastic_starts_at_min_and_grows_into_idle_capacity():
    t = task("el", min_replicas=2, max_replicas=6)
    d = schedule(snap([node("n1")], [t]))
    assert started(d) == ["el"]
    assert len(d.starts[0].placements) == 4  # started with 2, grew into the 2 idle cards


def test_elastic_does_not_grow_into_capacity_others_wait_for():
    hold = running(task("hold", gpu=3), [("n1", [0, 1, 2])])
    d = schedule(
        snap(
            [node("n1")],
            [task("el", submit_time=0, min_replicas=1, max_replicas=4), task("big", gpu=2, submit_time=1)],
            [hold],
        )
    )
    assert len(d.starts[0].placements) == 1


def test_elastic_shrinks_before_preempting():
    el = task("el", "low", min_replicas=1, max_replicas=4)
    lone = task("lone", "low")
    rts = [
        running(el, [("n1", [0]), ("n1", [1]), ("n1", [2])], started_at=10),
        running(lone, [("n1", [3])], started_at=90),
    ]
    d = schedule(snap([node("n1")], [task("hi")], rts))
    assert preempted(d) == []
    assert d.resizes[0].task_id == "el" and d.resizes[0].replicas == 2
    assert started(d) == ["hi"]


def test_elastic_task_with_a_better_speed_up_curve_grows_first():
    # Two running elastic tasks on one replica each, two idle cards: the newer one scales almost linearly
    # (scaling 0.99), the older one poorly (0.5: two replicas run 1.33x as fast as one). Both cards go to the
    # newer one (its marginal speed-up per GPU stays the higher), not to the oldest as before.
    poor = task("poor", "low", min_replicas=1, max_replicas=4, scaling=0.5)
    good = task("good", "low", min_replicas=1, max_replicas=4, scaling=0.99)
    rts = [
        running(poor, [("n1", [0])], started_at=10),
        running(good, [("n1", [1])], started_at=20),
    ]
    d = schedule(snap([node("n1")], [], rts))
    assert {r.task_id: r.replicas for r in d.resizes} == {"good": 3}
    # The default curve (DEFAULT_SCALING) is sub-linear: with no hint the two alternate by marginal gain.
    rts = [
        running(task("a", "low", min_replicas=1, max_replicas=4), [("n1", [0])], started_at=10),
        running(task("b", "low", min_replicas=1, max_replicas=4), [("n1", [1])], started_at=20),
    ]
    d = schedule(snap([node("n1")], [], rts))
    assert {r.task_id: r.replicas for r in d.resizes} == {"a": 2, "b": 2}
    assert speedup(task("x"), 2) < 2 and speedup(task("x", scaling=1.0), 8) == pytest.approx(8)
    # Shrinking for a waiting task takes the replica that costs the least speed-up per GPU.
    rts = [
        running(poor, [("n1", [0]), ("n1", [1])], started_at=10),
        running(good, [("n1", [2]), ("n1", [3])], started_at=20),
    ]
    d = schedule(snap([node("n1")], [task("hi")], rts))
    assert [(r.task_id, r.replicas) for r in d.resizes] == [("poor", 1)] and started(d) == ["hi"]


def test_preemption_prefers_low_over_expired_medium():
    low = task("low", "low")
    med = task("med", "medium", expected_duration_s=10)
    rts = [running(med, [("n1", [0])], started_at=0), running(low, [("n1", [1])], started_at=50)]
    d = schedule(snap([node("n1", cards=2)], [task("hi")], rts))
    assert preempted(d) == ["low"]


def test_preemption_loses_least_work():
    rts = [
        running(task("old", "low"), [("n1", [0])], started_at=0),
        running(task("new", "low"), [("n1", [1])], started_at=90),
    ]
    d = schedule(snap([node("n1", cards=2)], [task("hi")], rts))
    assert preempted(d) == ["new"]


def test_preemption_picks_smallest_victim_set():
    # One low task holds 2 cards on n1, two low tasks hold one card each on n2.
    rts = [
        running(task("big", "low", gpu=2), [("n1", [0, 1])], started_at=99),
        running(task("s1", "low"), [("n2", [0])], started_at=10),
        running(task("s2", "low"), [("n2", [1])], started_at=10),
    ]
    d = schedule(snap([node("n1", cards=2), node("n2", cards=2)], [task("hi", gpu=2)], rts))
    assert preempted(d) == ["big"]


def test_never_preempts_to_start_a_task_that_still_would_not_fit():
    rts = [running(task("low", "low"), [("n1", [0])]), running(task("h0"), [("n1", [1])])]
    d = schedule(snap([node("n1", cards=2)], [task("hi", gpu=2)], rts))
    assert preempted(d) == []
    assert started(d) == []


def test_waiting_tasks_get_position_estimate_and_reason():
    r = running(task("r", gpu=4, expected_duration_s=300), [("n1", [0, 1, 2, 3])], started_at=0)
    d = schedule(
        snap(
            [node("n1")],
            [task("a", gpu=4, submit_time=0, expected_duration_s=100), task("b", gpu=4, submit_time=1)],
            [r],
            now=100,
        )
    )
    w = waiting(d)
    assert (w["a"].position, w["b"].position) == (1, 2)
    assert w["a"].estimated_start == 300
    assert w["b"].estimated_start == 400
    # A high task that finds no room holds a reservation.
    assert w["a"].reason == Reason.HOLDS_RESERVATION and w["a"].message


def test_no_matching_gpu_model_reason():
    d = schedule(snap([node("n1")], [task("a", models=["H200"])]))
    assert waiting(d)["a"].reason == Reason.NO_MATCHING_GPU_MODEL


def test_vendor_neutral_request_picks_model_and_count():
    # tflops-fp16=250 on V100 (125 each) = 2 cards; A100 needs 1 (312).
    t = task("a", gpu=0)
    t = t.__class__(**{**{f: getattr(t, f) for f in t.__slots__}, "gpu": GpuRequest(min_tflops_fp16=250)})
    d = schedule(snap([node("n1", model="V100")], [t]))
    assert [s.gpu_model for s in d.starts[0].placements] == ["V100"]
    assert len(d.starts[0].placements[0].devices) == 2


def test_parsed_gpu_request_with_decimal_count_is_accepted():
    class Parsed:  # what apps.clusters.gpuspec.GPURequest looks like
        count = Decimal("0.5")
        models = ("T4",)
        shared = True
        vram_gib = cores_percent = min_vram_gib = min_tflops_fp16 = min_tflops_fp32 = None

    t = task("a", gpu=0)
    t = t.__class__(**{**{f: getattr(t, f) for f in t.__slots__}, "gpu": Parsed()})
    d = schedule(snap([node("n1", model="T4")], [t]))
    assert d.starts[0].placements[0].devices[0].milli == 500


def test_sharing_form_sizes_the_share_by_card():
    t = task("a", gpu=0)
    t = t.__class__(**{**{f: getattr(t, f) for f in t.__slots__}, "gpu": GpuRequest(1, ("A100-80G",), True, 16, 50)})
    d = schedule(snap([node("n1")], [t]))
    assert d.starts[0].placements[0].devices[0].milli == 500  # max(16/80, 50%)


def test_scheduler_keeps_state_between_cycles():
    s = Scheduler(snap([node("n1", cards=1)], [task("a", submit_time=0), task("b", submit_time=1)]))
    d1 = s.cycle(0)
    assert started(d1) == ["a"]
    s.finish("a")
    d2 = s.cycle(10)
    assert started(d2) == ["b"]


def test_same_queue_class_queues_take_turns():
    qs = queues() + (Queue("high2", "high"),)
    d = schedule(
        snap(
            [node("n1", cards=2)],
            [task("a1", submit_time=0), task("a2", submit_time=1), task("b1", "high2", submit_time=5)],
            qs=qs,
        )
    )
    assert sorted(started(d)) == ["a1", "b1"]


def test_requests_from_the_gpu_spec_parser_are_understood():
    from apps.clusters.gpuspec import parse_gpu_spec

    def placed(spec, model="A100-80G"):
        t = task("a", gpu=0)
        t = t.__class__(**{**{f: getattr(t, f) for f in t.__slots__}, "gpu": parse_gpu_spec(spec)})
        d = schedule(snap([node("n1", model=model)], [t]))
        return [[(sh.device_id, sh.milli) for sh in p.devices] for p in d.starts[0].placements] if d.starts else None

    assert placed("2") == [[("n1/0", 1000), ("n1/1", 1000)]]
    assert placed("0.25") == [[("n1/0", 250)]]
    assert placed("1(16G,50%)") == [[("n1/0", 500)]]
    assert placed("1(vgpu)", model="V100") is None  # V100 is not shareable in the builders' catalog
    # vram=100Gi in total: two 80 GiB cards.
    assert placed("vram=100Gi") == [[("n1/0", 1000), ("n1/1", 1000)]]


def test_vdc_cap_is_never_exceeded():
    d = schedule(
        snap([node("n1")], [task("a", submit_time=0), task("b", submit_time=1)], cap=Resources(100, 1000, 1.0))
    )
    assert started(d) == ["a"]
    assert waiting(d)["b"].reason == Reason.VDC_CAPACITY


def test_non_preemptible_low_task_is_not_a_victim():
    low = task("low", "low", preemptible=False)
    d = schedule(snap([node("n1", cards=1)], [task("hi")], [running(low, [("n1", [0])])]))
    assert preempted(d) == []


def test_quota_priority_orders_a_queue_ahead_of_submit_time():
    # ProjectQuota.priority reached no decision. A higher-priority project goes first in its queue.
    quotas = [ProjectQuota("p1", priority=0), ProjectQuota("p2", priority=5)]
    tasks = [task("early-p1", project="p1", submit_time=0), task("late-p2", project="p2", submit_time=9)]
    d = schedule(snap([node("n1", cards=1)], tasks, quotas=quotas))
    assert started(d) == ["late-p2"]
    # Equal priorities keep submit order.
    even = [ProjectQuota("p1", priority=3), ProjectQuota("p2", priority=3)]
    assert started(schedule(snap([node("n1", cards=1)], tasks, quotas=even))) == ["early-p1"]


def test_quota_priority_breaks_drf_ties():
    qs = [Queue("high", "high", policy="drf")]
    quotas = [ProjectQuota("p1", priority=0), ProjectQuota("p2", priority=1)]
    tasks = [task("a", project="p1", submit_time=0), task("b", project="p2", submit_time=5)]
    d = schedule(snap([node("n1", cards=1)], tasks, quotas=quotas, qs=qs))
    assert started(d) == ["b"]  # both shares 0: the higher priority goes first


def test_a_lower_priority_projects_low_work_is_preempted_first():
    quotas = [ProjectQuota("p1", priority=2), ProjectQuota("p2", priority=0), ProjectQuota("p3")]
    important = running(task("important", "low", project="p1"), [("n1", [0])], started_at=90)
    ordinary = running(task("ordinary", "low", project="p2"), [("n1", [1])], started_at=10)
    # Without priorities the task that lost least work (important: started later) would go.
    d = schedule(snap([node("n1", cards=2)], [task("hi", project="p3")], [important, ordinary], quotas=quotas))
    assert preempted(d) == ["ordinary"]
    plain = [ProjectQuota("p1"), ProjectQuota("p2"), ProjectQuota("p3")]
    assert preempted(
        schedule(snap([node("n1", cards=2)], [task("hi", project="p3")], [important, ordinary], quotas=plain))
    ) == ["important"]
