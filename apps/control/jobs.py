"""Celery job functions of the control plane: thin, they load by id and call the control services.

Beat (``celery_app/app.py``) runs the loops; triggers (``apps.control.triggers``) run them sooner.
"""

from __future__ import annotations

import logging

from celery import shared_task

log = logging.getLogger(__name__)


@shared_task(ignore_result=True)
def run_scheduler() -> None:
    """One scheduling cycle for every enabled VDC."""
    from apps.control import scheduling, triggers  # noqa: PLC0415 - Django must be set up first

    triggers.cycle_started()
    try:
        scheduling.run_all_cycles()
    finally:
        triggers.cycle_finished()


@shared_task(ignore_result=True)
def reconcile_all() -> None:
    """Beat: queue a reconciliation of every enabled cluster, and of any cluster still running jobs the portal
    started (each in its own job, so one slow backend does not hold up the others)."""
    from django.db.models import Q  # noqa: PLC0415

    from apps.clusters.models import Cluster  # noqa: PLC0415
    from apps.control.models import ObjectState  # noqa: PLC0415

    # A disabled cluster takes nothing new, but what the portal started there is followed until it ends.
    tracked = Q(backend_objects__state__in=(ObjectState.PENDING, ObjectState.ACTIVE))
    for cluster_id in Cluster.objects.filter(Q(enabled=True) | tracked).values_list("pk", flat=True).distinct():
        reconcile_cluster.apply_async((cluster_id,), expires=10)


@shared_task(ignore_result=True)
def reconcile_cluster(cluster_id: int) -> None:
    """Bring one cluster's backend in line with the database: one listing, then idempotent actions."""
    from apps.control import reconcile, triggers  # noqa: PLC0415

    triggers.clear_request(triggers.RECONCILE_REQUESTED_KEY.format(cluster_id=cluster_id))
    reconcile.reconcile_cluster(cluster_id)


@shared_task(ignore_result=True)
def launch(object_id: int) -> None:
    """Submit one placed task's job now instead of at the next reconciliation (which retries it if this fails)."""
    from apps.control import reconcile, triggers  # noqa: PLC0415

    cluster_id = reconcile.launch_object(object_id)
    if cluster_id is not None:
        # Users wait for "running": follow the cluster's fresh jobs closely instead of at the next reconciliation.
        triggers.request_follow(cluster_id)


@shared_task(bind=True, ignore_result=True, max_retries=100)
def follow_launches(self, cluster_id: int) -> None:
    """Look at a cluster's just-submitted jobs several times a second until they run (at most ~15 s).

    One chain per cluster however many tasks start: a few status calls, or one listing when many start.
    """
    from apps.control import reconcile, triggers  # noqa: PLC0415

    starting = reconcile.follow_cluster(cluster_id)
    if starting and self.request.retries < self.max_retries:
        triggers.keep_following(cluster_id)
        # Many starting jobs were read with a listing of the whole cluster: look again less often.
        many = starting > reconcile.FOLLOW_ONE_BY_ONE
        raise self.retry(countdown=FOLLOW_LISTING_INTERVAL_S if many else FOLLOW_INTERVAL_S)
    triggers.clear_request(triggers.FOLLOW_REQUESTED_KEY.format(cluster_id=cluster_id))


FOLLOW_INTERVAL_S = 0.15
FOLLOW_LISTING_INTERVAL_S = 1.0


@shared_task(ignore_result=True)
def push_live_updates() -> None:
    """Push the state of every task noted since the last push to live pages (apps.tasks.live)."""
    from apps.control import triggers  # noqa: PLC0415
    from apps.tasks import live  # noqa: PLC0415

    while task_ids := triggers.take_live_pending():
        live.push_task_changed(task_ids=task_ids)
        if len(task_ids) < triggers.LIVE_BATCH:
            break


@shared_task(ignore_result=True)
def prune_backend_objects() -> None:
    """Beat: forget backend objects that ended longer ago than HCS_BACKEND_OBJECT_RETENTION_DAYS."""
    from django.conf import settings  # noqa: PLC0415

    from apps.control.reconcile import prune_ended_objects  # noqa: PLC0415

    pruned = prune_ended_objects(settings.HCS_BACKEND_OBJECT_RETENTION)
    if pruned:
        log.info("forgot %d backend objects that ended before the retention period", pruned)


@shared_task(ignore_result=True)
def discover_nodes() -> None:
    """Beat: re-read every schedulable cluster's nodes and cards (new nodes, resized ones, cards that changed)."""
    from apps.clusters.executors.base import ExecutorError  # noqa: PLC0415
    from apps.clusters.models import Cluster  # noqa: PLC0415
    from apps.clusters.services import discover_nodes as discover  # noqa: PLC0415

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
    from apps.clusters.models import Cluster  # noqa: PLC0415
    from apps.control.health import check_cluster_health  # noqa: PLC0415

    for cluster in Cluster.objects.filter(enabled=True):
        check_cluster_health(cluster)


# A quota change that could not reach a cluster is tried again this often (the next submit ensures it anyway).
ISOLATION_RETRY_S, ISOLATION_RETRIES = 30, 10


@shared_task(bind=True, ignore_result=True, max_retries=ISOLATION_RETRIES)
def sync_project_isolation(self, project_id: int, vdc_id: int) -> None:
    """Bring a project's namespace / account on every per-project cluster of the VDC in step with its quota."""
    from apps.clusters.executors.base import ExecutorError  # noqa: PLC0415
    from apps.clusters.isolation import clusters_to_sync, sync_project  # noqa: PLC0415
    from apps.control.models import Installation  # noqa: PLC0415
    from apps.vdc.models import Project  # noqa: PLC0415

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


def on_quota_changed(sender, instance, **kwargs) -> None:
    """A project quota was saved or deleted: mirror it on the VDC's per-project clusters after the commit."""
    from django.db import transaction  # noqa: PLC0415

    from apps.clusters.isolation import clusters_to_sync  # noqa: PLC0415
    from apps.control.triggers import enqueue  # noqa: PLC0415

    if not clusters_to_sync(instance.vdc_id):
        return
    project_id, vdc_id = instance.project_id, instance.vdc_id
    # Lost with a broken broker: the project's next submit on each cluster ensures its limits again.
    transaction.on_commit(lambda: enqueue(sync_project_isolation, project_id, vdc_id, expires=3600))


@shared_task(bind=True, ignore_result=True, max_retries=6)
def apply_autoscaling(self, task_id: int) -> None:
    """A running service's new autoscaling settings to its backend's autoscaler (the HPA); retried with backoff,
    then the failure goes on the task's timeline."""
    from apps.clusters.executors.base import ExecutorError  # noqa: PLC0415
    from apps.control import autoscaling  # noqa: PLC0415

    try:
        autoscaling.apply_to_backend(task_id, final=self.request.retries >= self.max_retries)
    except ExecutorError as exc:
        raise self.retry(countdown=2 ** (self.request.retries + 1), exc=exc)


@shared_task(ignore_result=True)
def autoscale_services() -> None:
    """Beat: desired replica counts of the inference services the portal scales itself (local, Slurm)."""
    from apps.control import autoscaling  # noqa: PLC0415

    autoscaling.run_autoscaler()


@shared_task(ignore_result=True)
def rebalance_capacity() -> None:
    """Beat: the inter-project rebalancer in every VDC that has it on or still has loans out (seed 003)."""
    from apps.control.rebalance import run_all  # noqa: PLC0415

    for result in run_all():
        if result.opened or result.returned:
            log.info("rebalancer %s: %d loans opened, %d returned", result.vdc, result.opened, result.returned)
