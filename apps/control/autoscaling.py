"""The portal's autoscaler: inference services on clusters without an HPA (docs/rules.md#autoscaling, docs/tasks.md
"Autoscaling").

Every ``INTERVAL_S`` (beat), for each running service with replica bounds on a cluster the portal scales
itself (a local cluster whose jobs have networks of their own; on Kubernetes the HPA decides), it
reads the metrics the portal has: the node agent's GPU utilisation of the service's cards, and the request rate
and concurrency (requests in flight) its Connect proxy measured (:mod:`apps.tasks.request_rate`); the pure rules of
:mod:`apps.queues.engine.autoscale` turn them into a desired replica count. A changed count is written to
``Task.autoscale_desired`` with an ``autoscaled`` event giving the reason (metric against target), and a
scheduling cycle is asked for: the engine then grants replicas up to that count like an elastic task's
(quota, queue class, placement; lower-class work shrinks first), and its resize is what the backend runs
and billing counts.

The recommendations of the last stabilisation window are kept in Redis: losing them only delays a
scale-down by one window (the rules scale down only once a whole window of recommendations is known). Each carries
whether the panic condition held (the rate or concurrency of the last ``PANIC_WINDOW_S`` seconds asking for twice
the running replicas), so a panic outlives the pass that saw it by a stable window.

Where a backend scales a service itself (the Kubernetes HPA), the reconciliation reads the replicas it asks for and
hands them to :func:`follow_backend_wish`: they become the service's desired count the same way, so the engine
decides who gives way for them, and the "replicas not granted" alert watches them too.

Scheduled minimums (docs/tasks.md "Scheduled minimums"): each pass computes a service's floor for that moment from
its ``autoscale_schedule`` and gives it to the rules. A service that a backend scales itself (the Kubernetes HPA)
gets its settings again when its floor changes (:func:`push_scheduled_floors`), so the HPA's ``minReplicas`` follows.

Predictive scaling (docs/tasks.md "Predictive scaling"): every pass also averages each service's request rate
and GPU utilisation into its current 5-minute bucket (:class:`~apps.tasks.models.ServiceLoadSample`, kept
``LOAD_KEEP_DAYS`` days, so the history survives restarts). Forecasts are fitted off this loop, by their own
period job (:func:`refit_forecasts`, once per bucket and service with ``autoscale_predictive``: a fit takes from
a fraction of a second to tens of seconds and must not delay a decision): the next hour's buckets
(:func:`apps.queues.engine.forecast.forecast`: Holt-Winters over up to ``FIT_DAYS`` days, seasonal naive with
less than two days), and a backtest of the forecasts the service was given over the last day against "last
value" and "same time yesterday" (:func:`apps.queues.engine.forecast.backtest`). A decision takes the peak
forecast of the next ``LEAD_S`` seconds into account only while the forecast beats both; otherwise the service
is scaled reactively, and its page says why.
"""

from __future__ import annotations

import json
import logging
import math
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from decimal import Decimal

import redis
from django.db import models, transaction
from django.db.models import Sum
from django.utils import timezone

from apps.clusters.backends import can_scale_services, executor_for
from apps.clusters.executors.base import ExecutorError
from apps.clusters.models import Cluster, Device
from apps.control import triggers
from apps.control.jobspec import job_spec
from apps.control.models import Installation
from apps.queues.engine import autoscale as rules
from apps.queues.engine import forecast as forecasting
from apps.tasks import request_rate, schedule
from apps.tasks.choices import ACTIVE, EventKind, TaskKind, TaskStatus
from apps.tasks.live import duration_words
from apps.tasks.load import BUCKET, backtest_of
from apps.tasks.models import ServiceLoadSample, Task
from apps.tasks.services import record_event, scale_to_zero
from apps.vdc.models import ProjectQuota
from hcsportal import redis_guard

log = logging.getLogger(__name__)

