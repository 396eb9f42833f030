"""One Volcano Queue per Volcano-flavoured portal queue, on the Kubernetes API emulator through the control plane:
its weight, capability, guarantee and reclaimable from the portal queue, the queue's Volcano Jobs in it, and a
saved portal queue carried to it."""

from __future__ import annotations

from decimal import Decimal

import pytest

from apps.clusters.models import GPUModel
from apps.clusters.volcano import volcano_queue, volcano_weight
from apps.control import jobs
from apps.control.models import Installation
from apps.control.scheduling import run_cycle
from tests.control.drive import launch
from tests.control.test_kubernetes_control import k8s, submit  # noqa: F401 - the Kubernetes world fixture
from tests.executors_k8s import schemas
from tests.executors_k8s.conftest import emulator  # noqa: F401 - the kmock fixture
from tests.executors_k8s.emulation import stored
from tests.factories import DeviceFactory, NodeFactory, TaskQueueFactory

QUEUES = "scheduling.volcano.sh/v1beta1/queues"


@pytest.fixture
def research(k8s):  # noqa: F811
    """A medium Volcano queue (weight 2.5, 2 guaranteed and 8 at most GPU-equivalents) of a VDC whose Kubernetes
    cluster has 4 x A100 (shareable, 1.0) and 4 x MLU370 (whole cards, 0.35)."""
    node = NodeFactory(cluster=k8s.k8s_cluster, name="mlu-node", cpu=Decimal(64), memory_gib=Decimal(512))
    for index in range(4):
        DeviceFactory(node=node, index=index, gpu_model=GPUModel.objects.get(name="MLU370"))
    k8s.research = TaskQueueFactory(
        vdc=k8s.vdc,
        name="research",
        priority_class="medium",
        backend_flavour="volcano",
        weight=Decimal("2.5"),
        guaranteed_gpu=Decimal(2),
        max_gpu=Decimal(8),
    )
    return k8s


@pytest.mark.parametrize(("weight", "expected"), [("1", 100), ("2.5", 250), ("0", 1), ("0.01", 1), ("9999.99", 65535)])
def test_the_portal_weight_becomes_volcanos_whole_number_weight(weight, expected):
    assert volcano_weight(Decimal(weight)) == expected


def test_the_volcano_queue_mirrors_weight_capacity_and_class(research):
    world = research
    queue = volcano_queue(world.k8s_cluster, world.research, "i" * 32)
    assert queue["name"] == "hcs-main-research"
    assert (queue["weight"], queue["reclaimable"]) == (250, True)
    # MLU370 at 0.35: floor(8 / 0.35) = 22 cards at most, floor(2 / 0.35) = 5 guaranteed. The A100 is shared
    # (HAMi asks one card per share), so no card count bounds it, and the note says so.
    assert queue["capability"] == {"cambricon.com/mlu": "22"} and queue["guarantee"] == {"cambricon.com/mlu": "5"}
    assert queue["annotations"] == {
        "hcs.io/quota-notes": "nvidia.com/gpu: not limited (a shareable model counts one card per share)"
    }
    world.research.priority_class, world.research.max_gpu, world.research.guaranteed_gpu = "high", None, 0
    high = volcano_queue(world.k8s_cluster, world.research, "i" * 32)
    assert (high["reclaimable"], high["capability"], high["guarantee"]) == (False, {}, {})


def test_a_task_of_a_volcano_queue_runs_in_its_volcano_queue(research):
    world, api = research, research.emulator
    task = submit(world, name="gang", queue="research", instances=2, gpu_spec="1(A100)", expected_duration="01:00:00")
    run_cycle(world.vdc.pk)
    assert launch(task) == world.k8s_cluster.pk
    task.refresh_from_db()
    vcjob = stored(api, "batch.volcano.sh/v1alpha1/jobs")[task.external_id.rsplit("/", 1)[1]]
    assert vcjob["spec"]["queue"] == "hcs-main-research"
    made = stored(api, QUEUES, None)["hcs-main-research"]
    assert made["metadata"]["labels"] == {
        "app.kubernetes.io/managed-by": "hcs-portal",
        "hcs.io/installation": Installation.current().uid.hex,
        "hcs.io/queue-id": str(world.research.pk),
        "hcs.io/vdc": "main",
        "hcs.io/queue": "research",
    }
    assert made["spec"]["capability"] == {"cambricon.com/mlu": "22"}
    for manifest in (vcjob, made):
        schemas.validate(manifest)


def test_a_saved_volcano_queue_is_carried_to_its_clusters(research, monkeypatch, django_capture_on_commit_callbacks):
    world, api = research, research.emulator
    queued = []
    monkeypatch.setattr("apps.control.triggers.enqueue", lambda job, *args, **kw: queued.append((job, args)))
    world.research.weight, world.research.max_gpu = Decimal(4), Decimal("3.5")
    with django_capture_on_commit_callbacks(execute=True):
        world.research.save()
    assert queued == [(jobs.sync_volcano_queue.name, (world.research.pk,))]
    jobs.sync_volcano_queue(world.research.pk)
    spec = stored(api, QUEUES, None)["hcs-main-research"]["spec"]
    assert (spec["weight"], spec["capability"]) == (400, {"cambricon.com/mlu": "10"})
    # A queue of the default flavour has no Volcano queue to follow.
    with django_capture_on_commit_callbacks(execute=True):
        world.high.save()
    assert len(queued) == 1
