"""Create / read / update / delete and the role matrix for every API resource, from one declaration each."""

from __future__ import annotations

from datetime import timedelta
from decimal import Decimal

import pytest
from django.contrib.auth.models import Permission
from django.utils import timezone

from apps.billing.models import Account, Invoice, InvoiceLine, PriceRule, ProjectAlert, Transaction, UsageRecord
from apps.clusters.models import CapacityReservation, GPUModel
from apps.vdc.models import RebalancerSettings
from tests.api.base import ADMIN, EVERYONE, PROJECT_ROLES, ROLES, Resource, client_for, same
from tests.factories import (
    ClusterFactory,
    DeviceFactory,
    MembershipFactory,
    NodeFactory,
    ProjectQuotaFactory,
    TaskFactory,
    TaskQueueFactory,
    UserFactory,
    VDCFactory,
    staff_user,
)

WRITERS = frozenset({"admin", "owner", "member"})
OWNERS = frozenset({"admin", "owner"})


def alpha_vdc(w):
    """A second VDC where only project alpha has a quota: alpha's roles see it, the outsider does not."""
    vdc = VDCFactory(name="north", total_cpu=Decimal(1000), total_memory_gib=Decimal(8000), total_gpu=Decimal(64))
    ProjectQuotaFactory(project=w.project, vdc=vdc)
    return vdc


def alpha_account(w):
    return Account.objects.create(project=w.project, balance=Decimal("100"), credit_limit=Decimal("10"))


def alpha_usage(w):
    now = timezone.now()
    task = TaskFactory(project=w.project, vdc=w.vdc, queue=w.high, owner=w.member, status="completed")
    return UsageRecord.objects.create(
        task=task,
        project=w.project,
        vdc=w.vdc,
        resource_type="cpu",
        quantity=Decimal("2"),
        period_start=now - timedelta(hours=1),
        period_end=now,
        unit_price=Decimal("0.5"),
        cost=Decimal("1"),
    )


def alpha_invoice(w):
    now = timezone.now()
    invoice = Invoice.objects.create(
        account=alpha_account(w), period_start=now - timedelta(days=30), period_end=now, total=Decimal("12.5")
    )
    InvoiceLine.objects.create(invoice=invoice, resource_type="cpu", quantity=Decimal("25"), amount=Decimal("12.5"))
    return invoice


def backend_object(w):
    from apps.control.models import BackendObject

    task = TaskFactory(project=w.project, vdc=w.vdc, queue=w.high, owner=w.member, status="stopped")
    return BackendObject.objects.create(cluster=w.cluster, task=task, task_uid=task.uid, attempt=1, name="hcs-job")


def alpha_secret(w):
    from apps.vdc.services import create_secret

    return create_secret(w.admin, w.project, "REGISTRY_PASSWORD", "hunter2", "registry.example")


def alpha_loan(w):
    """A loan from a third project to alpha: alpha's roles see it (the borrower), beta's outsider does not."""
    from apps.vdc.models import CapacityLoan

    gamma = ProjectQuotaFactory(vdc=w.vdc).project
    now = timezone.now()
    return CapacityLoan.objects.create(
        vdc=w.vdc,
        lender=gamma,
        borrower=w.project,
        gpu=Decimal(2),
        reason="test",
        started_at=now,
        expires_at=now + timedelta(hours=1),
    )


def alpha_sweep(w):
    from apps.tasks.models import Sweep

    return Sweep.objects.create(project=w.project, name="grid", created_by=w.member, parameters={"lr": [1]})


def alpha_template(w):
    from apps.tasks.models import TaskTemplate

    return TaskTemplate.objects.create(
        project=w.project, name="resnet", created_by=w.owner, task_file={"kind": "training", "command": "python t.py"}
    )


def a100():
    return GPUModel.objects.get(name="A100-80G")


