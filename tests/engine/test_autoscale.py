"""Reactive autoscaling rules (apps/queues/engine/autoscale.py): HPA-like, no flapping."""

import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from apps.queues.engine.autoscale import (
    CONCURRENCY,
    DEFAULT,
    LATENCY,
    RPS,
    Behaviour,
    Metrics,
    Recommendation,
    Targets,
    decide,
)

T = Targets(min_replicas=1, max_replicas=4, gpu_percent=70, cpu_percent=None, rps_per_replica=10)


def run(targets, replicas, samples, step=15.0, behaviour=DEFAULT, quota_room=None):
    """Feed a metric series through ``decide`` like the control loop does; the replica count follows each decision."""
    history: tuple = ()
    counts = []
    for i, m in enumerate(samples):
        d = decide(targets, replicas, m, history, i * step, behaviour, quota_room)
        history, replicas = d.history, d.desired
        counts.append(replicas)
    return counts


def test_request_rate_above_target_scales_up_at_once_to_what_the_rate_needs():
    d = decide(T, 1, Metrics(rps=35.0), (), 0.0)
    assert d.desired == 4
    assert d.metric == RPS
    assert "35.0 requests/s for a target of 10 per replica" in d.reason


def test_scale_up_stops_at_the_maximum():
    assert decide(T, 2, Metrics(rps=500.0), (), 0.0).desired == 4


def test_scale_up_is_limited_by_the_quota_room_and_says_so():
    d = decide(T, 1, Metrics(rps=40.0), (), 0.0, quota_room=1)
    assert d.desired == 2
    assert "quota leaves room for 1 more" in d.reason
    assert decide(T, 1, Metrics(rps=40.0), (), 0.0, quota_room=0).desired == 1


def test_gpu_utilisation_above_target_scales_up_by_the_ratio():
    d = decide(T, 2, Metrics(gpu_percent=100.0), (), 0.0)
    assert d.desired == 3  # ceil(2 x 100 / 70)
    assert "GPU utilisation 100% for a target of 70%" in d.reason


def test_the_metric_asking_for_most_replicas_wins():
    d = decide(T, 1, Metrics(gpu_percent=20.0, rps=28.0), (), 0.0)
    assert (d.desired, d.metric) == (3, RPS)


def test_utilisation_within_tolerance_keeps_the_count():
    assert decide(T, 3, Metrics(gpu_percent=75.0), (), 0.0).desired == 3


def test_no_metric_keeps_the_count():
    d = decide(T, 2, Metrics(), (), 0.0)
    assert d.desired == 2 and d.metric is None


def test_scale_down_waits_for_the_stabilisation_window():
    idle = [Metrics(rps=0.0)] * 30  # 15 s apart: 450 s of no requests
    counts = run(T, 4, idle)
    first_drop = next(i for i, c in enumerate(counts) if c < 4)
    assert first_drop * 15.0 >= Behaviour().down_window_s
    assert counts[-1] == 1


def test_scale_down_goes_to_the_highest_recommendation_of_the_window():
    history = (Recommendation(-400.0, 1), Recommendation(-200.0, 3), Recommendation(-100.0, 2))
    d = decide(T, 4, Metrics(rps=5.0), history, 0.0)
    assert d.desired == 3


def test_a_fresh_loop_does_not_scale_down_before_it_watched_a_full_window():
    d = decide(T, 4, Metrics(rps=0.0), (), 0.0)
    assert d.desired == 4
    assert "scale-down waits for 300 s" in d.reason


