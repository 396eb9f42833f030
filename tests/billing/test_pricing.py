"""Price arithmetic at its boundaries: discount tiers, minimum billing period, fractional cards, equivalents."""

from __future__ import annotations

from datetime import timedelta
from decimal import Decimal

import pytest
from django.core.exceptions import ValidationError
from django.db import connection
from django.test.utils import CaptureQueriesContext

from apps.billing import services
from apps.billing.models import PriceRule, UsageRecord
from apps.billing.pricing import hours, quantity, tiered_cost
from apps.billing.services import accrue_task, hourly_price_of_request, task_costs
from apps.clusters.models import GPUModel
from apps.tasks.models import Task
from tests.billing.conftest import T0, at, start_task
from tests.factories import DeviceFactory, NodeFactory, TaskFactory

D = Decimal
TIERS = [{"from_hours": 100, "percent": 10}, {"from_hours": 1000, "percent": 25}]


def test_hours_are_exact_to_the_microsecond():
    assert hours(timedelta(minutes=90)) == D("1.5")
    assert quantity(D("3"), timedelta(seconds=1)) == D("0.000833")


def test_no_tiers_is_price_times_amount():
    assert tiered_cost(D("2"), D("10"), D("5000")) == D("20.0000")


def test_usage_below_the_first_tier_is_undiscounted():
    assert tiered_cost(D("2"), D("99"), D("0"), TIERS) == D("198.0000")


def test_the_hour_a_tier_starts_is_discounted():
    # Accumulated exactly 100 h: the next hour is past the boundary and gets 10% off.
    assert tiered_cost(D("2"), D("1"), D("100"), TIERS) == D("1.8000")


def test_an_interval_crossing_a_boundary_is_split_there():
    # 99.5 -> 100.5: half an hour at full price, half an hour at 10% off.
    assert tiered_cost(D("2"), D("1"), D("99.5"), TIERS) == D("1.9000")


def test_an_interval_crossing_two_boundaries_gets_three_rates():
    # 50 -> 1050: 50 h full, 900 h at 10% off, 50 h at 25% off.
    assert tiered_cost(D("1"), D("1000"), D("50"), TIERS) == D("50") + D("810") + D("37.5")


def test_running_accrual_prices_cpu_memory_and_cards(world, prices, account):
    task = start_task(world, gpu_spec="2(A100)", cpu="4", memory_gib="16")
    accrue_task(task.pk, now=at(hours=1))
    records = {r.resource_type: r for r in UsageRecord.objects.filter(task=task)}
    assert records["cpu"].quantity == D("4") and records["cpu"].cost == D("0.4000")
    assert records["memory"].quantity == D("16") and records["memory"].cost == D("0.1600")
    assert records["gpu"].quantity == D("2") and records["gpu"].cost == D("20.0000")
    # Equivalents are metered too, but a model with its own price is never charged twice.
    assert records["gpu_eq"].quantity == D("2") and records["gpu_eq"].cost == 0
    account.refresh_from_db()
    assert account.balance == D("1000") - D("20.56")


def test_run_shorter_than_minimum_period_is_billed_as_that_long(world, prices, account):
    PriceRule.objects.filter(pk=prices["a100"].pk).update(min_billing_minutes=10)
    task = start_task(world, gpu_spec="1(A100)")
    Task.objects.filter(pk=task.pk).update(status="completed", finished_at=at(minutes=3))
    accrue_task(task.pk, now=at(minutes=5))
    gpu = UsageRecord.objects.get(task=task, resource_type="gpu")
    assert (gpu.period_start, gpu.period_end) == (T0, at(minutes=10))
    assert gpu.quantity == D("0.166667")
    cpu = UsageRecord.objects.get(task=task, resource_type="cpu")
    assert cpu.period_end == at(minutes=3)  # cpu keeps the default one-minute minimum


def test_minimum_period_tops_up_only_the_rest_after_earlier_intervals(world, prices, account):
    PriceRule.objects.filter(pk=prices["a100"].pk).update(min_billing_minutes=10)
    task = start_task(world, gpu_spec="1(A100)")
    accrue_task(task.pk, now=at(minutes=4))
    Task.objects.filter(pk=task.pk).update(status="stopped", finished_at=at(minutes=6))
    accrue_task(task.pk, now=at(minutes=7))
    gpu = UsageRecord.objects.filter(task=task, resource_type="gpu").order_by("period_start")
    assert [(r.period_start, r.period_end) for r in gpu] == [(T0, at(minutes=4)), (at(minutes=4), at(minutes=10))]
    assert sum(r.quantity for r in gpu) == D("0.166667")


