"""A portal queue's Volcano Queue on the API emulator: made with its weight, capability, guarantee and reclaimable,
kept in step (removed limits removed), never taken over from someone else, and valid against Volcano's CRD."""

from __future__ import annotations

import pytest

from apps.clusters.executors import k8s_manifests as m
from apps.clusters.executors.base import ExecutorError
from tests.executors_k8s import schemas
from tests.executors_k8s.emulation import stored
from tests.executors_k8s.specs import spec, volcano_queue

QUEUES = "scheduling.volcano.sh/v1beta1/queues"


def queues(emulator) -> dict[str, dict]:
    return stored(emulator, QUEUES, None)


def test_a_portal_queue_gets_its_volcano_queue_with_weight_capability_and_guarantee(executor, emulator):
    executor.ensure_volcano_queue(volcano_queue())
    made = queues(emulator)["hcs-main-research"]
    assert made["spec"] == {
        "weight": 100,
        "reclaimable": True,
        "capability": {"nvidia.com/gpu": "8"},
        "guarantee": {"resource": {"nvidia.com/gpu": "2"}},
    }
    assert made["metadata"]["labels"]["hcs.io/queue-id"] == "3"
    schemas.validate(m.volcano_queue_manifest(volcano_queue()))


def test_changes_reach_the_volcano_queue_and_limits_no_longer_set_are_removed(executor, emulator):
    executor.ensure_volcano_queue(volcano_queue())
    changed = volcano_queue(
        weight=250,
        reclaimable=False,
        capability={"cambricon.com/mlu": "22"},
        guarantee={},
        annotations={m.NOTES_ANNOTATION: "nvidia.com/gpu: not limited"},
    )
    executor.ensure_volcano_queue(changed)
    made = queues(emulator)["hcs-main-research"]
    assert made["spec"] == {"weight": 250, "reclaimable": False, "capability": {"cambricon.com/mlu": "22"}}
    assert made["metadata"]["annotations"][m.NOTES_ANNOTATION] == "nvidia.com/gpu: not limited"
    schemas.validate(made)
    executor.ensure_volcano_queue(volcano_queue(capability={}))
    assert "capability" not in queues(emulator)["hcs-main-research"]["spec"]


@pytest.mark.parametrize(
    "theirs",
    [{}, {"hcs.io/installation": "another"}, {"hcs.io/queue-id": "4"}],
    ids=["not-ours", "other-installation", "other-queue"],
)
def test_a_volcano_queue_the_portal_did_not_make_for_this_queue_is_never_taken_over(executor, emulator, theirs):
    labels = {**volcano_queue()["labels"], **theirs} if theirs else {"team": "ml"}
    emulator.objects[QUEUES, None, "hcs-main-research"] = {
        "apiVersion": "scheduling.volcano.sh/v1beta1",
        "kind": "Queue",
        "metadata": {"name": "hcs-main-research", "labels": labels},
        "spec": {"weight": 7},
    }
    with pytest.raises(ExecutorError, match="exists but was not made by this portal installation") as refused:
        executor.ensure_volcano_queue(volcano_queue())
    assert not refused.value.retryable
    assert queues(emulator)["hcs-main-research"]["spec"] == {"weight": 7}


def test_a_volcano_job_goes_to_its_queues_volcano_queue_made_before_it(executor, emulator):
    s = spec(instances=2, backend_flavour="volcano", settings={"volcano_queue": volcano_queue()})
    executor.submit(s)
    assert stored(emulator, "batch.volcano.sh/v1alpha1/jobs")[s.name]["spec"]["queue"] == "hcs-main-research"
    assert "hcs-main-research" in queues(emulator)
    # An Indexed Job (not Volcano) of the same settings makes no Volcano queue.
    emulator.objects.clear()
    executor.submit(spec(instances=2, settings={"volcano_queue": volcano_queue()}))
    assert queues(emulator) == {}
