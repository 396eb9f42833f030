"""Celery job functions of the control plane: thin, they load by id and call the control services.

Beat (``celery_app/app.py``) runs the loops; triggers (``apps.control.triggers``) run them sooner.
"""

from __future__ import annotations

import logging

from celery import shared_task
from celery.signals import task_revoked
from django.conf import settings
from django.db.models import Q
from django.utils import timezone

from apps.clusters.executors.base import ExecutorError
from apps.clusters.isolation import clusters_to_sync, sync_project
from apps.clusters.models import Cluster
from apps.clusters.services import discover_nodes as discover
from apps.clusters.volcano import clusters_of, sync_queue
from apps.control import autoscaling, reconcile, scheduling, triggers
from apps.control.health import check_cluster_health
from apps.control.models import Installation, ObjectState
from apps.control.rebalance import run_all
from apps.queues import stats
from apps.queues.models import TaskQueue
from apps.tasks import live, usage
from apps.tasks.idempotency import forget_expired
from apps.vdc.models import Project

log = logging.getLogger(__name__)


@task_revoked.connect
def on_revoked(sender=None, request=None, expired=False, **kwargs) -> None:
    """A job that expired in the queue is never dropped silently: it is logged and counted (``/metrics``
    ``hcs_jobs_expired``), and the control loop it belongs to asks to run again (coalesced)."""
    if not expired:
        return
    name = getattr(sender, "name", None) or getattr(request, "task", "") or "?"
    args = getattr(request, "args", None) or ()
    log.warning("job %s%s expired before a worker took it (the workers are busy)", name, tuple(args))
    stats.record_expired(name)
    triggers.job_expired(name, tuple(args))


@shared_task(ignore_result=True, name=triggers.RUN_SCHEDULER)
def run_scheduler() -> None:
    """One scheduling cycle for every enabled VDC."""
    triggers.cycle_started()
    try:
        scheduling.run_all_cycles()
    finally:
        triggers.cycle_finished()


@shared_task(ignore_result=True)
def reconcile_all() -> None:
    """Beat: queue a reconciliation of every enabled cluster, and of any cluster still running jobs the portal
    started (each in its own job, so one slow backend does not hold up the others)."""

    # A disabled cluster takes nothing new, but what the portal started there is followed until it ends.
    tracked = Q(backend_objects__state__in=(ObjectState.PENDING, ObjectState.ACTIVE))
    for cluster_id in Cluster.objects.filter(Q(enabled=True) | tracked).values_list("pk", flat=True).distinct():
        reconcile_cluster.apply_async((cluster_id,), expires=10)


@shared_task(ignore_result=True, name=triggers.RECONCILE_CLUSTER)
def reconcile_cluster(cluster_id: int) -> None:
    """Bring one cluster's backend in line with the database: one listing, then idempotent actions."""
    triggers.clear_request(triggers.RECONCILE_REQUESTED_KEY.format(cluster_id=cluster_id))
    reconcile.reconcile_cluster(cluster_id)


@shared_task(ignore_result=True, name=triggers.LAUNCH)
def launch(object_id: int) -> None:
    """Submit one placed task's job now instead of at the next reconciliation (which retries it if this fails)."""
    cluster_id = reconcile.launch_object(object_id)
    if cluster_id is not None:
        # Users wait for "running": follow the cluster's fresh jobs closely instead of at the next reconciliation.
        triggers.request_follow(cluster_id)


@shared_task(bind=True, ignore_result=True, max_retries=100, name=triggers.FOLLOW_LAUNCHES)
def follow_launches(self, cluster_id: int) -> None:
    """Look at a cluster's just-submitted jobs several times a second until they run (at most ~15 s).

    One chain per cluster however many tasks start: a few status calls, or one listing when many start.
    """
    starting = reconcile.follow_cluster(cluster_id)
    if starting and self.request.retries < self.max_retries:
        triggers.keep_following(cluster_id)
        # Many starting jobs were read with a listing of the whole cluster: look again less often.
        many = starting > reconcile.FOLLOW_ONE_BY_ONE
        raise self.retry(countdown=triggers.FOLLOW_LISTING_INTERVAL_S if many else triggers.FOLLOW_INTERVAL_S)
    triggers.clear_request(triggers.FOLLOW_REQUESTED_KEY.format(cluster_id=cluster_id))


@shared_task(ignore_result=True, name=triggers.PUSH_LIVE_UPDATES)
def push_live_updates() -> None:
    """Push the state of every task noted since the last push to live pages (apps.tasks.live)."""
    while task_ids := triggers.take_live_pending():
        live.push_task_changed(task_ids=task_ids)
        if len(task_ids) < triggers.LIVE_BATCH:
            break