RESOURCES = [
    Resource(
        "vdcs",
        make=alpha_vdc,
        readers=PROJECT_ROLES,
        create=lambda w: {"name": "east", "description": "second site", "total_gpu": "16"},
        update=lambda w: {"description": "northern site", "allow_overcommit": True, "overcommit_ratio": "1.50"},
    ),
    Resource(
        "clusters",
        make=lambda w: ClusterFactory(vdc=alpha_vdc(w), name="north-1"),
        readers=PROJECT_ROLES,
        create=lambda w: {
            "vdc": w.vdc.pk,
            "name": "k8s-east",
            "cluster_type": "kubernetes",
            "endpoint": "https://k8s.example:6443",
            "namespace": "hcs",
            "credentials": {"token": "s3cret"},
        },
        update=lambda w: {"description": "rack 4", "priority": 5, "labels": {"zone": "a"}},
    ),
    Resource(
        "nodes",
        make=lambda w: NodeFactory(cluster=ClusterFactory(vdc=alpha_vdc(w)), name="north-node"),
        readers=PROJECT_ROLES,
        create=lambda w: {"cluster": w.cluster.pk, "name": "gpu-node-2", "cpu": "32", "memory_gib": "256"},
        update=lambda w: {"health_score": 70, "status": "draining"},
    ),
    Resource(
        "devices",
        make=lambda w: DeviceFactory(node=NodeFactory(cluster=ClusterFactory(vdc=alpha_vdc(w))), index=0),
        readers=PROJECT_ROLES,
        create=lambda w: {"node": w.node.pk, "index": 8, "gpu_model": a100().pk, "vram_gib": "80"},
        update=lambda w: {"utilization": 50, "links": [{"peer": 1, "type": "nvlink", "bandwidth_gbps": 600}]},
    ),
    Resource(
        "gpu-models",
        make=lambda w: GPUModel.objects.create(
            name="X1",
            vendor="intel",
            vram_gib=Decimal(48),
            exchange_rate=Decimal("0.3"),
            resource_name="gpu.intel.com/i915",
            visible_devices_env="ZE_AFFINITY_MASK",
        ),
        readers=EVERYONE,
        create=lambda w: {
            "name": "Gaudi2",
            "vendor": "intel",
            "aliases": ["gaudi2"],
            "vram_gib": "96",
            "exchange_rate": "0.7",
            "resource_name": "habana.ai/gaudi",
            "visible_devices_env": "HABANA_VISIBLE_DEVICES",
        },
        update=lambda w: {"exchange_rate": "0.400", "aliases": ["x1", "max1550"]},
    ),
    Resource(
        "queues",
        make=lambda w: TaskQueueFactory(vdc=alpha_vdc(w), name="north-high"),
        readers=PROJECT_ROLES,
        create=lambda w: {"vdc": w.vdc.pk, "name": "batch", "priority_class": "low"},
        update=lambda w: {"policy": "drf", "is_open": False, "description": "nightly"},
    ),
    Resource(
        "capacity-reservations",
        make=lambda w: CapacityReservation.objects.create(
            vdc=alpha_vdc(w),
            name="north-firmware",
            starts_at=timezone.now(),
            ends_at=timezone.now() + timedelta(hours=2),
        ),
        readers=PROJECT_ROLES,
        create=lambda w: {
            "vdc": w.vdc.pk,
            "cluster": w.cluster.pk,
            "name": "rack-b",
            "starts_at": "2031-01-01T08:00:00Z",
            "ends_at": "2031-01-01T18:00:00Z",
            "gpu_model": a100().pk,
            "cards": 4,
        },
        update=lambda w: {"reason": "GPU firmware upgrade", "preempt_at_start": True},
    ),
    Resource(
        "projects",
        make=lambda w: w.project,
        readers=PROJECT_ROLES,
        create=lambda w: {"name": "gamma", "description": "a new team"},
        update=lambda w: {"description": "the alpha team"},
        updaters=OWNERS,
    ),
    Resource(
        "memberships",
        make=lambda w: MembershipFactory(project=w.project, user=UserFactory(username="nina"), role="member"),
        readers=PROJECT_ROLES,
        create=lambda w: {"project": w.project.pk, "user": UserFactory(username="carol").username, "role": "viewer"},
        creators=OWNERS,
        create_denied={"outsider": 400},
        update=lambda w: {"role": "viewer"},
        updaters=OWNERS,
        deleters=OWNERS,
    ),
    Resource(
        "project-secrets",
        make=alpha_secret,
        readers=PROJECT_ROLES,
        create=lambda w: {"project": w.project.pk, "name": "HF_TOKEN", "value": "hf_s3cret", "description": "Hub"},
        creators=OWNERS,
        create_denied={"outsider": 400},
        update=lambda w: {"description": "the registry of team alpha"},
        updaters=OWNERS,
        deleters=OWNERS,
    ),
    Resource(
        "vdc-quotas",
        make=lambda w: w.project.quotas.get(vdc=alpha_vdc(w)),
        readers=PROJECT_ROLES,
        create=lambda w: {
            "project": w.project.pk,
            "vdc": VDCFactory(name="spare", total_gpu=Decimal(16)).pk,
            "guaranteed_gpu": "2",
            "limit_gpu": "4",
        },
        update=lambda w: {"limit_gpu": "12.00", "max_concurrent_tasks": 5},
    ),
    Resource(
        "tasks",
        make=lambda w: TaskFactory(project=w.project, vdc=w.vdc, queue=w.high, owner=w.member, status="stopped"),
        readers=PROJECT_ROLES,
        create=lambda w: {
            "project": w.project.pk,
            "queue": w.high.pk,
            "name": "train",
            "kind": "training",
            "gpu_spec": "1(A100)",
            "command": "python train.py",
        },
        creators=WRITERS,
        create_denied={"outsider": 400},
        deleters=WRITERS,
        # Only a running inference service's autoscaling changes after submission.
        make_for_update=lambda w: TaskFactory(
            project=w.project,
            vdc=w.vdc,
            queue=w.high,
            owner=w.member,
            kind="inference",
            status="running",
            autoscale_min=1,
            autoscale_max=2,
        ),
        update=lambda w: {"autoscale_max": 3, "autoscale_rps": 15},
        updaters=WRITERS,
    ),
    Resource(
        "sweeps",
        make=alpha_sweep,
        readers=PROJECT_ROLES,
        create=lambda w: {
            "project": w.project.pk,
            "queue": w.high.pk,
            "name": "grid",
            "kind": "training",
            "command": "python train.py",
            "parameters": {"lr": [0.1, 0.01]},
        },
        creators=WRITERS,
        create_denied={"outsider": 400},
        deleters=None,
    ),
    Resource(
        "task-templates",
        make=alpha_template,
        readers=PROJECT_ROLES,
        create=lambda w: {
            "project": w.project.pk,
            "name": "bert",
            "description": "fine-tune BERT",
            "task_file": {"kind": "training", "queue": w.high.name, "command": "python bert.py"},
        },
        creators=OWNERS,
        create_denied={"outsider": 400},
        update=lambda w: {"description": "ResNet-50 on ImageNet", "task_file": {"kind": "training", "epochs": 3}},
        updaters=OWNERS,
        deleters=OWNERS,
    ),
    Resource(
        "billing/prices",
        make=lambda w: PriceRule.objects.create(resource_type="cpu", price_per_hour=Decimal("0.2")),
        readers=EVERYONE,
        deleters=None,
    ),
    Resource("billing/accounts", make=alpha_account, readers=PROJECT_ROLES, deleters=None),
    Resource("billing/usage", make=alpha_usage, readers=PROJECT_ROLES, deleters=None),
    Resource(
        "billing/transactions",
        make=lambda w: Transaction.objects.create(
            account=alpha_account(w),
            kind="credit",
            amount=Decimal(100),
            balance_after=Decimal(100),
            description="top-up",
        ),
        readers=PROJECT_ROLES,
        deleters=None,
    ),
    Resource("billing/invoices", make=alpha_invoice, readers=PROJECT_ROLES, deleters=None),
    Resource(
        "alerts",
        make=lambda w: ProjectAlert.objects.create(
            project=w.project,
            vdc=w.vdc,
            rule="budget_low",
            key="budget",
            message="Budget low",
            since=timezone.now(),
            fired_at=timezone.now(),
        ),
        readers=PROJECT_ROLES,
        deleters=None,
    ),
    Resource("backend-objects", make=backend_object, readers=ADMIN, deleters=None),
    Resource("capacity-loans", make=alpha_loan, readers=PROJECT_ROLES, deleters=None),
    Resource(
        "rebalancer-settings",
        make=lambda w: RebalancerSettings.objects.create(vdc=alpha_vdc(w)),
        readers=PROJECT_ROLES,
        create=lambda w: {"vdc": w.vdc.pk, "threshold_percent": 30, "interval": "00:02:00"},
        update=lambda w: {"loans_low_class_only": False, "loan_billing": "neither"},
    ),
]

