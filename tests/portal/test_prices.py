"""Prices from billing: the hourly price and cost so far in lists, and the estimate on the create forms."""

from decimal import Decimal

import pytest
from django.urls import reverse

from apps.billing.models import PriceRule
from apps.clusters.models import GPUModel
from apps.tasks.services import submit_task
from tests.factories import ClusterFactory, node_with_every_model

pytestmark = pytest.mark.django_db


@pytest.fixture
def prices(world):
    PriceRule.objects.create(resource_type="cpu", price_per_hour=Decimal("0.5"))
    PriceRule.objects.create(resource_type="gpu", gpu_model=GPUModel.objects.get(name="A100-80G"), price_per_hour=10)


def test_lists_show_the_hourly_price_of_each_task(client, world, prices):
    # A gang of two: the VDC gets a Slurm cluster (the local one runs single-instance jobs).
    node_with_every_model(ClusterFactory(vdc=world.vdc, name="slurm-1", cluster_type="slurm"))
    submit_task(
        world.member,
        project=world.project,
        queue="high",
        name="job",
        kind="training",
        gpu_spec="2(A100)",
        cpu=4,
        instances=2,
        command="python train.py",
    )
    client.force_login(world.member)
    response = client.get(reverse("portal:compute-tasks"))
    task = response.context["tasks"][0]
    assert task.hourly_price == Decimal("44.00")  # (4 x 0.5 + 2 x 10) x 2
    assert "44.00" in response.content.decode()


def test_price_column_shows_a_dash_without_prices(client, world):
    submit_task(
        world.member,
        project=world.project,
        queue="high",
        name="job",
        kind="training",
        gpu_spec="1(A100)",
        command="python train.py",
    )
    client.force_login(world.member)
    task = client.get(reverse("portal:compute-tasks")).context["tasks"][0]
    assert task.hourly_price is None and task.cost == 0


def test_price_estimate_for_the_create_form(client, world, prices):
    client.force_login(world.member)
    url = reverse("portal:price-estimate")
    query = {"vdc": world.vdc.pk, "cpu": "2", "memory_gib": "8", "gpu_spec": "1(A100)", "instances": "1"}
    expected = {"hourly_price": "11.00", "currency": "CNY", "display": "11.00 CNY", "minimum_minutes": 1}
    assert client.get(url, query).json() == {**expected, "error": ""}
    bad = client.get(url, {**query, "gpu_spec": "1(A100"}).json()
    assert bad["hourly_price"] is None and bad["error"]


def test_price_estimate_ignores_vdcs_the_user_has_no_quota_in(client, world, prices):
    client.force_login(world.outsider)
    other = world.vdc.__class__.objects.create(name="elsewhere")
    query = {"vdc": other.pk, "cpu": "2", "gpu_spec": "1(A100)"}
    assert client.get(reverse("portal:price-estimate"), query).json()["hourly_price"] is None


def test_price_estimate_states_the_minimum_billing_period(client, world, prices):
    PriceRule.objects.filter(resource_type="gpu").update(min_billing_minutes=15, price_per_hour=Decimal("1234.5"))
    client.force_login(world.member)
    query = {"vdc": world.vdc.pk, "cpu": "2", "memory_gib": "8", "gpu_spec": "1(A100)", "instances": "1"}
    body = client.get(reverse("portal:price-estimate"), query).json()
    assert (body["display"], body["minimum_minutes"]) == ("1,235.50 CNY", 15)
