from django.apps import AppConfig


class QueuesConfig(AppConfig):
    name = "apps.queues"
    verbose_name = "Queues and scheduling"