def test_noisy_metrics_around_the_target_never_flap():
    rnd = random.Random(7)
    # 2 replicas' worth of load with +-30 % noise for two hours, a sample every 15 s.
    samples = [Metrics(rps=20.0 * (1 + rnd.uniform(-0.3, 0.3))) for _ in range(480)]
    counts = run(T, 2, samples)
    changes = sum(1 for a, b in zip(counts, counts[1:], strict=False) if a != b)
    downs = [i for i, (a, b) in enumerate(zip(counts, counts[1:], strict=False)) if b < a]
    # Spikes may add a replica, but the count never goes down within a window of having gone up.
    ups = [i for i, (a, b) in enumerate(zip(counts, counts[1:], strict=False)) if b > a]
    for d in downs:
        assert all(not (0 <= d - u < 300 / 15) for u in ups)
    assert changes <= 6


def test_load_that_comes_and_goes_scales_up_then_back_down():
    samples = [Metrics(rps=5.0)] * 4 + [Metrics(rps=38.0)] * 8 + [Metrics(rps=5.0)] * 40
    counts = run(T, 1, samples)
    assert counts[4] == 4  # up in the first decision that sees the load
    assert counts[-1] == 1


# A service whose replicas each serve 4 requests at a time; its requests/s target is far off (slow requests).
C = Targets(min_replicas=1, max_replicas=8, rps_per_replica=50, concurrency_per_replica=4)


def test_concurrency_above_target_scales_up_to_what_is_in_flight_over_the_target():
    d = decide(C, 1, Metrics(rps=3.0, concurrency=13.0), (), 0.0)
    assert d.desired == 4  # ceil(13 / 4)
    assert (d.metric, d.value, d.target) == (CONCURRENCY, 13.0, 4)
    assert "13.0 requests in flight for a target of 4 per replica" in d.reason


def test_requests_slower_than_the_latency_target_scale_up_by_the_ratio_and_within_tolerance_keep_the_count():
    targets = Targets(min_replicas=1, max_replicas=10, latency_ms=200)
    d = decide(targets, 2, Metrics(latency_ms=500.0), (), 0.0)
    assert (d.desired, d.metric) == (5, LATENCY)  # ceil(2 x 500 / 200)
    assert "requests took 500 ms on average for a target of 200 ms" in d.reason
    assert decide(targets, 2, Metrics(latency_ms=215.0), (), 0.0).desired == 2  # within 10 %
    assert decide(targets, 2, Metrics(latency_ms=None), (), 0.0).reason == "no metric reading"


def test_concurrency_within_tolerance_keeps_the_count():
    assert decide(C, 3, Metrics(concurrency=12.8), (), 0.0).desired == 3  # 4.27 a replica: within 10 %
    assert decide(C, 3, Metrics(concurrency=13.6), (), 0.0).desired == 4  # 4.53 a replica


def test_slow_requests_scale_on_concurrency_and_fast_ones_on_the_rate():
    slow = decide(C, 1, Metrics(rps=10.0, concurrency=10.0), (), 0.0)  # 1 s each: 10 in flight
    fast = decide(C, 1, Metrics(rps=120.0, concurrency=1.2), (), 0.0)  # 10 ms each
    assert (slow.desired, slow.metric) == (3, CONCURRENCY)
    assert (fast.desired, fast.metric) == (3, RPS)


def test_concurrency_without_a_target_or_a_reading_is_skipped():
    assert decide(T, 1, Metrics(concurrency=50.0), (), 0.0).metric is None  # T has no concurrency target
    assert decide(C, 2, Metrics(gpu_percent=99.0), (), 0.0).metric is None  # C has no GPU target, no reading


def test_concurrency_that_goes_scales_down_only_after_the_stabilisation_window():
    samples = [Metrics(concurrency=30.0)] * 4 + [Metrics(concurrency=2.0)] * 40
    counts = run(C, 1, samples)
    assert counts[0] == 5  # at most 4 more a decision
    assert counts[1] == 8  # ceil(30 / 4)
    first_drop = next(i for i, c in enumerate(counts) if i > 1 and c < 8)
    assert (first_drop - 3) * 15.0 >= Behaviour().down_window_s  # the last high reading was at sample 3
    assert counts[-1] == 1


