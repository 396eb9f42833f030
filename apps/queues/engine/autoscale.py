"""Reactive autoscaling of inference services (docs/rules.md#autoscaling): how many replicas a service should run.

Pure rules, no Django: the control loop (``apps.control.autoscaling``) passes a service's bounds and targets,
the metrics it measured and the recommendations it kept, and gets a desired replica count with its reason.
The engine then grants replicas up to that count (quota, queue class, placement) like an elastic task's.

The rules follow the Kubernetes HorizontalPodAutoscaler (autoscaling/v2) so a service behaves alike on
every backend:

* per metric, ``ceil(replicas x value / target)`` for utilisations (GPU %, CPU %: averages over the replicas)
  and for the latency (the mean time of the requests that ended in the window, as the HPA scales on any
  per-replica average),
  and ``ceil(total / target per replica)`` for the request rate and the concurrency (requests in flight,
  measured over all replicas); a reading within ``tolerance`` of its target leaves the count as it is; the
  largest count of all metrics wins, clamped to ``[min, max]``;
* scale up fast: the up stabilisation window (0 s by default) and at most ``max(2 x replicas, replicas + 4)``
  per decision;
* scale down slowly: the count only drops to the *largest* recommendation of the last ``down_window_s``
  (300 s by default), and only once recommendations cover the whole window (after a restart of the loop,
  or for a fresh service, the portal first watches a full window), so noisy metrics never make it flap;
* bounds win: below the minimum it scales up at once, above a lowered maximum it drops to it at once;
* the quota: a scale-up asks for no more replicas than the project's quota leaves room for;
* predictive scaling (a service's ``autoscale_predictive``): the request rate forecast for the next lead window
  (:mod:`apps.queues.engine.forecast`) gives a count too, and the larger of it and the reactive count wins, so
  a service scales *ahead* of predicted load but never scales down because of a forecast alone. A forecast
  count obeys the same tolerance as the metrics (a forecast within ``tolerance`` of what the replicas serve
  asks for no change) and enters the same recommendations, so a forecast scale-up whose load does not come is
  undone by the ordinary scale-down once ``down_window_s`` of lower recommendations has passed. The control
  loop passes a forecast only while it earns its place (:func:`apps.queues.engine.forecast.backtest`);
* panic on bursts (as Knative's pod autoscaler does): besides the stable window's readings, the loop passes the
  request rate and concurrency of a short panic window (``Metrics.panic_rps``, ``Metrics.panic_concurrency``).
  When the replicas they ask for (``value / target``, unrounded) reach ``panic_threshold`` times the current
  count (200 %), the service is *in panic*: the count goes at once to what the panic window asks for (no step
  limit; still clamped to the maximum and the quota), and it does not scale down until ``stable_window_s`` has
  passed without the panic condition (the panic flag is kept with the recommendations). A single noisy second
  below the threshold changes nothing: the stable window hardly moves and the panic window stays below 2x;
* scheduled minimums: ``floor`` (the loop computes it from the service's schedule and the time) raises the
  minimum for this decision, never above the maximum; below it the count goes up at once.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

GPU = "gpu"
CPU = "cpu"
RPS = "rps"
CONCURRENCY = "concurrency"
LATENCY = "latency"
FORECAST = "forecast"


@dataclass(frozen=True, slots=True)
class Targets:
    """A service's bounds and targets; a target None is not used."""

    min_replicas: int
    max_replicas: int
    gpu_percent: float | None = None
    cpu_percent: float | None = None
    rps_per_replica: float | None = None
    concurrency_per_replica: float | None = None
    latency_ms: float | None = None

    def __post_init__(self):
        if self.min_replicas < 1 or self.max_replicas < self.min_replicas:
            raise ValueError(
                f"replica bounds must satisfy 1 <= min <= max, got {self.min_replicas}..{self.max_replicas}"
            )


