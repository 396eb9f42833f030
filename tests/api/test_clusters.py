"""Cluster endpoints: write-only credentials, health, stats, jobs and the state actions."""

from __future__ import annotations

from decimal import Decimal

from apps.clusters.models import Cluster, Device, Node
from apps.control.models import BackendObject
from tests.api.base import client_for
from tests.factories import ClusterFactory, TaskFactory

CLUSTERS = "/api/v1/clusters/"
NEW_CLUSTER = {
    "name": "k8s-east",
    "cluster_type": "kubernetes",
    "endpoint": "https://k8s.example:6443",
    "namespace": "hcs",
    "credentials": {"token": "s3cret-token"},
}


def test_credentials_are_stored_encrypted_and_never_returned(world):
    admin = client_for(world.admin)
    response = admin.post(CLUSTERS, {**NEW_CLUSTER, "vdc": world.vdc.pk}, format="json")
    assert response.status_code == 201, response.data
    cluster = Cluster.objects.get(pk=response.data["id"])
    assert cluster.get_credentials() == {"token": "s3cret-token"}
    assert "s3cret-token" not in cluster.credentials_encrypted
    bodies = [
        response.content,
        admin.get(f"{CLUSTERS}{cluster.pk}/").content,
        admin.get(CLUSTERS).content,
        admin.get(f"/api/v1/vdcs/{world.vdc.pk}/clusters/").content,
        admin.patch(f"{CLUSTERS}{cluster.pk}/", {"description": "east"}, format="json").content,
        admin.post(f"{CLUSTERS}{cluster.pk}/disable/").content,
    ]
    for body in bodies:
        assert b"s3cret-token" not in body and b'"credentials"' not in body and b"credentials_encrypted" not in body
    assert admin.get(f"{CLUSTERS}{cluster.pk}/").data["has_credentials"] is True
    assert admin.get(f"{CLUSTERS}{world.cluster.pk}/").data["has_credentials"] is False


def test_credentials_can_be_replaced_but_must_be_an_object(world):
    admin = client_for(world.admin)
    url = f"{CLUSTERS}{world.cluster.pk}/"
    assert admin.patch(url, {"credentials": "plain"}, format="json").status_code == 400
    assert admin.patch(url, {"credentials": {"jwt": "new"}}, format="json").status_code == 200
    world.cluster.refresh_from_db()
    assert world.cluster.get_credentials() == {"jwt": "new"}


def test_model_rules_apply_a_slurm_cluster_needs_a_partition(world):
    body = {**NEW_CLUSTER, "vdc": world.vdc.pk, "cluster_type": "slurm", "namespace": ""}
    response = client_for(world.admin).post(CLUSTERS, body, format="json")
    assert response.status_code == 400 and "partition" in str(response.data["namespace"][0])


def test_health_reports_status_heartbeats_and_message(world):
    Cluster.objects.filter(pk=world.cluster.pk).update(status="degraded", missed_heartbeats=2, status_message="slow")
    data = client_for(world.viewer).get(f"{CLUSTERS}{world.cluster.pk}/health/").data
    assert (data["status"], data["missed_heartbeats"], data["message"], data["last_heartbeat"]) == (
        "degraded",
        2,
        "slow",
        None,
    )


def test_enable_disable_and_maintenance_are_admin_actions(world):
    url = f"{CLUSTERS}{world.cluster.pk}"
    assert client_for(world.owner).post(f"{url}/disable/").status_code == 403
    assert client_for(world.admin).post(f"{url}/disable/").data["enabled"] is False
    assert client_for(world.admin).post(f"{url}/enable/").data["enabled"] is True
    data = client_for(world.admin).post(f"{url}/maintenance/", {}, format="json").data
    assert (data["status"], data["is_schedulable"]) == ("maintenance", False)
    data = client_for(world.admin).post(f"{url}/maintenance/", {"on": False}, format="json").data
    assert data["status"] == "healthy"


