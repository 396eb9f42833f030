"""The cards a Kubernetes device plugin chose, read back into the placement (docs/kubernetes.md "Which cards a pod
got"), on the API emulator through the control plane: the scheduler's card indices are a count there, the kubelet's
report says which cards each pod holds, and the ledger follows without a card held twice."""

from __future__ import annotations

import pytest

from apps.clusters.models import Device
from apps.control import invariants
from apps.control.reconcile import reconcile_cluster
from apps.control.scheduling import run_cycle
from apps.tasks.models import Task
from tests.control.drive import intent, launch
from tests.control.test_kubernetes_control import k8s, submit  # noqa: F401 - the Kubernetes world fixture
from tests.executors_k8s.conftest import emulator  # noqa: F401 - the kmock fixture

NS = "gpu-jobs"


@pytest.fixture
def cards(k8s):  # noqa: F811
    """The node's four A100s, known by the UUIDs their node agent reported."""
    for device in Device.objects.filter(node=k8s.k8s_node):
        device.uuid = f"GPU-{device.index}"
        device.save()
    return k8s


def started(world, name: str, gpu_spec: str) -> Task:
    task = submit(world, name=name, kind="dev_env", gpu_spec=gpu_spec, queue="high")
    run_cycle(world.vdc.pk)
    assert launch(task) == world.k8s_cluster.pk
    task.refresh_from_db()
    return task


def kubelet_reports(world, task: Task, *uuids: str) -> None:
    """The dev environment's pod is bound and running, and its kubelet reports the cards the plugin gave it."""
    name = task.external_id.rsplit("/", 1)[1]
    resources = [{"resourceID": uuid, "health": "Healthy"} for uuid in uuids]
    status = {
        "name": "main",
        "ready": True,
        "restartCount": 0,
        "image": "busybox:1.36",
        "imageID": "",
        "allocatedResourcesStatus": [{"name": "nvidia.com/gpu", "resources": resources}],
    }
    world.emulator.objects["v1/pods", NS, name].patch(
        {"spec": {"nodeName": "k8s-node-1"}, "status": {"phase": "Running", "containerStatuses": [status]}}
    )


def indices(task: Task) -> list[int]:
    task.refresh_from_db()
    return sorted(d["index"] for entry in task.placement for d in entry["devices"])


def test_the_placement_follows_the_cards_the_device_plugin_gave(cards):
    world = cards
    first, second = started(world, "first", "2(A100)"), started(world, "second", "1(A100)")
    assert (indices(first), indices(second)) == ([0, 1], [2])
    # The plugin gave the first pod cards 1 and 2: the second task's placement named card 2, so it moves to the
    # card the first one no longer holds, until its own pod's report says which it got.
    kubelet_reports(world, first, "GPU-2", "GPU-1")
    reconcile_cluster(world.k8s_cluster.pk)
    assert (indices(first), indices(second)) == ([1, 2], [0])
    assert "reports the cards its device plugin gave: k8s-node-1: 1, 2" in first.events.last().message
    assert "cards renumbered" in second.events.last().message
    assert sorted(s["id"] for s in intent(first).shares) == sorted(d["id"] for d in first.placement[0]["devices"])
    kubelet_reports(world, second, "GPU-3")
    reconcile_cluster(world.k8s_cluster.pk)
    assert (indices(first), indices(second)) == ([1, 2], [3])
    assert first.allocated_gpu == 2 and second.allocated_gpu == 1
    assert invariants.check([world.k8s_cluster]) == []
    # Read again, the same report changes nothing.
    events = second.events.count()
    reconcile_cluster(world.k8s_cluster.pk)
    assert second.events.count() == events


@pytest.mark.parametrize(
    ("gpu_spec", "uuids"),
    [("1(A100)", ("GPU-UNKNOWN",)), ("1(A100)", ("GPU-1", "GPU-2")), ("0.5(A100)", ("GPU-3",))],
    ids=["a-card-the-portal-does-not-know", "more-cards-than-it-holds", "a-share"],
)
def test_a_report_that_does_not_add_up_leaves_the_placement(cards, gpu_spec, uuids):
    world = cards
    task = started(world, "one", gpu_spec)
    before = task.placement
    kubelet_reports(world, task, *uuids)
    reconcile_cluster(world.k8s_cluster.pk)
    task.refresh_from_db()
    assert task.placement == before and task.status == "running"
