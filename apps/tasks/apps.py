from django.apps import AppConfig


class TasksConfig(AppConfig):
    name = "apps.tasks"
    verbose_name = "Compute tasks"

    # Live pushes (apps.tasks.live) are sent by the control plane's worker job when tasks change
    # (apps.control.triggers.on_task_changed), never on a request's path.

    def ready(self) -> None:
        from apps.vdc.signals import secret_in_use  # imported once the registry is ready

        # A project secret is not deleted while waiting or running tasks refer to it (docs/security.md).
        secret_in_use.connect(_secret_users, dispatch_uid="tasks-secret-users")


def _secret_users(sender, secret, **kwargs) -> list[str]:
    from apps.tasks.services import secret_users  # services import models

    return secret_users(secret)
