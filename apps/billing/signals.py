"""Final accrual on stop, finish, failure and preemption: queued for the billing worker when a task changes."""

from __future__ import annotations

import logging

from django.dispatch import receiver

from apps.tasks.signals import task_changed

log = logging.getLogger(__name__)


@receiver(task_changed, dispatch_uid="billing-accrue-on-task-change")
def accrue_on_task_change(sender, task_ids: list[int], new: bool = False, **kwargs) -> None:
    """Queue a final accrual for tasks whose run ended unmetered; running tasks are metered every minute."""
    if new:
        return  # just submitted: no run to meter, and no query on the submit's path
    from apps.billing import jobs  # noqa: PLC0415 - models load after the app registry
    from apps.billing.services import ended_runs_to_accrue  # noqa: PLC0415

    for task_id in ended_runs_to_accrue(task_ids):
        try:
            jobs.accrue_task.delay(task_id)
        except Exception as exc:  # noqa: BLE001 - a broker outage only delays the accrual to the next metering pass
            log.warning("accrual of task %s not queued (the metering job will catch up): %s", task_id, exc)
            return