# Seconds between passes (the beat runs them): with the 15 s rate window, a doubling of the load is acted on within
# 8 to 14 s of its start (docs/tasks.md "Autoscaling"; docs/rules.md#autoscaling: a new replica serving within 30 s).
INTERVAL_S = 5.0
# A node agent's utilisation older than this is no reading (agents report every few seconds).
FRESH_S = 120.0
HISTORY_KEY = "hcs:autoscale:history:{task_id}"
BACKTEST_KEY = "hcs:autoscale:backtest:{task_id}"
BEHAVIOUR = rules.Behaviour(panic_window_s=request_rate.PANIC_WINDOW_S, stable_window_s=request_rate.WINDOW_S)
# The scheduled minimum last given to a backend's own autoscaler (the HPA's minReplicas), per service.
FLOOR_KEY = "hcs:autoscale:floor:{task_id}"
# Load history for predictive scaling: bucket size, how long it is kept, how much of it a forecast fits.
BUCKET_S = int(BUCKET.total_seconds())
SEASON = 86400 // BUCKET_S
LOAD_KEEP_DAYS = 14
FIT_DAYS = 7
# The forecast covers the next hour (the monitoring page shows it); decisions look LEAD_S ahead, enough for
# a replica to start and serve (see the start-up delay in benchmarks/autoscale_day.py).
HORIZON_BUCKETS = 12
LEAD_S = 600


def portal_scaled(cluster: Cluster | None) -> bool:
    """Whether the portal's autoscaler (not a backend's own, like the Kubernetes HPA) scales services there."""
    return cluster is not None and can_scale_services(cluster)


@dataclass(frozen=True)
class Outcome:
    """One service's decision in one pass of the loop."""

    task_id: int
    running: int
    desired: int
    reason: str
    changed: bool


def targets_of(task: Task) -> rules.Targets:
    """The service's bounds and targets as the rules take them."""
    low = max(task.autoscale_min or 1, 1)
    return rules.Targets(
        min_replicas=low,
        max_replicas=max(task.autoscale_max or low, low),
        gpu_percent=task.autoscale_gpu_percent,
        cpu_percent=task.autoscale_cpu_percent,
        rps_per_replica=task.autoscale_rps,
        concurrency_per_replica=task.autoscale_concurrency,
        latency_ms=task.autoscale_latency_ms,
    )


def run_autoscaler(now: float | None = None) -> list[Outcome]:
    """One pass over every running portal-scaled service; returns what was decided for each."""
    now = timezone.now().timestamp() if now is None else now
    scale_idle_to_zero(now)
    services = _running_services(autoscale_min__isnull=False, autoscale_max__isnull=False)
    _forget_stale()
    push_scheduled_floors(now)
    if not services:
        return []
    rps, panic_rps = request_rate.rates_with_panic([t.pk for t in services], now=now)
    slow = [t.pk for t in services if t.autoscale_concurrency]
    in_flight = request_rate.concurrency(slow, now=now)
    panic_in_flight = request_rate.concurrency(slow, window_s=request_rate.PANIC_WINDOW_S, now=now)
    took = request_rate.latencies([t.pk for t in services if t.autoscale_latency_ms], now=now)
    when = datetime.fromtimestamp(now, tz=UTC)
    gpu = _gpu_utilisation(services, now)
    record_load(services, rps, gpu, now)
    predictive = [t.pk for t in services if t.autoscale_predictive and t.autoscale_rps]
    earning = [pk for pk, result in stored_backtests(predictive).items() if result.earns_place]
    ahead = forecast_peaks(earning, now)
    rooms = _quota_rooms(services)
    histories = _load_histories([t.pk for t in services])
    outcomes = []
    for task in services:
        running = max(len(task.placement or []), 1)
        metrics = rules.Metrics(
            gpu_percent=gpu.get(task.pk),
            rps=rps.get(task.pk) if task.autoscale_rps else None,
            concurrency=in_flight.get(task.pk),
            panic_rps=panic_rps.get(task.pk) if task.autoscale_rps else None,
            panic_concurrency=panic_in_flight.get(task.pk),
            latency_ms=took.get(task.pk),
        )
        decision = rules.decide(
            targets_of(task),
            running,
            metrics,
            histories.get(task.pk, ()),
            now,
            BEHAVIOUR,
            rooms.get(task.pk),
            forecast_rps=ahead.get(task.pk),
            floor=schedule.floor_at(task.autoscale_schedule, when),
        )
        _save_history(task.pk, decision.history)
        changed = _apply(task, running, decision)
        outcomes.append(Outcome(task.pk, running, decision.desired, decision.reason, changed))
    if any(o.changed for o in outcomes):
        triggers.request_cycle()
    return outcomes


