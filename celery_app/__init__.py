"""The Celery app of HCS Portal: the app, the beat schedule and the broker transport (job functions live with their
apps)."""

from celery_app.app import app

__all__ = ["app"]