@dataclass(frozen=True, slots=True)
class Metrics:
    """What was measured over the last sampling window; None = no reading (that metric is skipped)."""

    gpu_percent: float | None = None  # mean utilisation of the service's cards
    cpu_percent: float | None = None  # mean CPU utilisation of its replicas, of what they requested
    rps: float | None = None  # requests per second over all replicas
    concurrency: float | None = None  # mean requests in flight over all replicas
    panic_rps: float | None = None  # requests per second over the short panic window
    panic_concurrency: float | None = None  # mean requests in flight over the short panic window
    latency_ms: float | None = None  # mean time of the requests that ended in the window


@dataclass(frozen=True, slots=True)
class Behaviour:
    """Stabilisation and tolerance, the HPA's defaults; the panic settings, Knative's (scaled to the portal's
    stable rate window of 15 s)."""

    up_window_s: float = 0.0
    down_window_s: float = 300.0
    tolerance: float = 0.1
    panic_window_s: float = 3.0  # the length of the panic readings' window (for the reason)
    panic_threshold: float = 2.0  # panic once the panic window asks for this many times the current count
    stable_window_s: float = 15.0  # a panic ends once this long has passed without its condition


DEFAULT = Behaviour()


@dataclass(frozen=True, slots=True)
class Recommendation:
    """A raw recommendation (before stabilisation) made at ``at`` (epoch seconds)."""

    at: float
    replicas: int
    panic: bool = False  # the panic condition held at this decision


@dataclass(frozen=True, slots=True)
class Decision:
    """The desired replica count, why, and the recommendations to keep for the next decision."""

    desired: int
    reason: str
    metric: str | None  # the metric that decided (None: bounds, quota or no metric)
    value: float | None
    target: float | None
    history: tuple[Recommendation, ...]

    def changes(self, current: int) -> bool:
        """Whether this decision asks for another count than ``current``."""
        return self.desired != current


def _per_metric(targets: Targets, metrics: Metrics, replicas: int, tolerance: float) -> list[tuple]:
    """(recommended replicas, metric, value, target) for each metric with a target and a reading."""
    out = []
    base = max(replicas, 1)
    for name, value, target in (
        (GPU, metrics.gpu_percent, targets.gpu_percent),
        (CPU, metrics.cpu_percent, targets.cpu_percent),
        (LATENCY, metrics.latency_ms, targets.latency_ms),
    ):
        if value is None or not target:
            continue
        ratio = value / target
        want = base if abs(ratio - 1.0) <= tolerance else math.ceil(base * ratio - 1e-9)
        out.append((want, name, value, target))
    for name, value, target in (
        (RPS, metrics.rps, targets.rps_per_replica),
        (CONCURRENCY, metrics.concurrency, targets.concurrency_per_replica),
    ):
        if value is None or not target:
            continue
        ratio = value / (target * base)
        want = base if abs(ratio - 1.0) <= tolerance else math.ceil(value / target - 1e-9)
        out.append((want, name, value, target))
    return out


def _describe(metric: str, value: float, target: float) -> str:
    if metric == RPS:
        return f"{value:.1f} requests/s for a target of {target:g} per replica"
    if metric == CONCURRENCY:
        return f"{value:.1f} requests in flight for a target of {target:g} per replica"
    if metric == LATENCY:
        return f"requests took {value:.0f} ms on average for a target of {target:g} ms"
    return f"{metric.upper()} utilisation {value:.0f}% for a target of {target:g}%"


def _panic_reading(targets: Targets, metrics: Metrics) -> tuple | None:
    """(replicas asked for, unrounded; metric; value; target) of the panic window's reading asking for most."""
    out = None
    for name, value, target in (
        (RPS, metrics.panic_rps, targets.rps_per_replica),
        (CONCURRENCY, metrics.panic_concurrency, targets.concurrency_per_replica),
    ):
        if value is None or not target:
            continue
        want = max(value, 0.0) / target
        if out is None or want > out[0]:
            out = (want, name, value, target)
    return out


def _describe_panic(metric: str, value: float, target: float, window_s: float) -> str:
    what = "req/s" if metric == RPS else "requests in flight"
    return f"panic: {value:.1f} {what} over the last {window_s:g} s for a target of {target:g} per replica"


