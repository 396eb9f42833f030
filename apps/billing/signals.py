"""Final accrual on stop, finish, failure and preemption: queued for the billing worker when a task changes."""

from __future__ import annotations

from django.dispatch import receiver

from apps.tasks.signals import task_changed
from hcsportal import redis_guard


@receiver(task_changed, dispatch_uid="billing-accrue-on-task-change")
def accrue_on_task_change(sender, task_ids: list[int], new: bool = False, **kwargs) -> None:
    """Queue a final accrual for tasks whose run ended unmetered; running tasks are metered every minute."""
    if new:
        return  # just submitted: no run to meter, and no query on the submit's path
    from apps.billing import jobs  # models load after the app registry
    from apps.billing.services import ended_runs_to_accrue

    for task_id in ended_runs_to_accrue(task_ids):
        if not redis_guard.enqueue(jobs.accrue_task, task_id, expires=None):
            return  # a broker outage only delays the accruals to the next metering pass
