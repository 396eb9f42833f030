from django.apps import AppConfig


class ControlConfig(AppConfig):
    """The runtime: scheduling cycles, launch, reconciliation with the backends, cluster and node health."""

    name = "apps.control"
    verbose_name = "Control plane"

    def ready(self) -> None:
        from apps.control import triggers  # noqa: PLC0415 - models are loaded only once the registry is ready
        from apps.tasks.signals import (  # noqa: PLC0415
            autoscaling_changed,
            cluster_work,
            demand_changed,
            task_changed,
        )

        demand_changed.connect(triggers.on_demand_changed, dispatch_uid="control-demand-changed")
        # Live pages learn of changes through a worker job: a request or cycle only notes the task ids.
        task_changed.connect(triggers.on_task_changed, dispatch_uid="control-live-push")
        cluster_work.connect(triggers.on_cluster_work, dispatch_uid="control-cluster-work")
        autoscaling_changed.connect(triggers.on_autoscaling_changed, dispatch_uid="control-autoscaling-changed")