matrix = pytest.mark.parametrize("resource", RESOURCES, ids=str)
roles = pytest.mark.parametrize("role", ROLES)


@pytest.fixture(autouse=True)
def view_only_staff(request):
    """The matrix's "staff" role, in the tests of a world: every view permission of the portal's apps, no other."""
    if "world" not in request.fixturenames:
        return None
    world = request.getfixturevalue("world")
    views = Permission.objects.filter(
        codename__startswith="view_",
        content_type__app_label__in=("vdc", "clusters", "queues", "tasks", "billing", "control"),
    )
    world.staff = staff_user("ops-viewer", *(f"{p.content_type.app_label}.{p.codename}" for p in views))
    return world.staff


@matrix
def test_anonymous_requests_are_refused(world, resource):
    obj = resource.make(world)
    assert client_for(None).get(resource.list_url).status_code == 401
    assert client_for(None).get(resource.detail_url(obj)).status_code == 401


@matrix
@roles
def test_list_shows_the_object_only_to_readers(world, resource, role):
    obj = resource.make(world)
    response = client_for(world.user(role)).get(resource.list_url, {"id": obj.pk})
    assert response.status_code == 200, response.data
    ids = [row["id"] for row in response.data["results"]]
    assert ids == ([obj.pk] if resource.reads(role) else [])