def scale_idle_to_zero(now: float) -> list[int]:
    """Scale to zero (docs/tasks.md "Scale to zero"), on every backend: a running service that scales to zero and
    saw no request start or end through Connect for its ``scale_to_zero_after_s`` since it last started, with no
    request in flight, releases its cards (:func:`apps.tasks.services.scale_to_zero`). Without a reading of the
    proxy's counters (Redis down) nothing is idle. Returns the services scaled to zero."""
    candidates = list(
        Task.objects.filter(
            kind=TaskKind.INFERENCE, status=TaskStatus.RUNNING, scale_to_zero_after_s__isnull=False
        ).only("pk", "started_at", "scale_to_zero_after_s")
    )
    seen = request_rate.activity([t.pk for t in candidates], now=now) if candidates else {}
    if seen is None:
        return []
    slept = []
    for task in candidates:
        reading = seen[task.pk]
        since = max(reading.last or 0.0, task.started_at.timestamp() if task.started_at else now)
        idle_s = now - since
        if reading.in_flight or idle_s < task.scale_to_zero_after_s:
            continue
        message = (
            f"Scaled to zero: no request for {duration_words(timedelta(seconds=round(idle_s)))} (the service's "
            f"limit is {duration_words(timedelta(seconds=task.scale_to_zero_after_s))}); the next request through "
            "Connect wakes it"
        )
        data = {"idle_s": round(idle_s, 1), "after_s": task.scale_to_zero_after_s, "last_request": reading.last}
        if scale_to_zero(task.pk, message, data):
            slept.append(task.pk)
    return slept


def backend_floor(task: Task, now: float) -> tuple[int, str]:
    """The minimum a service that its backend scales itself (the Kubernetes HPA) should keep now, and why: its
    scheduled minimum, raised to the replicas its forecast's peak of the next ``LEAD_S`` asks for while the forecast
    earns its place (the same gate as the portal's own autoscaler: its backtest beats "last value" and "same time
    yesterday"). The HPA still scales above it on its own metrics; a forecast never lowers it."""
    when = datetime.fromtimestamp(now, tz=UTC)
    low, high = max(task.autoscale_min or 1, 1), max(task.autoscale_max or 1, 1)
    floor = schedule.minimum_at(task.autoscale_min, task.autoscale_max, task.autoscale_schedule, when)
    why = f"the scheduled minimum is {floor}" if floor > low else f"the minimum is {low}"
    if task.autoscale_predictive and task.autoscale_rps:
        backtest = stored_backtests([task.pk]).get(task.pk)
        peak = forecast_peaks([task.pk], now).get(task.pk) if backtest is not None and backtest.earns_place else None
        if peak is not None:
            wanted = min(max(math.ceil(peak / task.autoscale_rps - 1e-9), low), high)
            if wanted > floor:
                floor = wanted
                why = (
                    f"forecast: {peak:.1f} req/s within {LEAD_S // 60} min for a target of {task.autoscale_rps} "
                    "per replica"
                )
    return floor, why


