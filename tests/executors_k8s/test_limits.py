"""A Kubernetes job is held to its request: container limits from the task's cores and memory, checked against the
official schemas; and a container the kernel killed for memory fails the task with the limit it hit."""

from __future__ import annotations

import pytest

from apps.clusters.executors import k8s_manifests as m
from apps.clusters.executors.base import Failure, JobPhase
from tests.executors_k8s import schemas
from tests.executors_k8s.emulation import stored
from tests.executors_k8s.specs import A100, on_node, spec

NS = "gpu-jobs"
OOM_KILLED = {
    "name": m.CONTAINER_NAME,
    "ready": False,
    "restartCount": 0,
    "image": "busybox:1.36",
    "imageID": "",
    "state": {"terminated": {"exitCode": 137, "reason": "OOMKilled", "finishedAt": "2026-11-27T05:00:00Z"}},
}


def workload_container(workload: dict) -> dict:
    pod = workload["spec"] if workload["kind"] == "Pod" else workload["spec"]["template"]["spec"]
    return pod["containers"][0]


@pytest.mark.parametrize(
    "overrides",
    [
        {"kind": "dev_env", "cpu": 2, "memory_gib": 0.5},
        {
            "instances": 2,
            "cpu": 0.5,
            "memory_gib": 3,
            "gpus_per_instance": 1,
            "gpu_model": A100,
            "placements": on_node("n1", 0, instances=2),
        },
        {"kind": "inference", "cpu": 1.25, "memory_gib": 16, "secret_files": {"/tmp/creds/key": "k"}},
    ],
    ids=["dev_env", "training", "inference"],
)
def test_every_workload_holds_its_container_to_the_request_and_passes_the_official_schemas(overrides):
    s = spec(**overrides)
    manifests = m.build_manifests(s, NS, ingress_domain="apps.example.org")
    resources = workload_container(manifests[0])["resources"]
    cpu = str(int(s.cpu)) if s.cpu == int(s.cpu) else f"{int(s.cpu * 1000)}m"
    memory = f"{int(s.memory_gib * 1024)}Mi"
    assert {k: v for k, v in resources["limits"].items() if k in ("cpu", "memory")} == {"cpu": cpu, "memory": memory}
    assert resources["requests"]["memory"] == memory  # requests = limits: the scheduler reserves what it may use
    secret = m.secret_manifest(s, NS)
    for manifest in [*manifests, *([secret] if secret else [])]:
        schemas.validate(manifest)


def test_a_pod_killed_for_memory_fails_with_the_limit_it_asked_for(executor, emulator):
    s = spec(kind="dev_env", command="sleep 1d", memory_gib=0.5)
    ext_id = executor.submit(s)
    emulator.objects["v1/pods", NS, s.name].patch({"status": {"phase": "Failed", "containerStatuses": [OOM_KILLED]}})

    state = executor.status(ext_id)

    assert (state.phase, state.failure, state.exit_code) == (JobPhase.FAILED, Failure.OUT_OF_MEMORY, 137)
    assert state.message == "exceeded its memory limit of 0.5 GiB (out of memory): OOMKilled"


def test_a_training_job_whose_rank_was_killed_for_memory_fails_with_the_reason(executor, emulator):
    s = spec(instances=2, memory_gib=2)
    ext_id = executor.submit(s)
    template = stored(emulator, "batch/v1/jobs")[s.name]["spec"]["template"]
    for index, status in ((0, {"phase": "Running"}), (1, {"phase": "Failed", "containerStatuses": [OOM_KILLED]})):
        name = f"{s.name}-{index}-x"  # as the Job controller makes them: the template's labels and containers
        emulator.objects["v1/pods", NS, name] = {
            "apiVersion": "v1",
            "kind": "Pod",
            "status": status,
            "metadata": {"name": name, "namespace": NS, **template["metadata"]},
            "spec": template["spec"],
        }
    failed = {
        "type": "Failed",
        "status": "True",
        "reason": "PodFailurePolicy",
        "message": "Container main for pod gpu-jobs/x-1 failed with exit code 137",
    }
    emulator.objects["batch/v1/jobs", NS, s.name].patch({"status": {"failed": 1, "conditions": [failed]}})

    state = executor.status(ext_id)

    assert (state.phase, state.failure) == (JobPhase.FAILED, Failure.OUT_OF_MEMORY)
    assert state.message.startswith("exceeded its memory limit of 2 GiB (out of memory): PodFailurePolicy: ")
