from django.apps import AppConfig


class BillingConfig(AppConfig):
    name = "apps.billing"
    verbose_name = "Billing"

    def ready(self) -> None:
        from apps.billing import admin_alerts, signals  # noqa: F401 - connect handlers, register the page