def test_a_lowered_maximum_applies_at_once_and_a_raised_minimum_too():
    d = decide(Targets(1, 2, rps_per_replica=10), 4, Metrics(rps=100.0), (), 0.0)
    assert d.desired == 2 and "maximum is 2" in d.reason
    assert decide(Targets(3, 4, rps_per_replica=10), 1, Metrics(), (), 0.0).desired == 3


def test_scale_up_step_is_at_most_double_or_four_more():
    t = Targets(1, 100, rps_per_replica=1)
    assert decide(t, 2, Metrics(rps=90.0), (), 0.0).desired == 6
    assert decide(t, 10, Metrics(rps=90.0), (), 0.0).desired == 20


def test_bounds_are_validated():
    with pytest.raises(ValueError, match="1 <= min <= max"):
        Targets(3, 2)
    with pytest.raises(ValueError):
        Targets(0, 2)


readings = st.none() | st.floats(0, 10_000, allow_nan=False)


@given(
    low=st.integers(1, 5),
    extra=st.integers(0, 20),
    current=st.integers(1, 30),
    rps=readings,
    concurrency=readings,
    rps_target=st.none() | st.integers(1, 100),
    concurrency_target=st.none() | st.integers(1, 100),
)
def test_any_reading_gives_a_count_in_bounds_that_steps_up_at_most_the_hpa_step(
    low, extra, current, rps, concurrency, rps_target, concurrency_target
):
    targets = Targets(low, low + extra, rps_per_replica=rps_target, concurrency_per_replica=concurrency_target)
    d = decide(targets, current, Metrics(rps=rps, concurrency=concurrency), (), 0.0)
    if current >= low:
        assert low <= d.desired <= max(low + extra, 1)
        assert d.desired <= max(2 * current, current + 4)
    if d.desired > max(current, low):  # only a reading above its target asks for more
        assert d.metric in (RPS, CONCURRENCY)
        assert d.value > d.target * current * 1.1 - 1e-9


def test_a_forecast_within_the_tolerance_asks_for_no_change():
    """479 replicas serve the load and the forecast is 1.6 % above it: the band holds, as for a metric."""
    big = Targets(min_replicas=1, max_replicas=600, rps_per_replica=10)
    d = decide(big, 479, Metrics(rps=4790.0), (), 0.0, forecast_rps=4790.0 * 1.016)
    assert d.desired == 479


def test_a_forecast_scale_up_whose_load_does_not_come_is_undone_after_the_down_window():
    svc = Targets(min_replicas=1, max_replicas=10, rps_per_replica=10)
    history: tuple = ()
    d = decide(svc, 2, Metrics(rps=20.0), history, 0.0, forecast_rps=60.0)
    assert (d.desired, d.metric) == (6, "forecast")
    replicas, history = d.desired, d.history
    counts = []
    for i in range(1, 60):  # the load stays at 20 requests/s; the forecast no longer says more
        d = decide(svc, replicas, Metrics(rps=20.0), history, i * 15.0)
        replicas, history = d.desired, d.history
        counts.append(replicas)
    assert counts[0] == 6  # not at once: the down window holds it
    assert counts[-1] == 2  # undone once 300 s of lower recommendations passed
    assert counts.index(2) * 15.0 >= DEFAULT.down_window_s - 15.0


# Panic window for bursts.

P = Targets(min_replicas=1, max_replicas=40, rps_per_replica=10)


def test_a_five_fold_burst_scales_within_one_decision_on_the_panic_figure():
    # 2 replicas serving 20 req/s; the last 3 s see 100 req/s while the 15 s mean has only reached 36.
    d = decide(P, 2, Metrics(rps=36.0, panic_rps=100.0), (), 0.0)
    assert d.desired == 10  # past the ordinary step of max(2n, n + 4) = 6
    assert d.metric == RPS and d.value == 100.0
    assert "panic: 100.0 req/s over the last 3 s for a target of 10 per replica" in d.reason
    assert d.history[-1].panic


