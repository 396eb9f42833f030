"""The independent reference policies of benchmarks.policy_quality and its synthetic workload generator."""

from __future__ import annotations

import pytest

from apps.queues.engine import Task
from apps.queues.engine.sim import SimTask
from benchmarks.generators import GENERATORS, build
from benchmarks.policy_quality import elastic_reference, reference, synthetic_jobs

AVG, PREEMPT, LOST = 2, 10, 11


def _job(jid, arrival, duration, gpu=1, checkpoint=None):
    return SimTask(Task(jid, "p", "high", submit_time=arrival), arrival, duration, float(gpu), checkpoint)


def test_reference_sjf_runs_the_shortest_waiting_job_first():
    jobs = [_job("a", 0, 1000), _job("b", 1, 500), _job("c", 2, 100)]
    row, avg = reference("sjf", [1], jobs, 0.0, 0.0)
    # a runs first (alone); then c (100 s), then b.
    assert avg == pytest.approx((1000 + 1098 + 1599) / 3)
    assert row[:2] == [3, 3] and row[PREEMPT] == 0


def test_reference_easy_backfills_only_what_does_not_delay_the_head():
    jobs = [_job("a", 0, 1000), _job("b", 1, 100, gpu=3), _job("c", 2, 500), _job("d", 3, 2000)]
    _row, avg = reference("easy", [3], jobs, 0.0, 0.0)
    # b reserves the node at 1000; c ends before that and runs at once, d would delay b and waits.
    assert avg == pytest.approx((1000 + 1099 + 500 + 3097) / 4)


def test_reference_las_preempts_the_long_served_job_for_a_new_one():
    jobs = [_job("long", 0, 10_000), _job("short", 4000, 100)]
    row, avg = reference("las", [1], jobs, 0.0, 0.0, suspend=True)
    assert row[PREEMPT] == 1 and row[LOST] == 0
    assert avg == pytest.approx((100 + 10_100) / 2)
    # Lossy preemption without checkpoints: the 4,000 s already run are lost and run again.
    row, avg = reference("las", [1], jobs, 0.0, 0.0)
    assert row[LOST] == pytest.approx(4000 / 3600)
    assert avg == pytest.approx((100 + 14_100) / 2)


def test_synthetic_workload_is_deterministic_bursty_and_heavy_tailed():
    a = synthetic_jobs(600, 64, seed=5)
    assert [(s.task.id, s.arrival, s.duration) for s in a] == [
        (s.task.id, s.arrival, s.duration) for s in synthetic_jobs(600, 64, seed=5)
    ]
    assert {s.gpu for s in a} == {1.0, 2.0, 4.0, 8.0}
    assert len({s.task.project_id for s in a}) == 4
    durations = sorted(s.duration for s in a)
    assert durations[-1] > 20 * durations[len(durations) // 2]  # heavy tail: max >> median
    gaps = [b.arrival - x.arrival for x, b in zip(a, a[1:], strict=False)]
    assert sum(1 for g in gaps if g == pytest.approx(2.0)) > 30  # sweeps: jobs 2 s apart


def test_reference_elastic_gives_spare_cards_to_the_best_marginal_speed_up():
    def job(jid, duration, scaling):
        t = Task(jid, "p", "medium", min_replicas=1, max_replicas=4, scaling=scaling)
        return SimTask(t, 0.0, duration, 1.0)

    # Four cards: both start on one; the two spare go to the linear job (3x), which ends at 1000. The poor job
    # (parallel fraction 0.5) has 1000 s of its 2000 left and runs on four at 1.6x: it ends at 1625.
    _row, avg = elastic_reference([job("linear", 3000.0, 1.0), job("poor", 2000.0, 0.5)], 4)
    assert avg == pytest.approx((1000 + 1625) / 2)


@pytest.mark.parametrize("name", GENERATORS)
def test_generated_workloads_are_deterministic_and_offer_their_kinds_of_jobs(name):
    _nodes, _models, a = build(name, 200, seed=3)
    _n, _m, b = build(name, 200, seed=3)
    assert [(s.task.id, s.arrival, s.duration, s.gpu) for s in a] == [
        (s.task.id, s.arrival, s.duration, s.gpu) for s in b
    ]
    assert len(a) == 200 and all(x.arrival <= y.arrival for x, y in zip(a, a[1:], strict=False))
    durations = sorted(s.duration for s in a)
    assert durations[-1] > 5 * durations[len(durations) // 2]  # heavy-tailed
    classes = {s.task.queue_id for s in a}
    if name == "pollux":
        assert all(s.task.max_replicas == 8 and s.task.scaling is not None for s in a)
    else:
        assert "high" in classes and "medium" in classes
    if name == "pai":
        assert any(s.gpu < 1 for s in a)
    if name == "stream":
        assert {s.gpu for s in a if s.task.queue_id == "high"} == {8.0}
