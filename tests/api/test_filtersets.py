"""Every model has one FilterSet, and every model field a filter (NetBox style); filters work through the API."""

from __future__ import annotations

import importlib
from datetime import timedelta

import django_filters
import pytest
from django.apps import apps as django_apps
from django.db import models
from django.utils import timezone

from apps.core.filtersets import IdFilter
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
    },
    "clusters.Node": {"labels", "agent_message", "backend_reason"},
    "clusters.Device": {"links"},
    "clusters.AgentToken": {"key_hash"},  # a secret's digest
    "queues.TaskQueue": {"description", "las_thresholds_gpu_s"},  # a JSON list of thresholds
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
        "sweep_values",  # JSON: a sweep element's values
        "autoscale_schedule",  # JSON: scheduled minimums
    },
    "tasks.Sweep": {"parameters"},  # JSON: the parameter spec
    "tasks.TaskTemplate": {"description", "task_file"},  # free text (searched with q) and a JSON task file
    "tasks.TaskEvent": {"message", "data"},
    "tasks.IdempotentRequest": {"fingerprint", "body"},  # a digest and a stored answer
    "billing.PriceRule": {"discount_tiers"},
    "control.BackendObject": {"message", "shares"},
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


def _model_field(model, path: str):
    field = None
    for part in path.split("__"):
        field = model._meta.get_field(part)
        model = field.related_model or model
    return field


@pytest.mark.parametrize("model", MODELS, ids=lambda m: m._meta.label)
def test_every_id_and_relation_filter_takes_only_ids_a_column_holds(model):
    """Django hands ids beyond 64 bits in relation and ``in`` lookups to the database, which cannot take them."""
    filterset = filtersets_by_model()[model]
    for name, found in filterset.base_filters.items():
        if not isinstance(found, django_filters.NumberFilter) or found.method:
            continue
        field = _model_field(model, found.field_name)
        if field.is_relation or isinstance(field, models.AutoField | models.BigAutoField) or found.lookup_expr == "in":
            assert isinstance(found, IdFilter), f"{filterset.__name__}.{name} is a {type(found).__name__}"


@pytest.mark.parametrize(
    ("path", "params"),
    [
        ("/api/v1/memberships/", {"project__in": f"1,{-(2**72)}"}),
        ("/api/v1/project-secrets/", {"id__in": f"{2**66},3"}),
        ("/api/v1/billing/usage/", {"task__in": f"{-(2**120)}"}),
        ("/api/v1/billing/transactions/", {"created_by": f"{2**76}"}),
        ("/api/v1/projects/", {"vdc": f"{-(2**64)}"}),
        ("/api/v1/nodes/", {"vdc": f"{2**63}"}),
    ],
)
def test_an_id_no_column_holds_is_a_400_that_says_so(world, path, params):
    response = client_for(world.admin).get(path, params)
    assert response.status_code == 400, response.content
    (name,) = params
    assert name in response.json() and "Ensure this value is" in str(response.json()[name])
    in_range = {name: ",".join(["1", str(2**63 - 1)]) if name.endswith("__in") else str(-(2**63))}
    assert client_for(world.admin).get(path, in_range).status_code == 200


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


@pytest.mark.parametrize(
    ("path", "params"),
    [
        ("/api/v1/tasks/", {"name__startswith": "burst-"}),
        ("/api/v1/tasks/", {"page_size": "500", "status": "queued"}),
        ("/api/v1/billing/usage/", {"projct": "1"}),
        ("/api/v1/vdcs/1/clusters/", {"nme": "local-1"}),
    ],
)
def test_a_query_parameter_a_list_does_not_know_is_a_400_naming_it(world, path, params):
    response = client_for(world.admin).get(path.replace("/1/", f"/{world.vdc.pk}/"), params)
    assert response.status_code == 400, response.content
    unknown = next(name for name in params if name != "status")
    assert list(response.json()) == [unknown] and "Unknown query parameter" in response.json()[unknown][0]


def test_lists_take_their_filters_ordering_search_page_and_format(world):
    params = {
        "name__icontains": "x",
        "ordering": "-submitted_at",
        "search": "x",
        "q": "x",
        "page": "1",
        "format": "json",
        "status__in": "queued,running",
    }
    assert client_for(world.member).get("/api/v1/tasks/", params).status_code == 200
    # A detail's lookup is left alone.
    assert client_for(world.admin).get(f"/api/v1/vdcs/{world.vdc.pk}/", {"whatever": "1"}).status_code == 200
