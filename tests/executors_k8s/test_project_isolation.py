"""Per-project namespaces on Kubernetes, against the kmock API emulator: the Namespace and ResourceQuota the
portal makes, jobs landing in their project's namespace, listings reaching every project namespace, quota
changes carried over, and namespaces the portal did not make left alone."""

from __future__ import annotations

import kmock
import pytest

from apps.clusters.executors.base import ExecutorError, JobPhase
from apps.clusters.executors.kubernetes import KubernetesExecutor
from apps.clusters.executors.projects import (
    QUOTA_NAME,
    ProjectLimits,
    project_backend_name,
    resource_quota_hard,
    slurm_grp_tres,
)
from tests.executors_k8s.emulation import stored
from tests.executors_k8s.specs import A100, spec

INSTALLATION = "0123456789abcdef0123456789abcdef"
OTHER_INSTALLATION = "f" * 32
PROJECT_NS = "hcs-vision"
FORBIDDEN = kmock.KubernetesError(status=403, reason="Forbidden", message='User "hcs" cannot list namespaces')


@pytest.fixture
def per_project(api_client) -> KubernetesExecutor:
    return KubernetesExecutor(api_client, namespace="gpu-jobs", per_project=True)


def isolation(hard: dict | None, namespace: str = PROJECT_NS, installation: str = INSTALLATION) -> dict:
    return {
        "namespace": namespace,
        "labels": {
            "app.kubernetes.io/managed-by": "hcs-portal",
            "hcs.io/installation": installation,
            "hcs.io/project": "vision",
        },
        "quota": hard,
        "annotations": {},
    }


def namespaces(emulator) -> dict[str, dict]:
    return {
        name: obj.raw
        for (res, _, name), obj in emulator.objects.items()
        if res.plural == "namespaces" and not obj.deleted
    }


def test_project_names_are_dns_labels_stable_and_distinct():
    assert project_backend_name("hcs-", "vision") == "hcs-vision"
    assert project_backend_name("hcs-", "vision") == project_backend_name("hcs-", "vision")
    upper, dashed = project_backend_name("hcs-", "Team_A"), project_backend_name("hcs-", "team-a")
    assert dashed == "hcs-team-a"
    assert upper != dashed and upper.startswith("hcs-team-a-")
    long = project_backend_name("hcs-", "x" * 64)
    assert len(long) <= 63 and long[-1].isalnum()
    assert project_backend_name("hcs-", "x" * 64) != project_backend_name("hcs-", "x" * 63)


def test_quota_mirrors_limits_as_requests_rounded_up():
    limits = ProjectLimits(cpu=12.5, memory_gib=48, gpus={"nvidia.com/gpu": 6, "huawei.com/Ascend910": 4})
    assert resource_quota_hard(limits) == {
        "requests.cpu": "12500m",
        "requests.memory": "48Gi",
        "requests.huawei.com/Ascend910": "4",
        "requests.nvidia.com/gpu": "6",
    }
    assert slurm_grp_tres(ProjectLimits(cpu=12.5, memory_gib=1.5, gpus={"gres/gpu": 3})) == {
        "cpu": 13,
        "mem": 1536,
        "gres/gpu": 3,
    }


def test_ensure_project_creates_labelled_namespace_and_quota(per_project, emulator):
    hard = {"requests.cpu": "16", "requests.memory": "64Gi", "requests.nvidia.com/gpu": "8"}
    per_project.ensure_project(isolation(hard))
    ns = namespaces(emulator)[PROJECT_NS]
    assert ns["metadata"]["labels"] == {
        "app.kubernetes.io/managed-by": "hcs-portal",
        "hcs.io/installation": INSTALLATION,
        "hcs.io/project": "vision",
    }
    quota = stored(emulator, "v1/resourcequotas", PROJECT_NS)[QUOTA_NAME]
    assert quota["spec"]["hard"] == hard
    assert quota["metadata"]["labels"]["hcs.io/project"] == "vision"
    # Idempotent: a second ensure changes nothing and fails on nothing.
    per_project.ensure_project(isolation(hard))
    assert stored(emulator, "v1/resourcequotas", PROJECT_NS)[QUOTA_NAME]["spec"]["hard"] == hard


def test_quota_change_updates_and_removes_the_resource_quota(per_project, emulator):
    per_project.ensure_project(
        isolation({"requests.cpu": "16", "requests.memory": "64Gi", "requests.nvidia.com/gpu": "8"})
    )
    smaller = {"requests.cpu": "4", "requests.memory": "16Gi"}
    per_project.ensure_project(isolation(smaller))
    assert stored(emulator, "v1/resourcequotas", PROJECT_NS)[QUOTA_NAME]["spec"]["hard"] == smaller
    per_project.ensure_project(isolation(None))  # the quota went advisory or away: nothing limits there
    assert QUOTA_NAME not in stored(emulator, "v1/resourcequotas", PROJECT_NS)
    assert PROJECT_NS in namespaces(emulator)