def decide(
    targets: Targets,
    current: int,
    metrics: Metrics,
    history: tuple[Recommendation, ...],
    now: float,
    behaviour: Behaviour = DEFAULT,
    quota_room: int | None = None,
    forecast_rps: float | None = None,
    floor: int | None = None,
) -> Decision:
    """The replica count a service running ``current`` replicas should run now.

    ``history``: recommendations of earlier decisions (any order, older ones are dropped).
    ``quota_room``: how many more replicas than ``current`` the project's quota admits (None: no limit).
    ``forecast_rps``: the highest request rate forecast for the next lead window (None: not predictive); with
    a requests/s target it raises the recommendation when it asks for more than the metrics do.
    ``floor``: the scheduled minimum at this moment (None: none); it raises the minimum, up to the maximum.
    """
    if floor is not None and floor > targets.min_replicas:
        targets = Targets(
            min(floor, targets.max_replicas),
            targets.max_replicas,
            targets.gpu_percent,
            targets.cpu_percent,
            targets.rps_per_replica,
            targets.concurrency_per_replica,
            targets.latency_ms,
        )
        scheduled = True
    else:
        scheduled = False
    # One recommendation older than the down window is kept: it shows the window is covered.
    keep = 2 * max(behaviour.up_window_s, behaviour.down_window_s)
    per_metric = _per_metric(targets, metrics, current, behaviour.tolerance)
    if per_metric:
        raw, metric, value, target = max(per_metric, key=lambda m: m[0])
        reason = _describe(metric, value, target)
    else:
        raw, metric, value, target = current, None, None, None
        reason = "no metric reading"
    if forecast_rps is not None and targets.rps_per_replica:
        expected = max(forecast_rps, 0.0)
        ratio = expected / (targets.rps_per_replica * max(current, 1))
        ahead = (
            current if abs(ratio - 1.0) <= behaviour.tolerance else math.ceil(expected / targets.rps_per_replica - 1e-9)
        )
        if ahead > raw:
            raw, metric, value, target = ahead, FORECAST, forecast_rps, targets.rps_per_replica
            reason = f"forecast {forecast_rps:.1f} req/s for a target of {target:g} per replica"
    recs = tuple(sorted((r for r in history if now - keep <= r.at < now), key=lambda r: r.at))
    panic_reading = _panic_reading(targets, metrics)
    panicking = panic_reading is not None and panic_reading[0] >= behaviour.panic_threshold * max(current, 1)
    in_panic = panicking or any(r.panic and r.at >= now - behaviour.stable_window_s for r in recs)
    if in_panic and panic_reading is not None:
        want = math.ceil(panic_reading[0] - 1e-9)
        if want > raw:
            raw, metric, value, target = want, *panic_reading[1:]
            reason = _describe_panic(metric, value, target, behaviour.panic_window_s)
    raw = min(max(raw, targets.min_replicas), targets.max_replicas)
    recs = (*recs, Recommendation(now, raw, panicking))

    desired = current
    if current > targets.max_replicas:
        desired = targets.max_replicas  # the maximum was lowered (an edit): follow it at once
        reason = f"the maximum is {targets.max_replicas}"
    elif raw > current:
        up = [r.replicas for r in recs if r.at >= now - behaviour.up_window_s]
        desired = max(current, min(up))
        if current >= targets.min_replicas and not in_panic:
            desired = min(desired, max(2 * current, current + 4))
        if current < targets.min_replicas and (metric is None or raw == targets.min_replicas):
            reason = (
                f"the scheduled minimum is {targets.min_replicas}"
                if scheduled
                else f"the minimum is {targets.min_replicas}"
            )
    elif raw < current and in_panic:
        reason += f"; no scale-down in a panic (it ends after {behaviour.stable_window_s:g} s without one)"
    elif raw < current:
        covered = any(r.at <= now - behaviour.down_window_s for r in recs)
        window = [r.replicas for r in recs if r.at >= now - behaviour.down_window_s]
        desired = max(window) if covered else current
        if desired >= current:
            desired = current
            reason += f"; scale-down waits for {behaviour.down_window_s:g} s of lower recommendations"
    if desired > current and quota_room is not None and desired > current + max(quota_room, 0):
        desired = current + max(quota_room, 0)
        reason += f"; the project's quota leaves room for {max(quota_room, 0)} more"
    return Decision(desired, reason, metric, value, target, recs)
