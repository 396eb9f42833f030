"""Per-project namespaces through the control plane, against the Kubernetes API emulator: a task of a project
lands in that project's namespace, made and labelled by the portal with a ResourceQuota mirroring the project's
quota; quota changes are carried over; a backend failure while ensuring the namespace keeps the task queued with
a backend error on its timeline."""

from __future__ import annotations

from decimal import Decimal

import kmock
import pytest

from apps.clusters.isolation import kubernetes_isolation, project_limits
from apps.clusters.models import GPUModel
from apps.control import jobs
from apps.control.jobspec import job_spec
from apps.control.models import Installation, ObjectState
from apps.control.reconcile import reconcile_cluster
from apps.control.scheduling import run_cycle
from apps.tasks.choices import EventKind
from tests.control.drive import intent, launch
from tests.control.test_kubernetes_control import k8s, submit  # noqa: F401 - the Kubernetes world fixture
from tests.executors_k8s.conftest import emulator  # noqa: F401 - the kmock fixture
from tests.executors_k8s.emulation import stored
from tests.factories import DeviceFactory, NodeFactory

PROJECT_NS = "hcs-alpha"
QUOTAS = "v1/resourcequotas"


@pytest.fixture
def per_project(k8s):  # noqa: F811
    k8s.k8s_cluster.project_isolation = "per_project"
    k8s.k8s_cluster.save()
    return k8s


def quota_hard(emulator) -> dict | None:  # noqa: F811
    quota = stored(emulator, QUOTAS, PROJECT_NS).get("hcs-project-quota")
    return quota["spec"]["hard"] if quota else None


def test_task_runs_in_its_project_namespace_under_the_mirrored_quota(per_project):
    world, api = per_project, per_project.emulator
    task = submit(world, name="iso", gpu_spec="2(A100)", queue="high")
    run_cycle(world.vdc.pk)
    assert launch(task) == world.k8s_cluster.pk
    task.refresh_from_db()
    namespace, workload, name = task.external_id.split("/")
    assert namespace == PROJECT_NS
    assert name in stored(api, "batch/v1/jobs", PROJECT_NS)
    ns = api.objects["v1/namespaces", None, PROJECT_NS].raw
    assert ns["metadata"]["labels"] == {
        "app.kubernetes.io/managed-by": "hcs-portal",
        "hcs.io/installation": Installation.current().uid.hex,
        "hcs.io/project": "alpha",
        "hcs.io/project-id": str(world.project.pk),
    }
    # The world's quota: limit 64 cores, 256 GiB, 8 GPU-equivalents. A100 is shareable (HAMi counts one card
    # per share), so its card count is not limited, and the quota says why.
    assert quota_hard(api) == {"requests.cpu": "64", "requests.memory": "256Gi"}
    quota = stored(api, QUOTAS, PROJECT_NS)["hcs-project-quota"]
    assert "nvidia.com/gpu: not limited" in quota["metadata"]["annotations"]["hcs.io/quota-notes"]
    # The job's pods in the project namespace are followed like any other.
    template_labels = stored(api, "batch/v1/jobs", PROJECT_NS)[name]["spec"]["template"]["metadata"]["labels"]
    api.objects["v1/pods", PROJECT_NS, f"{name}-0"] = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": f"{name}-0", "namespace": PROJECT_NS, "labels": template_labels},
        "spec": {"containers": [{"name": "main", "image": "busybox"}], "nodeName": "k8s-node-1"},
        "status": {"phase": "Running"},
    }
    api.objects["batch/v1/jobs", PROJECT_NS, name].patch({"status": {"active": 1}})
    result = reconcile_cluster(world.k8s_cluster.pk)
    assert result.reachable and not result.untracked, result
    task.refresh_from_db()
    assert task.status == "running", task.status_message


def test_shared_cluster_keeps_its_one_namespace(k8s):  # noqa: F811
    task = submit(k8s, name="iso", gpu_spec="1(A100)", queue="high")
    run_cycle(k8s.vdc.pk)
    task.refresh_from_db()
    spec = job_spec(task, Installation.current().uid.hex)
    assert spec.namespace == "gpu-jobs"
    assert "isolation" not in spec.settings


