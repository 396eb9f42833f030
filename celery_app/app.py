"""The Celery app configured from Django settings (CELERY_* names), and the beat schedule.

Job functions live with their apps (``apps/control/jobs.py``, ``apps/billing/jobs.py``) as shared tasks;
nothing imports this package but the worker, beat and the project's app config.
"""

import os

from celery import Celery
from django.conf import settings
from kombu import Queue

from celery_app import broker

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "hcsportal.settings")

broker.install()
app = Celery("hcsportal")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.conf.include = ["apps.control.jobs", "apps.billing.jobs"]

# Three queues (docs/deploy.md "Workers"): the scheduling cycle and the launches it decides, the services'
# autoscaler, and everything else (reconciliation, health, discovery, forecasts, billing). Deployments give the
# first two a worker pool of their own, so a slow backend listing or a forecast fit never delays a scheduling
# decision or a scale-up; a worker started without ``-Q`` serves all three (one worker is enough to run).
SCHEDULING, AUTOSCALE, DEFAULT = "scheduling", "autoscale", "celery"
app.conf.task_default_queue = DEFAULT
app.conf.task_queues = [Queue(name) for name in (SCHEDULING, AUTOSCALE, DEFAULT)]
app.conf.task_routes = {
    "apps.control.jobs.run_scheduler": {"queue": SCHEDULING},
    "apps.control.jobs.launch": {"queue": SCHEDULING},
    "apps.control.jobs.follow_launches": {"queue": SCHEDULING},
    "apps.control.jobs.autoscale_services": {"queue": AUTOSCALE},
    "apps.control.jobs.apply_autoscaling": {"queue": AUTOSCALE},
}

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
    "forget-idempotency-keys": {
        "task": "apps.control.jobs.forget_idempotency_keys",
        "schedule": 3600.0,
        "options": {"expires": 3600},
    },
    # Inference services on clusters without an HPA: desired replicas from GPU utilisation and request rates.
    "autoscale-services": {
        "task": "apps.control.jobs.autoscale_services",
        "schedule": 5.0,  # apps.control.autoscaling.INTERVAL_S
        "options": {"expires": 5},
    },
    # Forecasts of predictive services (one fit per service and 5-minute bucket) and their backtests, off the
    # autoscaler's loop: apps.control.autoscaling.refit_forecasts.
    "refit-forecasts": {"task": "apps.control.jobs.refit_forecasts", "schedule": 60.0, "options": {"expires": 60}},
    # Inter-project capacity loans (docs/rules.md#rebalancing): returns every tick, new loans at each VDC's own
    # interval.
    "rebalancer": {
        "task": "apps.control.jobs.rebalance_capacity",
        "schedule": settings.HCS_REBALANCER_TICK.total_seconds(),
        "options": {"expires": settings.HCS_REBALANCER_TICK.total_seconds()},
    },
    # Per-task utilisation history, idle autostop of dev environments, retention (apps/tasks/usage.py).
    "task-usage": {"task": "apps.control.jobs.record_task_usage", "schedule": 60.0, "options": {"expires": 60}},
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