@shared_task(ignore_result=True)
def prune_backend_objects() -> None:
    """Beat: forget backend objects that ended longer ago than HCS_BACKEND_OBJECT_RETENTION_DAYS."""

    pruned = reconcile.prune_ended_objects(settings.HCS_BACKEND_OBJECT_RETENTION)
    if pruned:
        log.info("forgot %d backend objects that ended before the retention period", pruned)


@shared_task(ignore_result=True)
def forget_idempotency_keys() -> None:
    """Beat: forget the answers kept for Idempotency-Key retries once they are a day old."""
    forget_expired()


@shared_task(ignore_result=True)
def discover_nodes() -> None:
    """Beat: re-read every schedulable cluster's nodes and cards (new nodes, resized ones, cards that changed)."""
    for cluster in Cluster.objects.schedulable():
        try:
            found = discover(cluster)
        except ExecutorError as exc:
            log.warning("node discovery on %s failed: %s", cluster.name, exc)
            continue
        if found.created or found.gone or found.notes:
            log.info("node discovery on %s: %s", cluster.name, found.summary())


@shared_task(ignore_result=True)
def check_clusters() -> None:
    """Beat: health-check every enabled cluster and read its nodes' states."""
    for cluster in Cluster.objects.filter(enabled=True):
        check_cluster_health(cluster)


# A quota change that could not reach a cluster is tried again this often (the next submit ensures it anyway).
ISOLATION_RETRY_S, ISOLATION_RETRIES = 30, 10


@shared_task(bind=True, ignore_result=True, max_retries=ISOLATION_RETRIES, name=triggers.SYNC_PROJECT_ISOLATION)
def sync_project_isolation(self, project_id: int, vdc_id: int) -> None:
    """Bring a project's namespace / account on every per-project cluster of the VDC in step with its quota."""
    project = Project.objects.filter(pk=project_id).first()
    if project is None:
        return
    installation = Installation.current().uid.hex
    retry = False
    for cluster in clusters_to_sync(vdc_id):
        try:
            sync_project(cluster, project, installation)
        except ExecutorError as exc:
            log.warning("quota of %s on %s not mirrored: %s", project.name, cluster.name, exc)
            retry = retry or exc.retryable
    if retry:
        raise self.retry(countdown=ISOLATION_RETRY_S)


@shared_task(bind=True, ignore_result=True, max_retries=ISOLATION_RETRIES, name=triggers.SYNC_VOLCANO_QUEUE)
def sync_volcano_queue(self, queue_id: int) -> None:
    """Bring a Volcano-flavoured queue's Volcano Queue on every Kubernetes cluster of its VDC in step with it."""
    queue = TaskQueue.objects.select_related("vdc").filter(pk=queue_id, backend_flavour="volcano").first()
    if queue is None:
        return
    installation = Installation.current().uid.hex
    retry = False
    for cluster in clusters_of(queue):
        try:
            sync_queue(cluster, queue, installation)
        except ExecutorError as exc:
            log.warning("queue %s not mirrored on %s: %s", queue, cluster.name, exc)
            retry = retry or exc.retryable
    if retry:
        raise self.retry(countdown=ISOLATION_RETRY_S)


@shared_task(bind=True, ignore_result=True, max_retries=6, name=triggers.APPLY_AUTOSCALING)
def apply_autoscaling(self, task_id: int) -> None:
    """A running service's new autoscaling settings to its backend's autoscaler (the HPA); retried with backoff,
    then the failure goes on the task's timeline."""
    try:
        autoscaling.apply_to_backend(task_id, final=self.request.retries >= self.max_retries)
    except ExecutorError as exc:
        raise self.retry(countdown=2 ** (self.request.retries + 1), exc=exc)


@shared_task(ignore_result=True)
def record_task_usage() -> None:
    """Beat: a utilisation sample per running task, then idle autostop of dev environments on that history, then
    the history's retention (apps.tasks.usage)."""
    now = timezone.now()
    usage.record(now)
    stopped = usage.stop_idle(now)
    if stopped:
        log.info("idle autostop stopped tasks %s", stopped)
    usage.prune(now)


@shared_task(ignore_result=True)
def autoscale_services() -> None:
    """Beat: desired replica counts of the inference services the portal scales itself (local, Slurm)."""
    autoscaling.run_autoscaler()


@shared_task(ignore_result=True)
def refit_forecasts() -> None:
    """Beat: the forecasts and backtests of the predictive services, off the autoscaler's loop."""
    from apps.control import autoscaling

    autoscaling.refit_forecasts()


@shared_task(ignore_result=True)
def rebalance_capacity() -> None:
    """Beat: the inter-project rebalancer in every VDC that has it on or still has loans out
    (docs/rules.md#rebalancing)."""
    for result in run_all():
        if result.opened or result.returned:
            log.info("rebalancer %s: %d loans opened, %d returned", result.vdc, result.opened, result.returned)
