"""Kubernetes: task parameters reach every container, and a training task's checkpoint volume claim outlives
its attempts, mounted at the same path in every pod, until the task is deleted."""

from __future__ import annotations

import uuid

from apps.clusters.executors import k8s_manifests as m
from apps.clusters.executors.base import LABEL_INSTALLATION, LABEL_TASK_UID
from apps.clusters.executors.kubernetes import KubernetesExecutor
from tests.executors_k8s.emulation import stored
from tests.executors_k8s.specs import spec

UID = uuid.UUID(int=11).hex


def env_of(manifest: dict) -> dict[str, str]:
    template = manifest["spec"].get("template", manifest["spec"].get("tasks", [{}])[0].get("template"))
    pod = template["spec"] if template else manifest["spec"]
    return {e["name"]: e.get("value") for e in pod["containers"][0]["env"]}


def pod_of(manifest: dict) -> dict:
    return manifest["spec"]["template"]["spec"]


def with_checkpoints(api_client, **kwargs) -> KubernetesExecutor:
    return KubernetesExecutor(api_client, namespace="gpu-jobs", checkpoint_size_gib=20, **kwargs)


def test_every_workload_gets_the_tasks_parameters_as_variables(executor):
    training = executor.manifests(spec(task_id=77, settings={"epochs": 4, "batch_size": 32, "framework": "pytorch"}))[0]
    assert {k: env_of(training).get(k) for k in ("HCS_EPOCHS", "HCS_BATCH_SIZE", "HCS_FRAMEWORK", "HCS_TASK_ID")} == {
        "HCS_EPOCHS": "4",
        "HCS_BATCH_SIZE": "32",
        "HCS_FRAMEWORK": "pytorch",
        "HCS_TASK_ID": "77",
    }
    service = executor.manifests(spec(kind="inference", settings={"max_tokens": 256, "temperature": 0.7}))[0]
    assert {k: env_of(service)[k] for k in ("HCS_MAX_TOKENS", "HCS_TEMPERATURE", "HCS_PORT")} == {
        "HCS_MAX_TOKENS": "256",
        "HCS_TEMPERATURE": "0.7",
        "HCS_PORT": "8000",
    }
    dev = executor.manifests(spec(kind="dev_env", settings={"ide": "vscode"}))[0]
    assert (env_of(dev)["HCS_IDE"], env_of(dev)["HCS_PORT"]) == ("vscode", "8080")


def test_a_training_pod_mounts_the_tasks_checkpoint_claim_and_is_told_where(api_client):
    executor = with_checkpoints(api_client, checkpoint_storage_class="fast-rwx")
    job = executor.manifests(spec(task_uid=UID))[0]
    pod = pod_of(job)
    claim = m.checkpoint_claim_name(UID)
    assert {"name": m.CHECKPOINT_VOLUME, "persistentVolumeClaim": {"claimName": claim}} in pod["volumes"]
    assert {"name": m.CHECKPOINT_VOLUME, "mountPath": "/hcs/checkpoint"} in pod["containers"][0]["volumeMounts"]
    assert env_of(job)["HCS_CHECKPOINT_DIR"] == "/hcs/checkpoint"

    manifest = executor.checkpoint_claim(spec(task_uid=UID, instances=2))
    assert manifest["spec"] == {
        "accessModes": ["ReadWriteMany"],  # ranks on several nodes share it
        "resources": {"requests": {"storage": "20Gi"}},
        "storageClassName": "fast-rwx",
    }
    assert executor.checkpoint_claim(spec(task_uid=UID))["spec"]["accessModes"] == ["ReadWriteOnce"]


def test_the_checkpoint_path_names_the_mount_point(api_client):
    job = with_checkpoints(api_client).manifests(spec(task_uid=UID, settings={"checkpoint_path": "/workspace/c"}))[0]
    assert {"name": m.CHECKPOINT_VOLUME, "mountPath": "/workspace/c"} in pod_of(job)["containers"][0]["volumeMounts"]
    assert env_of(job)["HCS_CHECKPOINT_DIR"] == "/workspace/c"


def test_no_claim_without_a_size_on_the_cluster_nor_for_services(executor, api_client):
    job = executor.manifests(spec(task_uid=UID))[0]
    assert "HCS_CHECKPOINT_DIR" not in env_of(job) and executor.checkpoint_claim(spec(task_uid=UID)) is None
    service = with_checkpoints(api_client).manifests(spec(kind="inference", task_uid=UID))[0]
    assert "HCS_CHECKPOINT_DIR" not in env_of(service)


def test_the_claim_outlives_each_attempt_and_goes_with_the_task(api_client, emulator):
    executor = with_checkpoints(api_client)
    labels = {LABEL_INSTALLATION: "inst-1", LABEL_TASK_UID: UID}
    first = executor.submit(spec(task_id=91, attempt=1, task_uid=UID, labels=labels))
    claim = m.checkpoint_claim_name(UID)
    created = stored(emulator, "v1/persistentvolumeclaims")[claim]
    assert not created["metadata"].get("ownerReferences")  # the garbage collector must not take it with a job
    assert created["metadata"]["labels"][LABEL_TASK_UID] == UID
    assert m.LABEL_NAME not in created["metadata"]["labels"]  # delete() of one attempt does not select it

    executor.delete(first)  # the attempt was preempted: its objects go, the claim stays
    assert claim in stored(emulator, "v1/persistentvolumeclaims")
    executor.submit(spec(task_id=91, attempt=2, task_uid=UID, labels=labels))  # the next attempt mounts it again
    assert list(stored(emulator, "v1/persistentvolumeclaims")) == [claim]
    second = stored(emulator, "batch/v1/jobs")
    assert any(
        v.get("persistentVolumeClaim") == {"claimName": claim}
        for j in second.values()
        for v in j["spec"]["template"]["spec"]["volumes"]
    )

    executor.remove_checkpoints(UID, "vision")
    assert claim not in stored(emulator, "v1/persistentvolumeclaims")
    executor.remove_checkpoints(UID, "vision")  # already gone