def push_scheduled_floors(now: float) -> list[int]:
    """Services whose backend autoscales them itself (the Kubernetes HPA) cannot follow a schedule or a forecast by
    themselves: when a running service's floor (:func:`backend_floor`: its scheduled minimum, raised by a forecast
    that earns its place) changes, its settings go to the backend again (:func:`apply_to_backend`, whose HPA gets
    ``minReplicas`` = that floor), with an event saying why. Their request rate, as Connect measures it, goes into
    their load history like the portal-scaled services' (so their forecasts can be fitted and backtested). Returns
    the services whose settings were queued."""
    floored = (
        Task.objects.filter(kind=TaskKind.INFERENCE, status=TaskStatus.RUNNING, autoscale_max__isnull=False)
        .filter(~models.Q(autoscale_schedule=[]) | models.Q(autoscale_predictive=True, autoscale_rps__isnull=False))
        .exclude(external_id="")
        .select_related("cluster")
    )
    floored = [task for task in floored if not portal_scaled(task.cluster)]
    predictive = [task for task in floored if task.autoscale_predictive and task.autoscale_rps]
    if predictive:
        rps = request_rate.rates([t.pk for t in predictive], now=now)
        record_load(predictive, rps, {}, now)
    pushed = []
    for task in floored:
        value, why = backend_floor(task, now)
        floor = str(value)
        key = FLOOR_KEY.format(task_id=task.pk)
        try:
            client = redis_guard.client()
            before = client.get(key)
            if before in (floor, floor.encode()):
                continue
            client.set(key, floor, ex=7 * 86400)
        except redis.RedisError as exc:
            log.warning("autoscaler: cannot keep the backend floor of task %s: %s", task.pk, exc)
            continue
        if before is not None:
            with transaction.atomic():
                record_event(
                    task,
                    EventKind.AUTOSCALED,
                    f"The {task.cluster.name} autoscaler keeps at least {value} replicas: {why}",
                    data={"floor": value, "from": int(before), "reason": why, "by": "floor"},
                )
        triggers.enqueue(triggers.APPLY_AUTOSCALING, task.pk, expires=300.0)
        pushed.append(task.pk)
    return pushed


def _apply(task: Task, running: int, decision: rules.Decision) -> bool:
    """Write a changed desired count with its timeline event; False when nothing changed."""
    previous = task.autoscale_desired if task.autoscale_desired is not None else running
    if decision.desired == previous and task.autoscale_desired is not None:
        return False
    with transaction.atomic():
        locked = Task.objects.select_for_update().filter(pk=task.pk, attempt=task.attempt, status__in=ACTIVE).first()
        if locked is None:
            return False
        locked.autoscale_desired = decision.desired
        locked.save(update_fields=["autoscale_desired", "updated_at"])
        if decision.desired != previous:
            verb = "more" if decision.desired > previous else "fewer"
            record_event(
                locked,
                EventKind.AUTOSCALED,
                f"Autoscaler asks for {decision.desired} replicas ({verb}; runs {running}): {decision.reason}",
                data={
                    "desired": decision.desired,
                    "from": previous,
                    "running": running,
                    "metric": decision.metric,
                    "value": decision.value,
                    "target": decision.target,
                },
            )
    return decision.desired != previous


def wish_within_bounds(task: Task, wanted: int) -> int:
    """The replicas a backend's autoscaler asks for, kept within the service's bounds (an autoscaled service)."""
    low = max(task.autoscale_min or 1, 1)
    return min(max(wanted, low), max(task.autoscale_max or low, low))


def follow_backend_wish(task_id: int, attempt: int, wanted: int, by: str) -> bool:
    """A backend's own autoscaler (a Kubernetes HPA) asks for ``wanted`` replicas of a running service: the wish,
    kept within the service's bounds, becomes its desired count (``Task.autoscale_desired``, with an ``autoscaled``
    event naming ``by`` when it differs from what was asked or granted before) and, when it differs from what runs, a
    scheduling cycle is asked for.
    The engine grants replicas up to it like the portal autoscaler's (docs/rules.md#autoscaling): lower-class work
    shrinks or is preempted within the class rules; the pods the HPA added find the cards so freed. Returns whether
    the desired count changed."""
    with transaction.atomic():
        locked = Task.objects.select_for_update().filter(pk=task_id, attempt=attempt, status__in=ACTIVE).first()
        if locked is None or not locked.is_autoscaled:
            return False
        desired = wish_within_bounds(locked, wanted)
        if desired == locked.autoscale_desired:
            return False
        running = len(locked.placement or [])
        previous = locked.autoscale_desired if locked.autoscale_desired is not None else running
        locked.autoscale_desired = desired
        locked.save(update_fields=["autoscale_desired", "updated_at"])
        if desired != previous:
            verb = "more" if desired > previous else "fewer"
            record_event(
                locked,
                EventKind.AUTOSCALED,
                f"{by} asks for {desired} replicas ({verb}; runs {running})",
                data={"desired": desired, "from": previous, "running": running, "by": "backend", "asked": wanted},
            )
        if desired != running:  # the engine grows or trims the service (at its size, it has nothing to do)
            transaction.on_commit(triggers.request_cycle)
    return True


