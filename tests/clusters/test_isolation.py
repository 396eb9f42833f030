"""Per-project isolation settings of a cluster: the admin / API field and its rules, what a per-project Slurm
cluster mirrors of a quota, the job spec's account, and when a quota save queues a mirror update."""

from __future__ import annotations

from decimal import Decimal

import pytest

from apps.clusters.isolation import isolation_settings, project_limits, slurm_isolation
from apps.clusters.models import GPUModel
from apps.control import jobs
from apps.control.health import check_cluster_health
from apps.control.jobspec import job_spec
from apps.control.models import Installation
from tests.api.base import client_for
from tests.executors.test_slurm_accounts import no_accounting  # noqa: F401 - a slurmrestd without accounting
from tests.factories import ClusterFactory, DeviceFactory, NodeFactory, TaskFactory

CLUSTERS = "/api/v1/clusters/"


@pytest.fixture
def slurm(world):
    cluster = ClusterFactory(
        vdc=world.vdc,
        name="slurm",
        cluster_type="slurm",
        endpoint="http://127.0.0.1:9",
        namespace="hcs",
        project_isolation="per_project",
    )
    node = NodeFactory(cluster=cluster, name="slurm-node")
    DeviceFactory(node=node, index=0, gpu_model=GPUModel.objects.get(name="A100-80G"))  # 1.0, shareable
    DeviceFactory(node=node, index=1, gpu_model=GPUModel.objects.get(name="V100-32G"))  # 0.4
    return cluster


def test_isolation_is_set_and_shown_through_the_api(world):
    admin = client_for(world.admin)
    url = f"{CLUSTERS}{world.cluster.pk}/"
    assert admin.get(url).data["project_isolation"] == "shared"
    k8s = admin.post(
        CLUSTERS,
        {
            "vdc": world.vdc.pk,
            "name": "k8s",
            "cluster_type": "kubernetes",
            "endpoint": "https://k8s.example:6443",
            "project_isolation": "per_project",
            "isolation_prefix": "gpu-",
        },
        format="json",
    )
    assert k8s.status_code == 201, k8s.data
    assert (k8s.data["project_isolation"], k8s.data["isolation_prefix"]) == ("per_project", "gpu-")
    filtered = admin.get(CLUSTERS, {"project_isolation": "per_project"}).data["results"]
    assert [c["name"] for c in filtered] == ["k8s"]


@pytest.mark.parametrize("prefix", ["", "Hcs-", "1hcs-", "hcs_", "a" * 21])
def test_a_prefix_that_cannot_start_a_dns_label_is_refused(world, prefix):
    response = client_for(world.admin).patch(
        f"{CLUSTERS}{world.cluster.pk}/", {"isolation_prefix": prefix}, format="json"
    )
    assert response.status_code == 400 and "isolation_prefix" in response.data
    world.cluster.refresh_from_db()
    assert world.cluster.isolation_prefix == "hcs-"


def test_a_local_cluster_cannot_isolate_per_project(world):
    response = client_for(world.admin).patch(
        f"{CLUSTERS}{world.cluster.pk}/", {"project_isolation": "per_project"}, format="json"
    )
    assert response.status_code == 400 and "no namespaces or accounts" in str(response.data["project_isolation"])
    world.cluster.refresh_from_db()
    assert world.cluster.project_isolation == "shared"


def test_slurm_mirrors_cores_up_memory_in_mb_and_any_card_by_the_lowest_rate(world, slurm):
    world.quota.limit_cpu, world.quota.limit_memory_gib, world.quota.limit_gpu = (
        Decimal("20.5"),
        Decimal("100"),
        Decimal("3"),
    )
    world.quota.save()
    # Slurm gives a share a whole card, so the shareable A100 counts too; V100 (0.4) is the cheapest: 7 cards.
    assert slurm_isolation(slurm, world.project, "ab" * 16) == {
        "account": "hcs-alpha",
        "description": "HCS project alpha",
        "organization": f"hcs-abababababab-p{world.project.pk}",
        "grp_tres": {"cpu": 21, "mem": 102400, "gres/gpu": 7},
    }
    world.quota.enforce = False
    world.quota.save()
    assert project_limits(slurm, world.project) is None
    assert slurm_isolation(slurm, world.project, "ab" * 16)["grp_tres"] is None


def test_a_project_without_a_quota_in_the_vdc_mirrors_nothing(world, slurm):
    world.quota.delete()
    assert project_limits(slurm, world.project) is None


def test_job_spec_on_a_per_project_slurm_cluster_names_the_account_and_keeps_the_partition(world, slurm):
    task = TaskFactory(project=world.project, vdc=world.vdc, queue=world.high, cluster=slurm, gpu_spec="1(A100)")
    spec = job_spec(task, Installation.current().uid.hex)
    assert spec.namespace == "hcs"
    assert spec.settings["isolation"]["account"] == "hcs-alpha"
    slurm.project_isolation = "shared"
    slurm.save()
    task.refresh_from_db()
    assert "isolation" not in job_spec(task, Installation.current().uid.hex).settings
    assert isolation_settings(world.cluster, world.project, "x") is None  # local clusters never


def test_a_quota_save_queues_a_mirror_update_only_where_a_cluster_is_per_project(
    world, monkeypatch, django_capture_on_commit_callbacks
):
    queued = []
    monkeypatch.setattr("apps.control.triggers.enqueue", lambda job, *args, **kw: queued.append((job, args)))
    with django_capture_on_commit_callbacks(execute=True):
        world.quota.save()
    assert queued == []
    ClusterFactory(
        vdc=world.vdc,
        name="k8s",
        cluster_type="kubernetes",
        endpoint="https://k8s:6443",
        project_isolation="per_project",
    )
    with django_capture_on_commit_callbacks(execute=True):
        world.quota.save()
    with django_capture_on_commit_callbacks(execute=True):
        world.quota.delete()
    expected = (jobs.sync_project_isolation.name, (world.project.pk, world.vdc.pk))
    assert queued == [expected, expected]


def test_health_of_a_per_project_slurm_cluster_without_accounting_says_isolation_is_degraded(
    world,
    no_accounting,  # noqa: F811
):
    cluster = ClusterFactory(
        vdc=world.vdc,
        name="slurm-noacct",
        cluster_type="slurm",
        endpoint=no_accounting,
        namespace="hcs",
        project_isolation="per_project",
        status="unknown",
    )
    cluster.set_credentials({"token": "t", "user": "hcs"})
    cluster.save()
    cluster = check_cluster_health(cluster)
    assert cluster.status == "healthy"
    assert "project isolation degraded" in cluster.status_message
    assert "Jobs run under the submitting user's default account" in cluster.status_message


def test_kubernetes_counts_the_cards_of_a_shareable_model_it_cannot_share(world):
    # Ascend 910B is shareable in the catalog, but HAMi on Kubernetes shares NVIDIA and Hygon cards only: its
    # shares never run there, so its cards are counted (floor(8 / 0.6) = 13), while the A100's are not.
    kube = ClusterFactory(vdc=world.vdc, name="k8s", cluster_type="kubernetes", project_isolation="per_project")
    node = NodeFactory(cluster=kube, name="k8s-node")
    DeviceFactory(node=node, index=0, gpu_model=GPUModel.objects.get(name="Ascend910B"))
    DeviceFactory(node=node, index=1, gpu_model=GPUModel.objects.get(name="A100-80G"))
    limits = project_limits(kube, world.project)
    assert limits.gpus == {"huawei.com/Ascend910": 13}
    assert limits.notes == ("nvidia.com/gpu: not limited (a shareable model counts one card per share)",)