def test_a_panic_scale_up_stops_at_the_maximum_and_the_quota():
    assert decide(Targets(1, 8, rps_per_replica=10), 2, Metrics(rps=36.0, panic_rps=100.0), (), 0.0).desired == 8
    d = decide(P, 2, Metrics(rps=36.0, panic_rps=100.0), (), 0.0, quota_room=3)
    assert d.desired == 5 and "quota leaves room for 3 more" in d.reason


def test_no_scale_down_during_a_panic_nor_until_a_stable_window_without_one():
    panic = (Recommendation(-400.0, 10), Recommendation(-10.0, 10, panic=True))
    # The load is gone, a whole down window of low recommendations is known, but a panic held 10 s ago.
    history = (*panic, *(Recommendation(float(t), 1) for t in range(-300, -10, 5)))
    d = decide(P, 10, Metrics(rps=5.0, panic_rps=5.0), history, 0.0)
    assert d.desired == 10 and "no scale-down in a panic" in d.reason
    # A stable window (15 s) after the panic's last decision it is over; the ordinary down window then rules.
    later = decide(P, 10, Metrics(rps=5.0, panic_rps=5.0), history, 6.0)
    assert "no scale-down in a panic" not in later.reason


def test_a_panic_keeps_following_the_panic_window_while_it_lasts():
    history = (Recommendation(-5.0, 10, panic=True),)
    # 10 replicas, the burst grows to 150 req/s in the panic window: 15 < 2 x 10, yet the panic still rules.
    d = decide(P, 10, Metrics(rps=80.0, panic_rps=150.0), history, 0.0)
    assert d.desired == 15 and d.reason.startswith("panic: 150.0 req/s")


def test_a_noisy_single_second_blip_under_twice_the_load_does_nothing():
    # 4 replicas at 38 req/s (target 40); one second at 1.9x: the 15 s mean is 40.3 (within the tolerance), the
    # 3 s mean 49.4 asks for 4.9 replicas, under twice the 4 running.
    level, blip = 38.0, 38.0 * 1.9
    stable = (14 * level + blip) / 15
    panic = (2 * level + blip) / 3
    d = decide(P, 4, Metrics(rps=stable, panic_rps=panic), (), 0.0)
    assert d.desired == 4
    assert not d.history[-1].panic


def test_a_burst_without_a_panic_reading_scales_by_the_ordinary_step():
    assert decide(P, 2, Metrics(rps=100.0), (), 0.0).desired == 6


def test_panic_on_concurrency_says_requests_in_flight():
    t = Targets(1, 20, concurrency_per_replica=2)
    d = decide(t, 1, Metrics(concurrency=1.5, panic_concurrency=9.0), (), 0.0)
    assert d.desired == 5
    assert "panic: 9.0 requests in flight over the last 3 s" in d.reason


# Scheduled minimums.


def test_a_scheduled_floor_raises_the_count_at_once_and_says_so():
    d = decide(P, 1, Metrics(rps=5.0), (), 0.0, floor=4)
    assert d.desired == 4 and d.reason == "the scheduled minimum is 4"


def test_a_scheduled_floor_never_goes_past_the_maximum():
    assert decide(Targets(1, 3, rps_per_replica=10), 1, Metrics(), (), 0.0, floor=8).desired == 3


def test_no_scale_down_below_the_scheduled_floor_and_down_to_the_minimum_once_it_is_over():
    history = tuple(Recommendation(float(t), 1) for t in range(-400, 0, 5))
    assert decide(P, 4, Metrics(rps=1.0), history, 0.0, floor=4).desired == 4
    assert decide(P, 4, Metrics(rps=1.0), history, 0.0, floor=None).desired == 1


def test_load_above_the_floor_scales_on_the_metric():
    d = decide(P, 4, Metrics(rps=80.0), (), 0.0, floor=4)
    assert d.desired == 8 and d.metric == RPS