def bucket_start(at: float) -> datetime:
    """The start of the load bucket that holds the instant ``at`` (epoch seconds)."""
    return datetime.fromtimestamp(at - at % BUCKET_S, tz=UTC)


def record_load(services: list[Task], rps: dict, gpu: dict, now: float) -> set[int]:
    """Average this pass's readings into each service's current bucket; returns the services whose bucket
    opened with this pass (their forecast is due). Buckets older than ``LOAD_KEEP_DAYS`` are dropped then."""
    start = bucket_start(now)
    rows = {s.task_id: s for s in ServiceLoadSample.objects.filter(task__in=services, start=start)}
    opened = set()
    for task in services:
        rate, util = rps.get(task.pk), gpu.get(task.pk)
        row = rows.get(task.pk) or ServiceLoadSample(task=task, start=start)
        if row.pk is None or (not row.samples and (rate is not None or util is not None)):
            opened.add(task.pk)
        if rate is None and util is None:
            if row.pk is None:
                row.save()
            continue
        n = row.samples
        if rate is not None:
            row.rps = rate if row.rps is None or not n else (row.rps * n + rate) / (n + 1)
        if util is not None:
            row.gpu_percent = util if row.gpu_percent is None or not n else (row.gpu_percent * n + util) / (n + 1)
        row.samples = n + 1
        row.save()
    if opened:
        ServiceLoadSample.objects.filter(start__lt=start - timedelta(days=LOAD_KEEP_DAYS)).delete()
    return opened


def load_history(task_id: int, until: datetime, days: int = FIT_DAYS) -> list[float]:
    """The measured request rates of the service's closed buckets before ``until``, one per bucket, oldest first.
    A bucket with no reading (the service did not run, the loop was down) repeats the bucket one day earlier,
    or the previous one, so the daily season stays aligned."""
    first = until - timedelta(days=days)
    seen = dict(
        ServiceLoadSample.objects.filter(task_id=task_id, start__gte=first, start__lt=until, rps__isnull=False)
        .order_by("start")
        .values_list("start", "rps")
    )
    if not seen:
        return []
    at, out = min(seen), []
    while at < until:
        value = seen.get(at)
        if value is None:
            value = out[-SEASON] if len(out) >= SEASON else out[-1]
        out.append(value)
        at += timedelta(seconds=BUCKET_S)
    return out


def refresh_forecast(task: Task, now: float) -> forecasting.Forecast:
    """Forecast the service's request rate for the current bucket and the next hour's from its history, and
    write it on those buckets (a fresher forecast replaces an older one)."""
    start = bucket_start(now)
    result = forecasting.forecast(load_history(task.pk, start), SEASON, HORIZON_BUCKETS + 1)
    ServiceLoadSample.objects.bulk_create(
        [
            ServiceLoadSample(
                task=task,
                start=start + timedelta(seconds=BUCKET_S * i),
                forecast_rps=value,
                forecast_method=result.method,
            )
            for i, value in enumerate(result.values)
        ],
        update_conflicts=True,
        unique_fields=["task", "start"],
        update_fields=["forecast_rps", "forecast_method"],
    )
    return result


def _running_services(**filters) -> list[Task]:
    """The running inference services matching ``filters`` on clusters the portal scales itself."""
    services = Task.objects.filter(kind=TaskKind.INFERENCE, status=TaskStatus.RUNNING, **filters)
    return [t for t in services.select_related("cluster") if portal_scaled(t.cluster)]


