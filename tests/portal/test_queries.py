"""List pages take a bounded number of queries whether a project has 10 tasks or 1,000."""

from decimal import Decimal

import factory
import pytest
from django.urls import reverse

from apps.billing.models import PriceRule
from apps.clusters.models import GPUModel
from apps.tasks.models import TaskEvent
from tests.factories import TaskFactory

pytestmark = pytest.mark.django_db

MAX_QUERIES = {
    "portal:compute-tasks": 18,
    "portal:training-jobs": 18,
    "portal:instances": 9,
    "portal:dashboard": 23,
    "portal:task-queues": 13,  # + the VDCs' capacity reservations
}


# Pages price each distinct request shape once; lists mix a few.
SHAPES = ["1(A100)", "2(A100)", ""]


def make_tasks(world, n):
    PriceRule.objects.create(resource_type="cpu", price_per_hour=Decimal("0.5"))
    PriceRule.objects.create(resource_type="gpu", gpu_model=GPUModel.objects.get(name="A100-80G"), price_per_hour=10)
    statuses = ["queued", "running", "stopped", "preempted"]
    tasks = TaskFactory.create_batch(
        n,
        project=world.project,
        owner=world.member,
        vdc=world.vdc,
        queue=world.high,
        status=factory.Iterator(statuses),
        cluster=world.cluster,
        gpu_spec=factory.Iterator(SHAPES),
        placement=[
            {
                "node": world.node.pk,
                "node_name": "gpu-node-1",
                "gpu_model": "A100-80G",
                "devices": [{"id": world.node.devices.first().pk, "index": 0, "milli": 1000}],
            }
        ],
    )
    TaskEvent.objects.bulk_create(TaskEvent(task=t, kind="submitted", to_status="queued") for t in tasks)


@pytest.mark.parametrize("n", [10, 1000])
@pytest.mark.parametrize("name", list(MAX_QUERIES))
def test_list_pages_have_a_bounded_query_count(client, world, django_assert_max_num_queries, name, n):
    make_tasks(world, n)
    client.force_login(world.member)
    with django_assert_max_num_queries(MAX_QUERIES[name]):
        response = client.get(reverse(name), {"status": "queued"} if name != "portal:dashboard" else {})
    assert response.status_code == 200
