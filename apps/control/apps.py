from django.apps import AppConfig


class ControlConfig(AppConfig):
    """The runtime: scheduling cycles, launch, reconciliation with the backends, cluster and node health."""

    name = "apps.control"
    verbose_name = "Control plane"

    def ready(self) -> None:
        from django.db.models.signals import post_delete, post_save  # noqa: PLC0415

        from apps.control import triggers  # noqa: PLC0415 - models are loaded only once the registry is ready
        from apps.control.jobs import on_quota_changed  # noqa: PLC0415
        from apps.tasks.signals import (  # noqa: PLC0415
            autoscaling_changed,
            cluster_work,
            demand_changed,
            task_changed,
        )
        from apps.vdc.models import ProjectQuota  # noqa: PLC0415

        demand_changed.connect(triggers.on_demand_changed, dispatch_uid="control-demand-changed")
        # Live pages learn of changes through a worker job: a request or cycle only notes the task ids.
        task_changed.connect(triggers.on_task_changed, dispatch_uid="control-live-push")
        cluster_work.connect(triggers.on_cluster_work, dispatch_uid="control-cluster-work")
        # Per-project clusters mirror each project's quota (apps/clusters/isolation.py).
        post_save.connect(on_quota_changed, sender=ProjectQuota, dispatch_uid="control-quota-saved")
        post_delete.connect(on_quota_changed, sender=ProjectQuota, dispatch_uid="control-quota-deleted")
        autoscaling_changed.connect(triggers.on_autoscaling_changed, dispatch_uid="control-autoscaling-changed")