def refit_forecasts(now: float | None = None) -> dict[int, forecasting.Backtest]:
    """The forecast job: for every running predictive service whose current bucket has no fresh forecast yet,
    fit the next hour's forecast and backtest the forecasts of the last day; the backtests are kept (Redis) for
    the decision loop. Returns the backtests made."""
    now = timezone.now().timestamp() if now is None else now
    start = bucket_start(now)
    # Every backend's predictive services: the portal's autoscaler decides with the forecast, an HPA gets it as
    # its floor (push_scheduled_floors).
    services = list(
        Task.objects.filter(
            kind=TaskKind.INFERENCE, status=TaskStatus.RUNNING, autoscale_predictive=True, autoscale_rps__isnull=False
        )
    )
    done = {}
    for task in services:
        if (
            _refitted_bucket(task.pk) == start.timestamp()
            and ServiceLoadSample.objects.filter(
                task=task, start=start + timedelta(seconds=BUCKET_S * HORIZON_BUCKETS), forecast_rps__isnull=False
            ).exists()
        ):
            continue
        refresh_forecast(task, now)
        done[task.pk] = backtest_of(task.pk, start, BUCKET_S, SEASON)
        _keep_backtest(task.pk, start, done[task.pk])
    return done


def stored_backtests(task_ids: list[int]) -> dict[int, forecasting.Backtest]:
    """The backtests the forecast job kept; a service without one (not yet fitted, Redis lost) is absent and
    scaled reactively."""
    if not task_ids:
        return {}
    try:
        raw = redis_guard.client().mget([BACKTEST_KEY.format(task_id=pk) for pk in task_ids])
    except redis.RedisError as exc:
        log.warning("autoscaler: cannot read forecast backtests (scaling reactively): %s", exc)
        return {}
    out = {}
    for pk, value in zip(task_ids, raw, strict=True):
        if value:
            try:
                kept = json.loads(value)
                out[pk] = forecasting.Backtest(*kept["backtest"])
            except (ValueError, TypeError, KeyError):
                continue
    return out


def _refitted_bucket(task_id: int) -> float | None:
    try:
        value = redis_guard.client().get(BACKTEST_KEY.format(task_id=task_id))
        return json.loads(value)["bucket"] if value else None
    except (redis.RedisError, ValueError, TypeError, KeyError):
        return None


def _keep_backtest(task_id: int, bucket: datetime, result: forecasting.Backtest) -> None:
    value = json.dumps(
        {
            "bucket": bucket.timestamp(),
            "backtest": [result.buckets, result.forecast_error, result.last_value_error, result.yesterday_error],
        }
    )
    try:
        redis_guard.client().set(BACKTEST_KEY.format(task_id=task_id), value, ex=3 * BUCKET_S)
    except redis.RedisError as exc:
        log.warning("autoscaler: cannot keep the forecast backtest of task %s: %s", task_id, exc)


def forecast_peaks(task_ids: list[int], now: float) -> dict[int, float]:
    """The highest request rate forecast for each service's buckets from now to ``LEAD_S`` ahead."""
    if not task_ids:
        return {}
    rows = (
        ServiceLoadSample.objects.filter(
            task_id__in=task_ids,
            start__gte=bucket_start(now),
            start__lte=datetime.fromtimestamp(now + LEAD_S, tz=UTC),
            forecast_rps__isnull=False,
        )
        .values("task_id")
        .annotate(peak=models.Max("forecast_rps"))
    )
    return {r["task_id"]: r["peak"] for r in rows}


def _gpu_utilisation(services: list[Task], now: float) -> dict[int, float]:
    """Mean node-agent utilisation of each service's cards, from agents that reported within ``FRESH_S``
    (services without cards, or on a node whose agent went quiet, have no reading)."""
    ids = {t.pk: [d["id"] for p in t.placement or [] for d in p.get("devices", ())] for t in services}
    wanted = {i for devs in ids.values() for i in devs}
    if not wanted:
        return {}
    fresh = datetime.fromtimestamp(now - FRESH_S, tz=UTC)
    util = dict(Device.objects.filter(pk__in=wanted, node__last_report__gte=fresh).values_list("pk", "utilization"))
    out = {}
    for pk, devs in ids.items():
        seen = [util[i] for i in devs if i in util]
        if seen:
            out[pk] = sum(seen) / len(seen)
    return out


