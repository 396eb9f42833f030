"""Prices, a clock and running tasks placed by the real scheduler, for the billing tests."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from decimal import Decimal

import pytest

from apps.billing.models import Account, PriceRule
from apps.clusters.models import GPUModel
from apps.control.scheduling import run_cycle
from apps.tasks.models import Task
from apps.tasks.services import submit_task

T0 = datetime(2026, 1, 5, 8, 0, tzinfo=UTC)


def at(**delta) -> datetime:
    """A moment relative to T0, e.g. at(minutes=30)."""
    return T0 + timedelta(**delta)


@pytest.fixture
def prices(world):
    """cpu 0.10/core-h, memory 0.01/GiB-h, A100-80G 10/card-h, and 8 per GPU-equivalent hour for other models."""
    a100 = GPUModel.objects.get(name="A100-80G")
    return {
        "cpu": PriceRule.objects.create(resource_type="cpu", price_per_hour=Decimal("0.10")),
        "memory": PriceRule.objects.create(resource_type="memory", price_per_hour=Decimal("0.01")),
        "a100": PriceRule.objects.create(resource_type="gpu", gpu_model=a100, price_per_hour=Decimal("10")),
        "gpu_eq": PriceRule.objects.create(resource_type="gpu_eq", price_per_hour=Decimal("8")),
    }


@pytest.fixture
def account(world):
    return Account.objects.create(project=world.project, balance=Decimal("1000"))


def start_task(world, gpu_spec="2(A100)", cpu="4", memory_gib="16", started=T0, **fields) -> Task:
    """Submit a task and let the scheduler place it; its run starts at ``started``."""
    fields.setdefault("kind", "training")
    fields.setdefault("name", "job")
    task = submit_task(
        world.member,
        project=world.project,
        queue=fields.pop("queue", "high"),
        command="sleep 1",
        gpu_spec=gpu_spec,
        cpu=Decimal(cpu),
        memory_gib=Decimal(memory_gib),
        **fields,
    )
    run_cycle(world.vdc.pk)
    task.refresh_from_db()
    assert task.status == "scheduled", task.pending_message
    Task.objects.filter(pk=task.pk).update(started_at=started, status="running")
    task.refresh_from_db()
    return task
