"""The portal's autoscaler: inference services on clusters without an HPA (SPEC §7, docs/tasks.md "Autoscaling").

Every ``INTERVAL_S`` (beat), for each running service with replica bounds on a cluster the portal scales
itself (a local cluster whose jobs have networks of their own; on Kubernetes the HPA decides), it
reads the metrics the portal has: the node agent's GPU utilisation of the service's cards and the request rate
its Connect proxy counted (:mod:`apps.tasks.request_rate`); the pure rules of
:mod:`apps.queues.engine.autoscale` turn them into a desired replica count. A changed count is written to
``Task.autoscale_desired`` with an ``autoscaled`` event giving the reason (metric against target), and a
scheduling cycle is asked for: the engine then grants replicas up to that count like an elastic task's
(quota, queue class, placement; lower-class work shrinks first), and its resize is what the backend runs
and billing counts.

The recommendations of the last stabilisation window are kept in Redis: losing them only delays a
scale-down by one window (the rules scale down only once a whole window of recommendations is known).
"""

from __future__ import annotations

import json
import logging
import math
from dataclasses import dataclass
from datetime import UTC, datetime
from decimal import Decimal

import redis
from django.db import transaction
from django.db.models import Sum
from django.utils import timezone

from apps.clusters.backends import can_scale_services, executor_for
from apps.clusters.executors.base import ExecutorError
from apps.clusters.models import Cluster, Device
from apps.control import triggers
from apps.control.jobspec import job_spec
from apps.control.models import Installation
from apps.queues.engine import autoscale as rules
from apps.tasks import request_rate
from apps.tasks.choices import ACTIVE, EventKind, TaskKind, TaskStatus
from apps.tasks.models import Task
from apps.tasks.services import record_event
from apps.vdc.models import ProjectQuota

log = logging.getLogger(__name__)

INTERVAL_S = 15.0
# A node agent's utilisation older than this is no reading (agents report every few seconds).
FRESH_S = 120.0
HISTORY_KEY = "hcs:autoscale:history:{task_id}"
BEHAVIOUR = rules.Behaviour()


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
    )


def run_autoscaler(now: float | None = None) -> list[Outcome]:
    """One pass over every running portal-scaled service; returns what was decided for each."""
    now = timezone.now().timestamp() if now is None else now
    services = [
        t
        for t in Task.objects.filter(
            kind=TaskKind.INFERENCE,
            status=TaskStatus.RUNNING,
            autoscale_min__isnull=False,
            autoscale_max__isnull=False,
        ).select_related("cluster")
        if portal_scaled(t.cluster)
    ]
    _forget_stale()
    if not services:
        return []
    rps = request_rate.rates([t.pk for t in services if t.autoscale_rps], now=now)
    gpu = _gpu_utilisation(services, now)
    rooms = _quota_rooms(services)
    histories = _load_histories([t.pk for t in services])
    outcomes = []
    for task in services:
        running = max(len(task.live_placement), 1)
        metrics = rules.Metrics(gpu_percent=gpu.get(task.pk), rps=rps.get(task.pk))
        decision = rules.decide(
            targets_of(task), running, metrics, histories.get(task.pk, ()), now, BEHAVIOUR, rooms.get(task.pk)
        )
        _save_history(task.pk, decision.history)
        changed = _apply(task, running, decision)
        outcomes.append(Outcome(task.pk, running, decision.desired, decision.reason, changed))
    if any(o.changed for o in outcomes):
        triggers.request_cycle()
    return outcomes


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


def _gpu_utilisation(services: list[Task], now: float) -> dict[int, float]:
    """Mean node-agent utilisation of each service's cards, from agents that reported within ``FRESH_S``
    (services without cards, or on a node whose agent went quiet, have no reading)."""
    ids = {t.pk: [d["id"] for p in t.live_placement for d in p.get("devices", ())] for t in services}
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
        replicas = len(t.live_placement)
        if limit is None or not replicas or not t.allocated_gpu:
            continue
        per_replica = Decimal(t.allocated_gpu) / len(t.placement or t.live_placement)
        free = Decimal(limit) - used.get((t.project_id, t.vdc_id), Decimal(0))
        rooms[t.pk] = max(0, math.floor(free / per_replica)) if per_replica > 0 else 0
    return rooms


def _load_histories(task_ids: list[int]) -> dict[int, tuple[rules.Recommendation, ...]]:
    try:
        raw = triggers._redis().mget([HISTORY_KEY.format(task_id=pk) for pk in task_ids])
    except redis.RedisError as exc:
        log.warning("autoscaler: cannot read recommendations (scale-downs wait a window): %s", exc)
        return {}
    out = {}
    for pk, value in zip(task_ids, raw, strict=True):
        if value:
            try:
                out[pk] = tuple(rules.Recommendation(float(at), int(n)) for at, n in json.loads(value))
            except (ValueError, TypeError):
                continue
    return out


def _save_history(task_id: int, history: tuple[rules.Recommendation, ...]) -> None:
    ttl = int(2 * max(BEHAVIOUR.up_window_s, BEHAVIOUR.down_window_s) + 4 * INTERVAL_S)
    try:
        triggers._redis().set(
            HISTORY_KEY.format(task_id=task_id), json.dumps([[r.at, r.replicas] for r in history]), ex=ttl
        )
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
    try:
        executor_for(task.cluster).update_autoscaling(task.external_id, job_spec(task, Installation.current().uid.hex))
    except ExecutorError as exc:
        if exc.retryable and not final:
            raise
        with transaction.atomic():
            record_event(task, EventKind.BACKEND_ERROR,
                         f"The new autoscaling settings did not reach {task.cluster.name}: {exc}")  # fmt: skip


def _forget_stale() -> None:
    """A service that left the portal's hands (requeued, ended) starts from its own size next time."""
    Task.objects.filter(autoscale_desired__isnull=False).exclude(status__in=ACTIVE).update(autoscale_desired=None)
