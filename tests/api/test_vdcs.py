"""VDC stats and resources, quotas, projects, memberships and queue actions."""

from __future__ import annotations

from decimal import Decimal

from apps.queues.api import views as queue_views
from apps.queues.models import TaskQueue
from apps.tasks.choices import ACTIVE, WAITING
from apps.vdc.models import VDC, Membership, ProjectQuota
from tests.api.base import client_for
from tests.factories import NodeFactory, ProjectFactory, TaskFactory, UserFactory, VDCFactory

VDCS = "/api/v1/vdcs/"


def running(world, **fields):
    defaults = {
        "project": world.project,
        "vdc": world.vdc,
        "queue": world.high,
        "cluster": world.cluster,
        "status": "running",
        "cpu": Decimal(4),
        "memory_gib": Decimal(32),
        "allocated_gpu": Decimal(2),
    }
    return TaskFactory(**{**defaults, **fields})


def test_stats_count_tasks_per_status_and_running_equivalents(world):
    running(world)
    running(world, project=world.other_project, instances=2, allocated_gpu=Decimal("1.5"))
    TaskFactory(project=world.project, vdc=world.vdc, queue=world.high, status="queued")
    data = client_for(world.viewer).get(f"{VDCS}{world.vdc.pk}/stats/").data
    assert data["tasks_by_status"]["running"] == 2 and data["tasks_by_status"]["queued"] == 1
    assert data["tasks_by_status"]["failed"] == 0
    assert (data["queued"], data["active"]) == (1, 2)
    assert Decimal(data["running_gpu_equivalents"]) == Decimal("3.5")


def test_resources_give_capacity_allocated_and_free_per_cluster(world):
    running(world, instances=2)
    data = client_for(world.member).get(f"{VDCS}{world.vdc.pk}/resources/").data
    assert {k: Decimal(v) for k, v in data["capacity"].items()} == {"cpu": 64, "memory_gib": 512, "gpu": 8}
    assert {k: Decimal(v) for k, v in data["allocated"].items()} == {"cpu": 8, "memory_gib": 64, "gpu": 2}
    assert {k: Decimal(v) for k, v in data["free"].items()} == {"cpu": 56, "memory_gib": 448, "gpu": 6}
    [cluster] = data["clusters"]
    assert cluster["name"] == "local-1" and Decimal(cluster["free"]["gpu"]) == 6


def test_resources_use_the_admins_caps_where_set(world):
    world.vdc.total_gpu = Decimal(4)
    world.vdc.save()
    NodeFactory(cluster=world.cluster, cpu=Decimal(16))
    data = client_for(world.admin).get(f"{VDCS}{world.vdc.pk}/resources/").data
    assert Decimal(data["capacity"]["gpu"]) == 4 and Decimal(data["capacity"]["cpu"]) == 80


def test_stats_and_resources_of_an_invisible_vdc_are_404(world):
    hidden = VDCFactory()
    for what in ("stats", "resources", "quotas"):
        assert client_for(world.member).get(f"{VDCS}{hidden.pk}/{what}/").status_code == 404


def test_vdc_quotas_show_members_their_own_projects_only(world):
    url = f"{VDCS}{world.vdc.pk}/quotas/"
    assert [q["project_name"] for q in client_for(world.viewer).get(url).data["results"]] == ["alpha"]
    assert [q["project_name"] for q in client_for(world.admin).get(url).data["results"]] == ["alpha", "beta"]


def test_admin_adds_a_quota_in_the_vdc_and_guarantees_must_fit(world):
    url = f"{VDCS}{world.vdc.pk}/quotas/"
    gamma = ProjectFactory(name="gamma")
    body = {"project": gamma.pk, "guaranteed_gpu": "2", "limit_gpu": "4"}
    assert client_for(world.owner).post(url, body, format="json").status_code == 403
    response = client_for(world.admin).post(url, body, format="json")
    assert response.status_code == 201, response.data
    assert response.data["vdc"] == world.vdc.pk
    too_much = {"project": ProjectFactory().pk, "guaranteed_gpu": "5", "limit_gpu": "5"}  # 2 + 2 + 2 + 5 > 8
    response = client_for(world.admin).post(url, too_much, format="json")
    assert response.status_code == 400 and "capacity" in str(response.data["guaranteed_gpu"][0])


def test_quota_limit_below_guarantee_is_a_field_error(world):
    response = client_for(world.admin).patch(f"/api/v1/vdc-quotas/{world.quota.pk}/", {"limit_gpu": "1"}, format="json")
    assert response.status_code == 400 and "limit_gpu" in response.data
    assert ProjectQuota.objects.get(pk=world.quota.pk).limit_gpu == 8


