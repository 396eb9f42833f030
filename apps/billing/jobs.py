"""Celery jobs of billing: thin, they call apps.billing.services."""

from __future__ import annotations

from datetime import timedelta

from celery import shared_task


@shared_task(ignore_result=True)
def meter_usage() -> None:
    """Accrue usage of every running task and every run that ended since the last pass (beat, every minute)."""
    from apps.billing.services import meter_usage as run  # Django must be set up first

    run()


@shared_task(bind=True, ignore_result=True, max_retries=3)
def accrue_task(self, task_id: int) -> None:
    """Accrue one task now (queued when it starts, stops, finishes or is preempted); exactly once per interval."""
    from apps.billing.services import accrue_task as accrue

    try:
        accrue(task_id)
    except Exception as exc:  # retried; the metering pass accrues from the watermark anyway
        raise self.retry(exc=exc, countdown=min(2**self.request.retries, 30))


@shared_task(ignore_result=True)
def generate_monthly_invoices() -> None:
    """Issue last month's invoices of every account with usage in it (idempotent per period)."""
    from django.utils import timezone

    from apps.billing.services import generate_invoices, month_bounds

    this_month, _ = month_bounds(timezone.now())
    last_month, _ = month_bounds(this_month - timedelta(days=1))
    generate_invoices(last_month, this_month)


@shared_task(ignore_result=True)
def run_invoice_run(run_id: int) -> None:
    """Issue an admin's invoice run in the background (progress on the run, admin: Billing > Invoice runs)."""
    from apps.billing.services import run_invoice_run as run

    run(run_id)


@shared_task(ignore_result=True)
def refresh_project_alerts() -> None:
    """Evaluate the project members' alerts and push what fired, changed or cleared (beat, every minute)."""
    from apps.billing.project_alerts import refresh

    refresh()
