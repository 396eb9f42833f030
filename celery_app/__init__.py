"""The Celery app of HCS Portal; job functions live in celery_app.jobs."""

from celery_app.app import app

__all__ = ["app"]
