"""Celery application configured from Django settings (CELERY_* names), beat schedule in code."""

import os

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "hcsportal.settings")

app = Celery("hcsportal")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.conf.include = ["celery_app.jobs"]
app.conf.beat_schedule = {}
