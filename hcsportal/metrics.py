"""Prometheus /metrics: a collector that reads the database and the scheduler's Redis counters at scrape time.

Access: a request with ``Authorization: Bearer <METRICS_TOKEN>`` (when the token is set), a platform admin's
session, or a request from an address in ``METRICS_ALLOWED_IPS`` (addresses or networks; default none: loopback
is not trusted, since jobs on the portal's host share it).
"""

from __future__ import annotations

import hmac
import ipaddress
import logging
from collections.abc import Iterator
from functools import lru_cache

import redis
from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.db.models import Count, Sum
from django.http import HttpRequest, HttpResponse
from django.utils import timezone
from django.views.decorators.http import require_GET
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
    SummaryMetricFamily,
)

from apps.billing import waste
from apps.billing.models import Account, ProjectAlert, UsageRecord
from apps.billing.monitoring import RESOURCES, ratio, read_state
from apps.clusters.choices import ClusterStatus
from apps.clusters.models import Device
from apps.queues import stats
from apps.tasks.choices import FINAL, EventKind, TaskKind, TaskStatus
from apps.tasks.models import Task, TaskEvent
from apps.vdc.models import VDC, Project
from apps.vdc.policy import can_view_operations

log = logging.getLogger(__name__)


def _gauge(name: str, doc: str, labels: list[str]) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, doc, labels=labels)


