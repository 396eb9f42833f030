from django.apps import AppConfig


class ControlConfig(AppConfig):
    """The runtime: scheduling cycles, launch, reconciliation with the backends, cluster and node health."""

    name = "apps.control"
    verbose_name = "Control plane"

    def ready(self) -> None:
        from django.db.models.signals import post_delete, post_save

        # Models load only once the registry is ready; importing the jobs registers them under their Celery names.
        from apps.control import jobs, triggers  # noqa: F401
        from apps.queues.models import TaskQueue
        from apps.tasks.signals import (
            autoscaling_changed,
            cluster_work,
            demand_changed,
            task_changed,
        )
        from apps.vdc.models import ProjectQuota

        demand_changed.connect(triggers.on_demand_changed, dispatch_uid="control-demand-changed")
        # Live pages learn of changes through a worker job: a request or cycle only notes the task ids.
        task_changed.connect(triggers.on_task_changed, dispatch_uid="control-live-push")
        cluster_work.connect(triggers.on_cluster_work, dispatch_uid="control-cluster-work")
        # Per-project clusters mirror each project's quota (apps/clusters/isolation.py).
        post_save.connect(triggers.on_quota_changed, sender=ProjectQuota, dispatch_uid="control-quota-saved")
        post_delete.connect(triggers.on_quota_changed, sender=ProjectQuota, dispatch_uid="control-quota-deleted")
        # Volcano-flavoured queues have a Volcano Queue on each Kubernetes cluster (apps/clusters/volcano.py).
        post_save.connect(triggers.on_queue_saved, sender=TaskQueue, dispatch_uid="control-queue-saved")
        autoscaling_changed.connect(triggers.on_autoscaling_changed, dispatch_uid="control-autoscaling-changed")