def test_a_namespace_the_portal_did_not_make_is_refused_not_taken(per_project, emulator):
    emulator.objects["v1/namespaces", None, PROJECT_NS] = {
        "apiVersion": "v1",
        "kind": "Namespace",
        "metadata": {"name": PROJECT_NS, "labels": {"team": "theirs"}},
    }
    with pytest.raises(ExecutorError, match="not made by this portal installation for this project") as caught:
        per_project.ensure_project(isolation({"requests.cpu": "4"}))
    assert not caught.value.retryable
    assert namespaces(emulator)[PROJECT_NS]["metadata"]["labels"] == {"team": "theirs"}
    assert QUOTA_NAME not in stored(emulator, "v1/resourcequotas", PROJECT_NS)


def test_a_namespace_of_another_project_by_the_same_name_is_refused(per_project, emulator):
    per_project.ensure_project({**isolation(None), "labels": {**isolation(None)["labels"], "hcs.io/project-id": "7"}})
    renamed = {**isolation({"requests.cpu": "4"}), "labels": {**isolation(None)["labels"], "hcs.io/project-id": "9"}}
    with pytest.raises(ExecutorError, match="for this project"):
        per_project.ensure_project(renamed)
    assert namespaces(emulator)[PROJECT_NS]["metadata"]["labels"]["hcs.io/project-id"] == "7"


def test_job_lands_in_its_project_namespace_and_is_listed_stopped_and_deleted(per_project, emulator):
    labels = {"hcs.io/installation": INSTALLATION, "hcs.io/task-uid": "a" * 32, "hcs.io/attempt": "1"}
    s = spec(
        gpus_per_instance=1,
        gpu_model=A100,
        namespace=PROJECT_NS,
        labels={**labels, "hcs.io/task-id": "1"},
        settings={"isolation": isolation({"requests.cpu": "8"})},
    )
    ext_id = per_project.submit(s)
    assert ext_id == f"{PROJECT_NS}/job/{s.name}"
    assert s.name in stored(emulator, "batch/v1/jobs", PROJECT_NS)
    assert s.name not in stored(emulator, "batch/v1/jobs", "gpu-jobs")
    assert stored(emulator, "v1/resourcequotas", PROJECT_NS)[QUOTA_NAME]["spec"]["hard"] == {"requests.cpu": "8"}
    # A job of another installation, in its own project namespace, is not listed.
    other = spec(
        namespace="hcs-other",
        labels={**labels, "hcs.io/installation": OTHER_INSTALLATION},
        settings={"isolation": isolation(None, "hcs-other", OTHER_INSTALLATION)},
    )
    per_project.submit(other)
    # And one in the cluster's own namespace (from before the cluster went per project) still is.
    shared = spec(labels={**labels, "hcs.io/task-uid": "b" * 32})
    per_project.submit(shared)
    listed = {state.external_id: state for state in per_project.list_by_owner({"hcs.io/installation": INSTALLATION})}
    assert set(listed) == {ext_id, f"gpu-jobs/job/{shared.name}"}
    assert listed[ext_id].phase == JobPhase.PENDING
    per_project.stop(ext_id)
    per_project.delete(ext_id)
    assert s.name not in stored(emulator, "batch/v1/jobs", PROJECT_NS)


def test_shared_cluster_without_namespace_rights_lists_its_own_namespace(executor, emulator):
    emulator["get /api/v1/namespaces"] << FORBIDDEN
    s = spec(labels={"hcs.io/installation": INSTALLATION, "hcs.io/task-uid": "c" * 32, "hcs.io/attempt": "1"})
    executor.submit(s)
    assert [state.name for state in executor.list_by_owner({"hcs.io/installation": INSTALLATION})] == [s.name]


def test_per_project_cluster_without_namespace_rights_fails_the_listing(per_project, emulator):
    emulator["get /api/v1/namespaces"] << FORBIDDEN
    with pytest.raises(ExecutorError, match="403"):
        per_project.list_by_owner({"hcs.io/installation": INSTALLATION})


def test_a_backend_failure_while_ensuring_is_retryable_and_submits_nothing(per_project, emulator):
    emulator[f"post /api/v1/namespaces/{PROJECT_NS}/resourcequotas"] << kmock.KubernetesError(
        status=503, reason="ServiceUnavailable", message="etcdserver: request timed out"
    )
    s = spec(namespace=PROJECT_NS, settings={"isolation": isolation({"requests.cpu": "8"})})
    with pytest.raises(ExecutorError, match="request timed out") as caught:
        per_project.submit(s)
    assert caught.value.retryable
    assert s.name not in stored(emulator, "batch/v1/jobs", PROJECT_NS)