def test_project_vdc_quotas_and_my_role(world):
    url = f"/api/v1/projects/{world.project.pk}/"
    assert client_for(world.viewer).get(url).data["my_role"] == "viewer"
    assert client_for(world.owner).get(url).data["member_count"] == 3
    quotas = client_for(world.member).get(f"{url}vdc-quotas/").data["results"]
    assert [(q["vdc_name"], q["limit_gpu"]) for q in quotas] == [("main", "8.00")]
    assert client_for(world.outsider).get(f"{url}vdc-quotas/").status_code == 404


def test_owner_cannot_add_members_to_a_project_they_do_not_own(world):
    body = {"project": world.other_project.pk, "user": "max", "role": "member"}
    response = client_for(world.owner).post("/api/v1/memberships/", body, format="json")
    assert response.status_code == 400 and "project" in response.data


def test_a_user_is_added_to_a_project_once(world):
    body = {"project": world.project.pk, "user": "vera", "role": "member"}
    response = client_for(world.owner).post("/api/v1/memberships/", body, format="json")
    assert response.status_code == 400 and "already" in str(response.data["user"][0])


def test_the_last_owner_can_neither_leave_nor_be_demoted(world):
    owner = Membership.objects.get(project=world.project, user=world.owner)
    url = f"/api/v1/memberships/{owner.pk}/"
    assert client_for(world.owner).patch(url, {"role": "member"}, format="json").status_code == 400
    assert client_for(world.admin).delete(url).status_code == 400
    Membership.objects.create(project=world.project, user=UserFactory(username="otto"), role="owner")
    assert client_for(world.owner).delete(url).status_code == 204


def test_membership_moves_are_refused(world):
    member = Membership.objects.get(project=world.project, user=world.member)
    url = f"/api/v1/memberships/{member.pk}/"
    response = client_for(world.admin).patch(url, {"user": "oscar"}, format="json")
    assert response.status_code == 400
    assert Membership.objects.get(pk=member.pk).user == world.member


def test_queue_open_close_and_policy(world):
    url = f"/api/v1/queues/{world.low.pk}"
    assert client_for(world.member).post(f"{url}/close/").status_code == 403
    assert client_for(world.admin).post(f"{url}/close/").data["is_open"] is False
    assert client_for(world.admin).post(f"{url}/open/").data["is_open"] is True
    response = client_for(world.admin).patch(f"{url}/", {"policy": "backfill"}, format="json")
    assert response.status_code == 200 and response.data["policy"] == "backfill"
    assert client_for(world.admin).patch(f"{url}/", {"policy": "random"}, format="json").status_code == 400


def test_queue_counts_waiting_and_active_tasks(world):
    running(world, queue=world.low)
    TaskFactory(project=world.other_project, vdc=world.vdc, queue=world.low, status="queued")
    data = client_for(world.viewer).get(f"/api/v1/queues/{world.low.pk}/").data
    assert (data["waiting_count"], data["active_count"], data["rules"]) == (1, 1, world.low.rules)


def test_only_one_vdc_is_the_default(world):
    admin = client_for(world.admin)
    response = admin.post(VDCS, {"name": "second", "is_default": True}, format="json")
    assert response.status_code == 400 and "main" in str(response.data["is_default"][0])
    assert admin.post(VDCS, {"name": "third", "is_default": False}, format="json").status_code == 201
    assert admin.patch(f"{VDCS}{world.vdc.pk}/", {"is_default": True}, format="json").status_code == 200


def test_queue_counts_use_the_task_status_groups():
    assert (set(queue_views.WAITING_STATUSES), set(queue_views.ACTIVE_STATUSES)) == (set(WAITING), set(ACTIVE))


def test_a_new_vdc_gets_its_class_queues_ordered_by_its_default_policy(world):
    # A new VDC had no queues, so its users saw an empty queue list.
    admin = client_for(world.admin)
    made = admin.post("/api/v1/vdcs/", {"name": "east", "default_queue_policy": "drf"}, format="json")
    assert made.status_code == 201, made.data
    queues = {q.name: (q.priority_class, q.policy) for q in TaskQueue.objects.filter(vdc_id=made.data["id"])}
    assert queues == {"high": ("high", "drf"), "medium": ("medium", "drf"), "low": ("low", "drf")}
    bare = admin.post("/api/v1/vdcs/", {"name": "bare", "class_queues": False}, format="json")
    assert bare.status_code == 201 and not TaskQueue.objects.filter(vdc_id=bare.data["id"]).exists()
    # A queue added later without a policy takes the VDC's default.
    vdc = VDC.objects.get(name="east")
    added = admin.post("/api/v1/queues/", {"vdc": vdc.pk, "name": "batch", "priority_class": "low"}, format="json")
    assert added.status_code == 201 and added.data["policy"] == "drf"