def test_run_exactly_as_long_as_the_minimum_is_not_topped_up(world, prices, account):
    PriceRule.objects.filter(pk=prices["a100"].pk).update(min_billing_minutes=10)
    task = start_task(world, gpu_spec="1(A100)")
    Task.objects.filter(pk=task.pk).update(status="completed", finished_at=at(minutes=10))
    accrue_task(task.pk, now=at(minutes=12))
    gpu = UsageRecord.objects.get(task=task, resource_type="gpu")
    assert gpu.period_end == at(minutes=10)


def test_fractional_card_on_a_model_priced_in_equivalents(world, prices, account):
    t4 = GPUModel.objects.get(name="T4")
    node = NodeFactory(cluster=world.cluster, name="t4-node")
    DeviceFactory(node=node, index=0, gpu_model=t4)
    task = start_task(world, gpu_spec="0.5(T4)", cpu="1", memory_gib="1")
    accrue_task(task.pk, now=at(hours=2))
    gpu = UsageRecord.objects.get(task=task, resource_type="gpu")
    eq = UsageRecord.objects.get(task=task, resource_type="gpu_eq")
    assert gpu.gpu_model == t4 and gpu.quantity == D("1") and gpu.cost == 0  # half a card for two hours
    assert eq.quantity == D("1") * t4.exchange_rate
    assert eq.cost == (eq.quantity * D("8")).quantize(D("0.0001"))


def test_discount_applies_from_the_projects_accumulated_hours(world, prices, account):
    PriceRule.objects.filter(pk=prices["a100"].pk).update(discount_tiers=[{"from_hours": 3, "percent": 50}])
    task = start_task(world, gpu_spec="2(A100)")
    accrue_task(task.pk, now=at(hours=1))  # 2 card-hours, full price
    accrue_task(task.pk, now=at(hours=2))  # 2 more: 1 at full price, 1 past the 3 h boundary at half
    costs = [r.cost for r in UsageRecord.objects.filter(task=task, resource_type="gpu").order_by("period_start")]
    assert costs == [D("20.0000"), D("15.0000")]


def test_vdc_price_overrides_the_global_one(world, prices, account):
    PriceRule.objects.create(resource_type="cpu", vdc=world.vdc, price_per_hour=D("1"))
    task = start_task(world, gpu_spec="1(A100)", cpu="2")
    accrue_task(task.pk, now=at(hours=1))
    assert UsageRecord.objects.get(task=task, resource_type="cpu").cost == D("2.0000")


def test_hourly_price_of_a_request(world, prices):
    price = hourly_price_of_request(world.vdc, D("4"), D("16"), "2(A100)", 2)
    assert price == (D("0.4") + D("0.16") + D("20")) * 2


def test_hourly_price_of_any_model_is_the_cheapest_candidate(world, prices):
    # T4 at 8/eq-h x 0.21 is far cheaper than an A100 at 10/h.
    price = hourly_price_of_request(world.vdc, 0, 0, "1", 1)
    assert price == (D("8") * GPUModel.objects.get(name="T4").exchange_rate).quantize(D("0.0001"))


def test_hourly_price_of_a_fractional_request_in_equivalents(world, prices):
    price = hourly_price_of_request(world.vdc, 0, 0, "0.5(T4)", 1)
    assert price == (D("0.5") * GPUModel.objects.get(name="T4").exchange_rate * 8).quantize(D("0.0001"))


def test_hourly_price_is_none_without_prices(world):
    assert hourly_price_of_request(world.vdc, D("4"), D("16"), "1(A100)", 1) is None


def test_hourly_price_rejects_a_bad_spec(world, prices):
    with pytest.raises(ValidationError):
        hourly_price_of_request(world.vdc, 1, 1, "2(nosuchgpu)", 1)


def test_task_costs_in_one_query(world, prices, account):
    running = start_task(world, gpu_spec="1(A100)")
    accrue_task(running.pk, now=at(hours=1))
    idle = TaskFactory(project=world.project, owner=world.member, vdc=world.vdc, queue=world.high)
    with CaptureQueriesContext(connection) as queries:
        costs = task_costs([running.pk, idle.pk])
    assert len(queries.captured_queries) == 1
    assert costs == {running.pk: D("10.5600"), idle.pk: D("0")}  # 4 cores, 16 GiB, one A100 for an hour


def test_demo_prices_seed_once_and_open_accounts_with_credit(world):
    services.seed_demo_prices()
    services.seed_demo_prices()
    assert PriceRule.objects.count() == 4
    assert hourly_price_of_request(world.vdc, D("4"), D("16"), "2(A100)", 2) == D("48.7200")
    account = world.project.account
    assert (account.balance, account.credit_limit) == (D("1000"), D("100"))
    assert account.transactions.get().kind == "credit"