def test_cards_mirrored_per_resource_by_the_lowest_exchange_rate(per_project):
    world = per_project
    node = NodeFactory(cluster=world.k8s_cluster, name="mlu-node")
    mlu370 = GPUModel.objects.get(name="MLU370")  # 0.35, not shareable
    older = GPUModel.objects.create(
        name="MLU290",
        vendor="cambricon",
        vram_gib=Decimal(32),
        exchange_rate=Decimal("0.2"),
        resource_name="cambricon.com/mlu",
        visible_devices_env="MLU_VISIBLE_DEVICES",
    )
    DeviceFactory(node=node, index=0, gpu_model=mlu370)
    DeviceFactory(node=node, index=1, gpu_model=older)
    DeviceFactory(node=node, index=2, gpu_model=GPUModel.objects.get(name="DCU-Z100"))  # 0.4
    limits = project_limits(world.k8s_cluster, world.project)
    # 8 GPU-equivalents: 40 of the cheapest MLU (never fewer cards than the portal allows), 20 DCUs.
    assert limits.gpus == {"cambricon.com/mlu": 40, "hygon.com/dcu": 20}
    hard = kubernetes_isolation(world.k8s_cluster, world.project, "x" * 32)["quota"]
    assert hard["requests.cambricon.com/mlu"] == "40" and hard["requests.hygon.com/dcu"] == "20"
    assert "requests.nvidia.com/gpu" not in hard


def test_quota_changes_are_carried_to_the_namespace(per_project, monkeypatch, django_capture_on_commit_callbacks):
    world, api = per_project, per_project.emulator
    queued = []
    monkeypatch.setattr("apps.control.triggers.enqueue", lambda job, *args, **kw: queued.append((job, args)))
    node = NodeFactory(cluster=world.k8s_cluster, name="dcu-node")
    DeviceFactory(node=node, index=0, gpu_model=GPUModel.objects.get(name="DCU-Z100"))
    task = submit(world, name="iso", gpu_spec="1(A100)", queue="high")
    run_cycle(world.vdc.pk)
    assert launch(task) == world.k8s_cluster.pk
    assert quota_hard(api)["requests.hygon.com/dcu"] == "20"

    quota = world.quota
    quota.limit_cpu, quota.limit_memory_gib, quota.limit_gpu = Decimal("32.5"), Decimal("100"), Decimal("4")
    with django_capture_on_commit_callbacks(execute=True):
        quota.save()
    assert queued == [(jobs.sync_project_isolation.name, (world.project.pk, world.vdc.pk))]
    jobs.sync_project_isolation(world.project.pk, world.vdc.pk)
    assert quota_hard(api) == {
        "requests.cpu": "32500m",
        "requests.memory": "100Gi",
        "requests.hygon.com/dcu": "10",
    }

    quota.enforce = False  # advisory: the portal limits nothing, so neither does the namespace
    with django_capture_on_commit_callbacks(execute=True):
        quota.save()
    jobs.sync_project_isolation(world.project.pk, world.vdc.pk)
    assert quota_hard(api) is None
    assert not api.objects["v1/namespaces", None, PROJECT_NS].deleted


def test_backend_error_while_ensuring_the_namespace_keeps_the_task_queued(per_project):
    world, api = per_project, per_project.emulator
    api["post /api/v1/namespaces"] << kmock.KubernetesError(
        status=503, reason="ServiceUnavailable", message="etcdserver: leader changed"
    )
    task = submit(world, name="iso", gpu_spec="1(A100)", queue="high")
    run_cycle(world.vdc.pk)
    assert launch(task) is None
    task.refresh_from_db()
    obj = intent(task)
    assert task.status == "scheduled" and obj.state == ObjectState.PENDING and obj.wanted
    assert "leader changed" in obj.message and "retrying" in obj.message
    event = task.events.filter(kind=EventKind.BACKEND_ERROR).get()
    assert "leader changed" in event.message and event.data == {"retryable": True}
    assert not stored(api, "batch/v1/jobs", PROJECT_NS)
