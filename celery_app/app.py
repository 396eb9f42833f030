"""Celery application configured from Django settings (CELERY_* names); the beat schedule lives here."""

import os

from celery import Celery
from django.conf import settings

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "hcsportal.settings")

app = Celery("hcsportal")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.conf.include = ["celery_app.jobs", "celery_app.billing_jobs"]

# Every entry expires before its next run, so a busy worker never works through a backlog of stale ticks.
app.conf.beat_schedule = {
    "scheduling-cycle": {
        "task": "celery_app.jobs.run_scheduler",
        "schedule": settings.HCS_SCHEDULER_INTERVAL.total_seconds(),
        "options": {"expires": settings.HCS_SCHEDULER_INTERVAL.total_seconds()},
    },
    "status-sync": {"task": "celery_app.jobs.sync_task_statuses", "schedule": 5.0, "options": {"expires": 5}},
    "cluster-health": {"task": "celery_app.jobs.check_clusters", "schedule": 30.0, "options": {"expires": 30}},
    "usage-metering": {"task": "celery_app.billing_jobs.meter_usage", "schedule": 60.0, "options": {"expires": 60}},
    "monthly-invoices": {
        "task": "celery_app.billing_jobs.generate_monthly_invoices",
        "schedule": 3600.0,
        "options": {"expires": 3600},
    },
}
