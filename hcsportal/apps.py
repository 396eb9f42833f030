from django.apps import AppConfig


class HcsPortalConfig(AppConfig):
    """Project-level wiring: cross-app management commands, and the Celery app loaded with Django."""

    name = "hcsportal"
    verbose_name = "HCS Portal"

    def ready(self) -> None:
        # Job functions are declared with @shared_task in the apps; loading the app here makes it the one they use.
        import celery_app  # noqa: F401