@matrix
@roles
def test_read(world, resource, role):
    obj = resource.make(world)
    response = client_for(world.user(role)).get(resource.detail_url(obj))
    assert response.status_code == resource.expected_read(role), response.data
    if response.status_code == 200:
        assert response.data["id"] == obj.pk


@matrix
@roles
def test_create(world, resource, role):
    data = resource.create(world) if resource.create else {}
    model = type(resource.make(world))
    before = model.objects.count()
    response = client_for(world.user(role)).post(resource.list_url, data, format="json")
    assert response.status_code == resource.expected_create(role), response.data
    if response.status_code == 201:
        assert model.objects.filter(pk=response.data["id"]).exists()
        for key, value in data.items():
            if key in response.data and not isinstance(value, dict):
                assert same(value, response.data[key]), key
    else:
        assert model.objects.count() == before


@matrix
@roles
def test_update(world, resource, role):
    obj = (resource.make_for_update or resource.make)(world)
    data = resource.update(world) if resource.update else {"id": obj.pk}
    response = client_for(world.user(role)).patch(resource.detail_url(obj), data, format="json")
    assert response.status_code == resource.expected_update(role), getattr(response, "data", None)
    if response.status_code == 200:
        for key, value in data.items():
            assert same(value, response.data[key]), key
        reread = client_for(world.admin).get(resource.detail_url(obj)).data
        assert all(same(value, reread[key]) for key, value in data.items())


@matrix
@roles
def test_delete(world, resource, role):
    obj = resource.make(world)
    response = client_for(world.user(role)).delete(resource.detail_url(obj))
    assert response.status_code == resource.expected_delete(role), getattr(response, "data", None)
    assert type(obj).objects.filter(pk=obj.pk).exists() == (response.status_code != 204)


def test_every_router_resource_is_declared():
    from hcsportal.api_urls import router

    assert {prefix for prefix, _viewset, _basename in router.registry} == {r.path for r in RESOURCES}


def test_admin_is_only_write_role_for_catalog_resources():
    assert all(r.creators == ADMIN for r in RESOURCES if r.path in ("vdcs", "clusters", "queues", "gpu-models"))