def _quota_rooms(services: list[Task]) -> dict[int, int]:
    """How many more replicas each service's enforced GPU quota admits (absent: no enforced GPU limit)."""
    keys = {(t.project_id, t.vdc_id) for t in services}
    quotas = {
        (q.project_id, q.vdc_id): q.limit_gpu
        for q in ProjectQuota.objects.filter(
            project_id__in={k[0] for k in keys}, vdc_id__in={k[1] for k in keys}, enforce=True
        )
    }
    used = {
        (row["project_id"], row["vdc_id"]): row["gpu"] or Decimal(0)
        for row in Task.objects.filter(status__in=ACTIVE, project_id__in={k[0] for k in keys})
        .values("project_id", "vdc_id")
        .annotate(gpu=Sum("allocated_gpu"))
    }
    rooms = {}
    for t in services:
        limit = quotas.get((t.project_id, t.vdc_id))
        replicas = len(t.placement or [])
        if limit is None or not replicas or not t.allocated_gpu:
            continue
        per_replica = Decimal(t.allocated_gpu) / len(t.placement)
        free = Decimal(limit) - used.get((t.project_id, t.vdc_id), Decimal(0))
        rooms[t.pk] = max(0, math.floor(free / per_replica)) if per_replica > 0 else 0
    return rooms


def _load_histories(task_ids: list[int]) -> dict[int, tuple[rules.Recommendation, ...]]:
    try:
        raw = redis_guard.client().mget([HISTORY_KEY.format(task_id=pk) for pk in task_ids])
    except redis.RedisError as exc:
        log.warning("autoscaler: cannot read recommendations (scale-downs wait a window): %s", exc)
        return {}
    out = {}
    for pk, value in zip(task_ids, raw, strict=True):
        if value:
            try:
                out[pk] = tuple(rules.Recommendation(float(at), int(n), bool(p)) for at, n, *p in json.loads(value))
            except (ValueError, TypeError):
                continue
    return out


def _save_history(task_id: int, history: tuple[rules.Recommendation, ...]) -> None:
    ttl = int(2 * max(BEHAVIOUR.up_window_s, BEHAVIOUR.down_window_s) + 4 * INTERVAL_S)
    try:
        kept = [[r.at, r.replicas, *([1] if r.panic else [])] for r in history]
        redis_guard.client().set(HISTORY_KEY.format(task_id=task_id), json.dumps(kept), ex=ttl)
    except redis.RedisError as exc:
        log.warning("autoscaler: cannot keep recommendations of task %s: %s", task_id, exc)


def apply_to_backend(task_id: int, *, final: bool = False) -> None:
    """Give a running service's autoscaling settings to its backend's own autoscaler (a Kubernetes HPA; a no-op
    elsewhere). A retryable backend error is raised for the job to retry; a refusal, or the last failure when
    ``final``, goes on the task's timeline."""
    task = (
        Task.objects.select_related("cluster", "project", "owner", "queue")
        .filter(pk=task_id, status__in=ACTIVE)
        .exclude(external_id="")
        .first()
    )
    if task is None or task.cluster is None:
        return
    spec = job_spec(task, Installation.current().uid.hex)
    if "min_replicas" in spec.settings:
        spec.settings["min_replicas"] = backend_floor(task, timezone.now().timestamp())[0]
    try:
        executor_for(task.cluster).update_autoscaling(task.external_id, spec)
    except ExecutorError as exc:
        if exc.retryable and not final:
            raise
        with transaction.atomic():
            record_event(
                task, EventKind.BACKEND_ERROR, f"The new autoscaling settings did not reach {task.cluster.name}: {exc}"
            )


def _forget_stale() -> None:
    """A service that left the portal's hands (requeued, ended) starts from its own size next time."""
    Task.objects.filter(autoscale_desired__isnull=False).exclude(status__in=ACTIVE).update(autoscale_desired=None)