class PortalCollector:
    """Capacity, allocation and utilisation per VDC / cluster / project / queue; waits; scheduler; errors; cost."""

    def collect(self) -> Iterator[Metric]:
        now = timezone.now()
        state = read_state(now)
        yield from self._clusters(state)
        yield from self._vdcs(state)
        yield from self._projects(state)
        yield from self._queues(state)
        yield from self._scheduler()
        yield from self._events()
        yield from self._money()
        yield from self._outcomes(now)
        yield from self._devices()
        yield from self._latencies()

    def _clusters(self, state) -> Iterator[Metric]:
        capacity = _gauge(
            "hcs_cluster_capacity",
            "Capacity of an enabled cluster (gpu in GPU-equivalents)",
            ["vdc", "cluster", "resource"],
        )
        allocated = _gauge(
            "hcs_cluster_allocated", "Held by active tasks (gpu in GPU-equivalents)", ["vdc", "cluster", "resource"]
        )
        utilisation = _gauge("hcs_cluster_utilisation_ratio", "Allocated over capacity", ["vdc", "cluster", "resource"])
        cards = _gauge("hcs_cluster_gpu_cards", "Accelerator cards", ["vdc", "cluster"])
        missing = _gauge(
            "hcs_cluster_missing_cards", "Cards no longer reported by their node agent or backend", ["vdc", "cluster"]
        )
        busy = _gauge(
            "hcs_cluster_gpu_busy_ratio", "Average card utilisation reported by node agents", ["vdc", "cluster"]
        )
        tasks = _gauge("hcs_cluster_active_tasks", "Tasks holding resources on the cluster", ["vdc", "cluster"])
        status = _gauge("hcs_cluster_status", "1 for the cluster's current status", ["vdc", "cluster", "status"])
        for c in state.clusters:
            for r in RESOURCES:
                capacity.add_metric([c.vdc, c.name, r], float(c.capacity[r]))
                allocated.add_metric([c.vdc, c.name, r], float(c.allocated[r]))
                utilisation.add_metric([c.vdc, c.name, r], ratio(c.allocated[r], c.capacity[r]))
            cards.add_metric([c.vdc, c.name], c.cards)
            missing.add_metric([c.vdc, c.name], c.missing_cards)
            if c.busy is not None:
                busy.add_metric([c.vdc, c.name], float(c.busy))
            tasks.add_metric([c.vdc, c.name], c.tasks)
            for value in ClusterStatus.values:
                status.add_metric([c.vdc, c.name, value], 1.0 if c.enabled and c.status == value else 0.0)
        yield from (capacity, allocated, utilisation, cards, missing, busy, tasks, status)

    def _vdcs(self, state) -> Iterator[Metric]:
        capacity = _gauge("hcs_vdc_capacity", "Capacity of a VDC's enabled clusters", ["vdc", "resource"])
        allocated = _gauge("hcs_vdc_allocated", "Held by active tasks in the VDC", ["vdc", "resource"])
        utilisation = _gauge("hcs_vdc_utilisation_ratio", "Allocated over capacity", ["vdc", "resource"])
        for vdc, (cap, alloc) in sorted(state.vdcs().items()):
            for r in RESOURCES:
                capacity.add_metric([vdc, r], float(cap[r]))
                allocated.add_metric([vdc, r], float(alloc[r]))
                utilisation.add_metric([vdc, r], ratio(alloc[r], cap[r]))
        yield from (capacity, allocated, utilisation)

    def _projects(self, state) -> Iterator[Metric]:
        vdcs = state.vdcs()
        labels = ["vdc", "project", "resource"]
        allocated = _gauge("hcs_project_allocated", "Held by the project's active tasks", labels)
        share = _gauge("hcs_project_utilisation_ratio", "The project's allocation over the VDC's capacity", labels)
        for (vdc, project), held in sorted(state.projects.items()):
            cap = vdcs.get(vdc, (dict.fromkeys(RESOURCES, 0), None))[0]
            for r in RESOURCES:
                allocated.add_metric([vdc, project, r], float(held[r]))
                share.add_metric([vdc, project, r], ratio(held[r], cap[r]))
        yield from (allocated, share)

    def _queues(self, state) -> Iterator[Metric]:
        vdcs = state.vdcs()
        labels = ["vdc", "queue"]
        waiting = _gauge("hcs_queue_waiting_tasks", "Tasks waiting in the queue", labels)
        running = _gauge("hcs_queue_active_tasks", "Tasks of the queue holding resources", labels)
        oldest = _gauge("hcs_queue_oldest_wait_seconds", "Age of the longest-waiting task (0 when none)", labels)
        average = _gauge("hcs_queue_average_wait_seconds", "Average age of the waiting tasks (0 when none)", labels)
        allocated = _gauge("hcs_queue_allocated", "Held by the queue's active tasks", [*labels, "resource"])
        doc = "GPU-equivalents held over the queue's max capacity (the VDC's when unbounded)"
        utilisation = _gauge("hcs_queue_utilisation_ratio", doc, labels)
        for q in state.queues:
            key = [q.vdc, q.name]
            waiting.add_metric(key, q.waiting)
            running.add_metric(key, q.running)
            oldest.add_metric(key, q.oldest_wait_s)
            average.add_metric(key, q.average_wait_s)
            for r in RESOURCES:
                allocated.add_metric([*key, r], float(q.allocated[r]))
            bound = q.max_gpu if q.max_gpu is not None else vdcs.get(q.vdc, ({"gpu": 0}, None))[0]["gpu"]
            utilisation.add_metric(key, ratio(q.allocated["gpu"], bound))
        yield from (waiting, running, oldest, average, allocated, utilisation)

    def _scheduler(self) -> Iterator[Metric]:
        up = _gauge("hcs_scheduler_stats_up", "1 when the scheduler counters in Redis could be read", [])
        try:
            counters = stats.read_all()
            expired_jobs = stats.read_expired()
        except redis.RedisError as exc:
            log.warning("scheduler statistics unavailable: %s", exc)
            up.add_metric([], 0)
            yield up
            return
        up.add_metric([], 1)
        cycle = SummaryMetricFamily("hcs_scheduler_cycle_seconds", "Duration of scheduling cycles", labels=["vdc"])
        last = _gauge("hcs_scheduler_last_cycle_seconds", "Duration of the latest scheduling cycle", ["vdc"])
        starts = CounterMetricFamily("hcs_scheduler_starts", "Tasks started by the scheduler", labels=["vdc"])
        preempt = CounterMetricFamily("hcs_scheduler_preemptions", "Tasks preempted by the scheduler", labels=["vdc"])
        resizes = CounterMetricFamily("hcs_scheduler_resizes", "Elastic resizes by the scheduler", labels=["vdc"])
        for vdc, c in sorted(counters.items()):
            cycle.add_metric([vdc], count_value=c.get("cycles", 0), sum_value=c.get("cycle_seconds_sum", 0))
            last.add_metric([vdc], c.get("last_cycle_seconds", 0))
            starts.add_metric([vdc], c.get("starts", 0))
            preempt.add_metric([vdc], c.get("preemptions", 0))
            resizes.add_metric([vdc], c.get("resizes", 0))
        yield from (up, cycle, last, starts, preempt, resizes)
        expired = CounterMetricFamily(
            "hcs_jobs_expired", "Background jobs that expired in the queue before a worker took them", labels=["job"]
        )
        for job, count in sorted(expired_jobs.items()):
            expired.add_metric([job], count)
        yield expired

    def _events(self) -> Iterator[Metric]:
        errors = CounterMetricFamily(
            "hcs_backend_errors", "Backend errors on task timelines", labels=["vdc", "cluster"]
        )
        preemptions = CounterMetricFamily(
            "hcs_preemptions", "Preemptions and suspensions on task timelines", labels=["vdc", "project"]
        )
        rows = (
            TaskEvent.objects.filter(kind=EventKind.BACKEND_ERROR)
            .values("task__vdc__name", "task__cluster__name")
            .annotate(n=Count("id"))
            .order_by()
        )
        for row in rows:
            errors.add_metric([row["task__vdc__name"], row["task__cluster__name"] or ""], row["n"])
        rows = (
            TaskEvent.objects.filter(kind__in=(EventKind.PREEMPTED, EventKind.SUSPENDED))
            .values("task__vdc__name", "task__project__name")
            .annotate(n=Count("id"))
            .order_by()
        )
        for row in rows:
            preemptions.add_metric([row["task__vdc__name"], row["task__project__name"]], row["n"])
        yield from (errors, preemptions)

    def _money(self) -> Iterator[Metric]:
        labels = ["vdc", "project", "resource"]
        cost = CounterMetricFamily("hcs_cost_accrued", "Cost accrued by metered usage", labels=labels)
        usage = CounterMetricFamily("hcs_usage_unit_hours", "Metered usage: units x hours", labels=labels)
        rows = (
            UsageRecord.objects.values("vdc__name", "project__name", "resource_type")
            .annotate(cost=Sum("cost"), quantity=Sum("quantity"))
            .order_by()
        )
        for row in rows:
            key = [row["vdc__name"], row["project__name"], row["resource_type"]]
            cost.add_metric(key, float(row["cost"] or 0))
            usage.add_metric(key, float(row["quantity"] or 0))
        balance = _gauge("hcs_account_balance", "Balance of a project's account", ["project", "currency"])
        available = _gauge("hcs_account_available", "Balance plus credit limit", ["project", "currency"])
        for account in Account.objects.select_related("project"):
            balance.add_metric([account.project.name, account.currency], float(account.balance))
            available.add_metric([account.project.name, account.currency], float(account.available))
        yield from (cost, usage, balance, available)
        alert = _gauge(
            "hcs_project_alert",
            "1 for each alert firing for a project's members",
            ["project", "vdc", "rule", "severity", "key"],
        )
        firing = ProjectAlert.objects.filter(fired_at__isnull=False, resolved_at=None).select_related("project", "vdc")
        for a in firing:
            alert.add_metric([a.project.name, a.vdc.name if a.vdc else "", a.rule, a.severity, a.key], 1.0)
        yield alert

    def _outcomes(self, now) -> Iterator[Metric]:
        """Finished tasks by outcome and their success ratio, services' uptime, and idle GPU hours (waste)."""
        labels = ["vdc", "project"]
        finished = CounterMetricFamily(
            "hcs_tasks_finished", "Tasks that ended, by final status", labels=[*labels, "status"]
        )
        success = _gauge("hcs_task_success_ratio", "Completed over completed plus failed tasks", labels)
        per: dict[tuple[str, str], dict[str, int]] = {}
        rows = (
            Task.objects.filter(status__in=FINAL).values("vdc__name", "project__name", "status").annotate(n=Count("id"))
        )
        for row in rows.order_by():
            key = (row["vdc__name"], row["project__name"])
            per.setdefault(key, {})[row["status"]] = row["n"]
            finished.add_metric([*key, row["status"]], row["n"])
        for key, counts in sorted(per.items()):
            ended = counts.get(TaskStatus.COMPLETED, 0) + counts.get(TaskStatus.FAILED, 0)
            if ended:
                success.add_metric(list(key), counts.get(TaskStatus.COMPLETED, 0) / ended)
        uptime = _gauge(
            "hcs_service_uptime_seconds", "Time since a running inference service's run started", [*labels, "service"]
        )
        services = Task.objects.filter(kind=TaskKind.INFERENCE, status=TaskStatus.RUNNING, started_at__isnull=False)
        for row in services.values("vdc__name", "project__name", "name", "pk", "started_at"):
            service = f"{row['name']} (#{row['pk']})"
            uptime.add_metric(
                [row["vdc__name"], row["project__name"], service], (now - row["started_at"]).total_seconds()
            )
        idle = CounterMetricFamily(
            "hcs_gpu_idle_hours",
            "GPU-equivalent hours held with every card under the VDC's idle threshold (GPU waste)",
            labels=labels,
        )
        try:
            hours = waste.idle_hours()
        except redis.RedisError as exc:
            log.warning("GPU waste unavailable: %s", exc)
            hours = {}
        names = {
            "vdc": dict(VDC.objects.filter(pk__in={v for v, _p in hours}).values_list("pk", "name")),
            "project": dict(Project.objects.filter(pk__in={p for _v, p in hours}).values_list("pk", "name")),
        }
        for (vdc_id, project_id), value in sorted(hours.items()):
            idle.add_metric(
                [names["vdc"].get(vdc_id, str(vdc_id)), names["project"].get(project_id, str(project_id))], value
            )
        yield from (finished, success, uptime, idle)

    def _devices(self) -> Iterator[Metric]:
        """Per card, what its node agent last reported (cards of nodes without an agent report are left out)."""
        labels = ["vdc", "cluster", "node", "index", "model"]
        util = _gauge("hcs_device_utilisation_ratio", "Card utilisation reported by the node agent", labels)
        used = _gauge("hcs_device_vram_used_gib", "Card memory in use", labels)
        total = _gauge("hcs_device_vram_total_gib", "Card memory", labels)
        temperature = _gauge("hcs_device_temperature_celsius", "Card temperature", labels)
        health = _gauge(
            "hcs_device_health_score", "Card health score (100 healthy; the engine avoids low ones)", labels
        )
        devices = (
            Device.objects.cards()
            .filter(node__last_report__isnull=False)
            .values(
                "node__cluster__vdc__name",
                "node__cluster__name",
                "node__name",
                "index",
                "gpu_model__name",
                "utilization",
                "vram_used_gib",
                "vram_gib",
                "temperature_c",
                "health_score",
            )
        )
        for d in devices:
            key = [
                d["node__cluster__vdc__name"],
                d["node__cluster__name"],
                d["node__name"],
                str(d["index"]),
                d["gpu_model__name"],
            ]
            util.add_metric(key, d["utilization"] / 100)
            used.add_metric(key, float(d["vram_used_gib"]))
            total.add_metric(key, float(d["vram_gib"]))
            if d["temperature_c"] is not None:
                temperature.add_metric(key, d["temperature_c"])
            health.add_metric(key, d["health_score"])
        yield from (util, used, total, temperature, health)

    def _latencies(self) -> Iterator[Metric]:
        """Submit-to-running (first run) and queue wait (every run) per VDC and class, from the Redis histograms."""
        try:
            histograms = stats.read_latencies()
        except redis.RedisError as exc:
            log.warning("latency statistics unavailable: %s", exc)
            return
        docs = {
            "submit_to_running": "From submission to the first run's start",
            "queue_wait": "Time a run waited in its queue, from submission or requeue to placement",
        }
        for metric in stats.LATENCIES:
            family = HistogramMetricFamily(f"hcs_task_{metric}_seconds", docs[metric], labels=["vdc", "class"])
            for (name, vdc, klass), fields in sorted(histograms.items()):
                if name != metric:
                    continue
                buckets = [(str(float(b)), fields.get(f"le:{b}", 0.0)) for b in stats.LATENCY_BUCKETS]
                buckets.append(("+Inf", fields.get("count", 0.0)))
                family.add_metric([vdc, klass], buckets, sum_value=fields.get("sum", 0.0))
            yield family


