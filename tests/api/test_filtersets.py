"""Every model has one FilterSet, and every model field a filter (NetBox style); filters work through the API."""

from __future__ import annotations

import importlib
from datetime import timedelta

import pytest
from django.apps import apps as django_apps
from django.utils import timezone

from tests.api.base import client_for
from tests.factories import TaskFactory, TaskQueueFactory

APP_LABELS = ("vdc", "clusters", "queues", "tasks", "billing", "control")

# Free text and JSON documents (filtering on them would mean nothing) and secrets. Every exemption is named.
EXEMPT = {
    "vdc.VDC": {"description"},
    "vdc.Project": {"description"},
    "vdc.ProjectSecret": {"description", "value"},  # free text, and the encrypted value
    "vdc.CapacityLoan": {"reason", "figures", "return_message"},  # free text (searched with q) and its numbers
    "clusters.GPUModel": {"aliases"},
    "clusters.Cluster": {
        "description",
        "credentials_encrypted",
        "status_message",
        "labels",
        "allowed_host_paths",
        "webhook_namespaces",
        "webhook_token_hash",
    },  # fmt: skip
    "clusters.Node": {"labels", "agent_message", "backend_reason"},
    "clusters.Device": {"links"},
    "clusters.AgentToken": {"key_hash"},  # a secret's digest
    "queues.TaskQueue": {"description"},
    "tasks.Task": {
        "required_labels",
        "command",
        "env",
        "secret_env",
        "secret_refs",
        "volumes",
        "status_message",
        "pending_message",
        "placement",
    },
    "tasks.TaskEvent": {"message", "data"},
    "billing.PriceRule": {"discount_tiers"},
    "control.BackendObject": {"message", "devices"},
    "control.CheckpointStore": {"message"},
    "billing.InvoiceRun": {"accounts", "message"},
    "billing.ProjectAlert": {"message", "action"},
}


def filtersets_by_model() -> dict:
    found = {}
    for label in APP_LABELS:
        module = importlib.import_module(f"apps.{label}.filtersets")
        for obj in vars(module).values():
            meta = getattr(obj, "_meta", None)
            if isinstance(obj, type) and getattr(meta, "model", None) is not None and obj.__module__ == module.__name__:
                found[meta.model] = obj
    return found


MODELS = [m for label in APP_LABELS for m in django_apps.get_app_config(label).get_models()]


@pytest.mark.parametrize("model", MODELS, ids=lambda m: m._meta.label)
def test_every_model_field_has_a_filter(model):
    filterset = filtersets_by_model().get(model)
    assert filterset is not None, f"{model._meta.label} has no FilterSet in apps/{model._meta.app_label}/filtersets.py"
    exempt = EXEMPT.get(model._meta.label, set())
    fields = {f.name for f in model._meta.get_fields() if f.concrete or f.many_to_many and not f.auto_created}
    assert exempt <= fields, f"stale exemptions {exempt - fields}"
    missing = sorted(fields - exempt - set(filterset.base_filters))
    assert not missing, f"{filterset.__name__} has no filter for {missing}"


def test_tasks_filter_by_kind_status_class_queue_and_submit_time(world):
    low_batch = TaskQueueFactory(vdc=world.vdc, name="batch", priority_class="low")
    make = dict(project=world.project, vdc=world.vdc, owner=world.member)  # noqa: C408
    a = TaskFactory(**make, queue=world.high, kind="training", status="queued", name="resnet-a")
    b = TaskFactory(**make, queue=low_batch, kind="inference", status="running", name="llm-serve")
    c = TaskFactory(**make, queue=world.low, kind="training", status="completed", name="resnet-b")
    TaskFactory(project=world.other_project, vdc=world.vdc, queue=world.low, kind="training")

    def ids(**params):
        response = client_for(world.viewer).get("/api/v1/tasks/", params)
        assert response.status_code == 200, response.data
        return sorted(t["id"] for t in response.data["results"])

    assert ids(kind="training") == sorted([a.pk, c.pk])
    assert ids(status__in="queued,running") == sorted([a.pk, b.pk])
    assert ids(priority_class="low") == sorted([b.pk, c.pk])
    assert ids(queue_name="batch") == [b.pk]
    assert ids(q="resnet") == sorted([a.pk, c.pk])
    assert ids(search="llm") == [b.pk]
    assert ids(waiting="true") == [a.pk]
    assert ids(owner=world.member.pk, project=world.project.pk) == sorted([a.pk, b.pk, c.pk])
    assert ids(submitted_after=(timezone.now() + timedelta(hours=1)).isoformat()) == []
    ordered = client_for(world.viewer).get("/api/v1/tasks/", {"ordering": "name"}).data["results"]
    assert [t["name"] for t in ordered] == ["llm-serve", "resnet-a", "resnet-b"]


def test_a_bad_filter_value_is_a_400(world):
    response = client_for(world.member).get("/api/v1/tasks/", {"status": "sleeping"})
    assert response.status_code == 400 and "status" in response.data


def test_filtering_by_an_invisible_id_is_an_empty_list_not_an_error(world):
    response = client_for(world.outsider).get("/api/v1/tasks/", {"project": world.project.pk})
    assert response.status_code == 200 and response.data["count"] == 0


def test_clusters_nodes_devices_and_queues_filter(world):
    member = client_for(world.member)
    assert member.get("/api/v1/clusters/", {"vdc": world.vdc.pk, "cluster_type": "local"}).data["count"] == 1
    assert member.get("/api/v1/clusters/", {"status": "maintenance"}).data["count"] == 0
    assert member.get("/api/v1/nodes/", {"cluster": world.cluster.pk, "status": "ready"}).data["count"] == 1
    assert member.get("/api/v1/devices/", {"model": "a100-80g", "vendor": "nvidia"}).data["count"] == 8
    assert member.get("/api/v1/devices/", {"vendor": "huawei"}).data["count"] == 0
    assert member.get("/api/v1/queues/", {"priority_class": "medium", "is_open": "true"}).data["count"] == 1
    assert member.get("/api/v1/gpu-models/", {"vendor": "huawei", "shareable": "false"}).data["count"] >= 1
