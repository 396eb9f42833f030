"""The Celery app configured from Django settings (CELERY_* names), and the beat schedule.

Job functions live with their apps (``apps/control/jobs.py``, ``apps/billing/jobs.py``) as shared tasks;
nothing imports this package but the worker, beat and the project's app config.
"""

import os

from celery import Celery
from django.conf import settings

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "hcsportal.settings")

app = Celery("hcsportal")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.conf.include = ["apps.control.jobs", "apps.billing.jobs"]

# Every entry expires before its next run, so a busy worker never works through a backlog of stale ticks.
app.conf.beat_schedule = {
    "scheduling-cycle": {
        "task": "apps.control.jobs.run_scheduler",
        "schedule": settings.HCS_SCHEDULER_INTERVAL.total_seconds(),
        "options": {"expires": settings.HCS_SCHEDULER_INTERVAL.total_seconds()},
    },
    # One listing per cluster: launches to retry, phases to follow, jobs of no live attempt to cancel.
    "reconcile": {"task": "apps.control.jobs.reconcile_all", "schedule": 2.0, "options": {"expires": 2}},
    # Backend probe and node states (Slurm nodes, Kubernetes conditions) per cluster.
    "cluster-health": {"task": "apps.control.jobs.check_clusters", "schedule": 10.0, "options": {"expires": 10}},
    # New, resized and removed nodes and cards, read from each backend (admin: "Discover nodes" runs it now).
    "node-discovery": {"task": "apps.control.jobs.discover_nodes", "schedule": 300.0, "options": {"expires": 300}},
    "prune-backend-objects": {
        "task": "apps.control.jobs.prune_backend_objects",
        "schedule": 3600.0,
        "options": {"expires": 3600},
    },
    # Inference services on clusters without an HPA: desired replicas from GPU utilisation and request rates.
    "autoscale-services": {
        "task": "apps.control.jobs.autoscale_services",
        "schedule": 5.0,  # apps.control.autoscaling.INTERVAL_S
        "options": {"expires": 5},
    },
    # Inter-project capacity loans (seed 003): returns every tick, new loans at each VDC's own interval.
    "rebalancer": {
        "task": "apps.control.jobs.rebalance_capacity",
        "schedule": settings.HCS_REBALANCER_TICK.total_seconds(),
        "options": {"expires": settings.HCS_REBALANCER_TICK.total_seconds()},
    },
    "usage-metering": {"task": "apps.billing.jobs.meter_usage", "schedule": 60.0, "options": {"expires": 60}},
    # Quota, budget, idle cards, failures, services: alerts for the projects' members (apps/billing/project_alerts.py).
    "project-alerts": {
        "task": "apps.billing.jobs.refresh_project_alerts",
        "schedule": 60.0,
        "options": {"expires": 60},
    },
    "monthly-invoices": {
        "task": "apps.billing.jobs.generate_monthly_invoices",
        "schedule": 3600.0,
        "options": {"expires": 3600},
    },
}