REGISTRY = CollectorRegistry(auto_describe=False)
REGISTRY.register(PortalCollector())


@lru_cache(maxsize=8)
def _networks(entries: tuple[str, ...]) -> tuple[ipaddress.IPv4Network | ipaddress.IPv6Network, ...]:
    try:
        return tuple(ipaddress.ip_network(entry, strict=False) for entry in entries)
    except ValueError as exc:
        raise ImproperlyConfigured(f"METRICS_ALLOWED_IPS must list addresses or networks: {exc}")


def _allowed(request: HttpRequest) -> bool:
    token = settings.METRICS_TOKEN
    header = request.headers.get("Authorization", "")
    if token and header.startswith("Bearer ") and hmac.compare_digest(header[7:].strip(), token):
        return True
    if can_view_operations(request.user):
        return True
    try:
        address = ipaddress.ip_address(request.META.get("REMOTE_ADDR", ""))
    except ValueError:
        return False
    return any(address in network for network in _networks(tuple(settings.METRICS_ALLOWED_IPS)))


@require_GET
def metrics_view(request: HttpRequest) -> HttpResponse:
    """The Prometheus text exposition of the portal's state."""
    if not _allowed(request):
        response = HttpResponse(
            "Forbidden: expected a bearer token, an admin session or an allowed address.\n", status=403
        )
        if settings.METRICS_TOKEN:
            response.status_code = 401
            response["WWW-Authenticate"] = 'Bearer realm="metrics"'
        return response
    return HttpResponse(generate_latest(REGISTRY), content_type=CONTENT_TYPE_LATEST)
