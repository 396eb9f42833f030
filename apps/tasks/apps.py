from django.apps import AppConfig


class TasksConfig(AppConfig):
    name = "apps.tasks"
    verbose_name = "Compute tasks"

    def ready(self) -> None:
        from apps.tasks import live  # noqa: PLC0415 - models are loaded only once the registry is ready
        from apps.tasks.signals import task_changed  # noqa: PLC0415

        task_changed.connect(live.push_task_changed, dispatch_uid="live-push-task-changed")
