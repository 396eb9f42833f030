from django.apps import AppConfig


class TasksConfig(AppConfig):
    name = "apps.tasks"
    verbose_name = "Compute tasks"

    # Live pushes (apps.tasks.live) are sent by the control plane's worker job when tasks change
    # (apps.control.triggers.on_task_changed), never on a request's path.
