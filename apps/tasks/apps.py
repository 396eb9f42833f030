from django.apps import AppConfig


class TasksConfig(AppConfig):
    name = "apps.tasks"
    verbose_name = "Compute tasks"