def test_state_actions_on_an_invisible_cluster_are_404(world):
    hidden = ClusterFactory()
    assert client_for(world.outsider).post(f"{CLUSTERS}{hidden.pk}/disable/").status_code == 404
    assert client_for(world.member).get(f"{CLUSTERS}{hidden.pk}/health/").status_code == 404


def test_stats_count_nodes_devices_per_model_and_allocation(world):
    TaskFactory(
        project=world.project,
        vdc=world.vdc,
        queue=world.high,
        cluster=world.cluster,
        status="running",
        cpu=Decimal(4),
        memory_gib=Decimal(16),
        instances=2,
        allocated_gpu=Decimal(2),
    )
    data = client_for(world.member).get(f"{CLUSTERS}{world.cluster.pk}/stats/").data
    assert data["nodes"] == {"total": 1, "by_status": {"ready": 1}}
    assert [(d["gpu_model"], d["count"]) for d in data["devices"]] == [("A100-80G", 8)]
    assert Decimal(data["capacity"]["gpu"]) == 8 and Decimal(data["capacity"]["cpu"]) == 64
    assert Decimal(data["allocated"]["cpu"]) == 8 and Decimal(data["allocated"]["gpu"]) == 2
    assert data["active_tasks"] == 1


def test_jobs_lists_only_the_visible_tasks_on_the_cluster(world):
    mine = TaskFactory(project=world.project, vdc=world.vdc, queue=world.high, cluster=world.cluster, status="running")
    TaskFactory(project=world.other_project, vdc=world.vdc, queue=world.high, cluster=world.cluster, status="running")
    TaskFactory(project=world.project, vdc=world.vdc, queue=world.high, status="queued")
    url = f"{CLUSTERS}{world.cluster.pk}/jobs/"
    assert [t["id"] for t in client_for(world.viewer).get(url).data["results"]] == [mine.pk]
    assert client_for(world.admin).get(url).data["count"] == 2
    assert client_for(world.member).get(url, {"status": "queued"}).data["count"] == 0


def test_vdc_clusters_lists_and_adds_clusters(world):
    url = f"/api/v1/vdcs/{world.vdc.pk}/clusters/"
    assert [c["name"] for c in client_for(world.viewer).get(url).data["results"]] == ["local-1"]
    assert client_for(world.member).post(url, NEW_CLUSTER, format="json").status_code == 403
    response = client_for(world.admin).post(url, {**NEW_CLUSTER, "vdc": 999}, format="json")
    assert response.status_code == 201, response.data
    assert Cluster.objects.get(name="k8s-east").vdc == world.vdc
    hidden = ClusterFactory().vdc
    assert client_for(world.member).get(f"/api/v1/vdcs/{hidden.pk}/clusters/").status_code == 404


def test_a_vdc_in_use_is_not_deleted_and_the_answer_says_by_what(world):
    response = client_for(world.admin).delete(f"/api/v1/vdcs/{world.vdc.pk}/")
    assert response.status_code == 409 and "clusters" in response.data["detail"]
    assert client_for(world.admin).get(f"/api/v1/vdcs/{world.vdc.pk}/").status_code == 200


def test_a_held_card_or_its_node_is_not_deleted_and_the_answer_names_the_holding_task(world):
    card, free = world.node.devices.order_by("index")[:2]
    holder = TaskFactory(
        project=world.project, vdc=world.vdc, queue=world.high, cluster=world.cluster, status="running"
    )
    BackendObject.objects.create(
        cluster=world.cluster,
        task=holder,
        task_uid=holder.uid,
        attempt=1,
        name=f"hcs-{holder.pk}-1",
        state="active",
        shares=[{"id": card.pk, "milli": 1000}],
    )
    admin = client_for(world.admin)
    for url in (f"/api/v1/devices/{card.pk}/", f"/api/v1/nodes/{world.node.pk}/"):
        response = admin.delete(url)
        assert response.status_code == 409, (url, response.data)
        assert f"held by task(s) #{holder.pk}" in response.data["detail"], response.data
    assert Device.objects.filter(pk=card.pk).exists() and Node.objects.filter(pk=world.node.pk).exists()
    assert admin.delete(f"/api/v1/devices/{free.pk}/").status_code == 204
