"""The Celery app of HCS Portal: the app and the beat schedule only (job functions live with their apps)."""

from celery_app.app import app

__all__ = ["app"]
