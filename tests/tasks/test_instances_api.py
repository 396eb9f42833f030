"""The instances of a task in the API (GET /api/v1/tasks/{id}/instances/) and on the monitoring page: what the
executor says, merged with what the task asked for, its cards' agent figures and its secret names."""

from __future__ import annotations

import time
from datetime import UTC, datetime
from decimal import Decimal

import pytest

from apps.clusters.executors.base import ExecutorError, InstanceState
from apps.clusters.models import Device
from apps.tasks import instances as instances_module
from tests.api.base import client_for
from tests.factories import TaskFactory

pytestmark = pytest.mark.django_db

STARTED = datetime(2026, 11, 23, 10, 0, tzinfo=UTC)


class FakeExecutor:
    """Stands in for the cluster's executor: what a backend would report for two ranks."""

    def __init__(self, answer=None, error: ExecutorError | None = None, delay: float = 0.0):
        self.answer, self.error, self.delay = answer, error, delay
        self.asked = []

    def instances(self, external_id):
        self.asked.append(external_id)
        time.sleep(self.delay)
        if self.error:
            raise self.error
        return self.answer


def two_ranks() -> list[InstanceState]:
    common = {
        "state": "Running",
        "restarts": 0,
        "started_at": STARTED,
        "service": "hcs-task-9-1",
        "ports": ({"port": 80, "target_port": 8000, "protocol": "TCP", "name": "http"},),
        "ingress_host": "hcs-task-9-1.apps.example.org",
        "ingress_tls": True,
    }
    return [
        InstanceState(
            index=1,
            name="pod-b",
            node="gpu-node-1",
            ip="10.0.0.2",
            cpu_used_cores=None,
            memory_used_gib=None,
            usage_note="no metrics yet",
            secrets=("registry",),
            **common,
        ),
        InstanceState(
            index=0,
            name="pod-a",
            node="gpu-node-1",
            ip="10.0.0.1",
            cpu_used_cores=1.5,
            memory_used_gib=2.0,
            secrets=("hcs-task-9-1",),
            **common,
        ),
    ]


@pytest.fixture
def running_task(world):
    cards = list(Device.objects.filter(node=world.node).order_by("index")[:2])
    Device.objects.filter(pk=cards[0].pk).update(utilization=87, vram_used_gib=Decimal("61.5"), temperature_c=71)
    placement = [
        {
            "node": world.node.pk,
            "node_name": "gpu-node-1",
            "gpu_model": "A100-80G",
            "devices": [{"id": card.pk, "index": card.index, "milli": 1000}],
        }
        for card in cards
    ]
    task = TaskFactory(
        project=world.project,
        owner=world.member,
        vdc=world.vdc,
        queue=world.high,
        instances=2,
        cpu=Decimal(2),
        memory_gib=Decimal(8),
        status="running",
        cluster=world.cluster,
        external_id="hcs-task-9-1",
        placement=placement,
    )
    task.set_secret_env({"HF_TOKEN": "hf_value_never_shown"})
    task.save()
    return task


def use(monkeypatch, executor) -> FakeExecutor:
    monkeypatch.setattr(instances_module, "executor_for", lambda cluster: executor)
    return executor


def test_the_api_lists_each_instance_with_use_against_request_cards_and_secret_names(world, running_task, monkeypatch):
    executor = use(monkeypatch, FakeExecutor(two_ranks()))
    response = client_for(world.viewer).get(f"/api/v1/tasks/{running_task.pk}/instances/")
    assert response.status_code == 200, response.content
    body = response.json()
    assert executor.asked == ["hcs-task-9-1"] and body["error"] == "" and body["note"] == ""
    first, second = body["instances"]
    assert [first["index"], second["index"]] == [0, 1]
    assert first["name"] == "pod-a" and first["ip"] == "10.0.0.1" and first["state"] == "Running"
    assert (first["cpu_used_cores"], first["cpu_requested_cores"], first["cpu_percent"]) == (1.5, 2.0, 75.0)
    assert (first["memory_used_gib"], first["memory_requested_gib"], first["memory_percent"]) == (2.0, 8.0, 25.0)
    assert second["cpu_used_cores"] is None and second["cpu_percent"] is None
    assert second["usage_note"] == "no metrics yet"
    # Rank 0 holds the first card, with the agent's figures; rank 1 the second.
    assert first["devices"][0]["utilization_percent"] == 87 and first["devices"][0]["vram_used_gib"] == 61.5
    assert first["devices"][0]["temperature_c"] == 71 and first["devices"][0]["model"] == "A100-80G"
    assert second["devices"][0]["index"] != first["devices"][0]["index"]
    assert first["ports"] == [{"port": 80, "target_port": 8000, "protocol": "TCP", "name": "http"}]
    assert first["ingress_host"] == "hcs-task-9-1.apps.example.org" and first["ingress_tls"] is True
    assert first["secrets"] == ["HF_TOKEN", "hcs-task-9-1"] and second["secrets"] == ["HF_TOKEN", "registry"]
    assert first["started_at"].startswith("2026-11-23T") and "hf_value_never_shown" not in response.content.decode()


def test_the_api_keeps_the_detail_permissions(world, running_task, monkeypatch):
    use(monkeypatch, FakeExecutor(two_ranks()))
    assert client_for(world.outsider).get(f"/api/v1/tasks/{running_task.pk}/instances/").status_code == 404
    assert client_for(None).get(f"/api/v1/tasks/{running_task.pk}/instances/").status_code in (401, 403)
    assert client_for(world.admin).get(f"/api/v1/tasks/{running_task.pk}/instances/").status_code == 200


def test_a_backend_error_or_a_hang_is_reported_not_raised(world, running_task, monkeypatch):
    use(monkeypatch, FakeExecutor(error=ExecutorError("Kubernetes API unreachable: refused")))
    body = client_for(world.member).get(f"/api/v1/tasks/{running_task.pk}/instances/").json()
    assert body == {"instances": [], "error": "Kubernetes API unreachable: refused", "note": ""}

    use(monkeypatch, FakeExecutor(two_ranks(), delay=2.0))
    monkeypatch.setattr(instances_module, "INSTANCES_TIMEOUT_S", 0.2)
    started = time.monotonic()
    body = client_for(world.member).get(f"/api/v1/tasks/{running_task.pk}/instances/").json()
    assert time.monotonic() - started < 1.5
    assert body["instances"] == [] and "did not answer within 0.2 s" in body["error"]


def test_a_waiting_or_ended_task_is_not_asked(world, running_task, monkeypatch):
    executor = use(monkeypatch, FakeExecutor(two_ranks()))
    running_task.status = "queued"
    running_task.save()
    body = client_for(world.member).get(f"/api/v1/tasks/{running_task.pk}/instances/").json()
    assert body["instances"] == [] and "waits for the scheduler" in body["note"]
    running_task.status = "completed"
    running_task.save()
    body = client_for(world.member).get(f"/api/v1/tasks/{running_task.pk}/instances/").json()
    assert "has ended" in body["note"] and executor.asked == []


def test_the_monitoring_page_and_its_polled_part_show_the_instances(client, world, running_task, monkeypatch):
    use(monkeypatch, FakeExecutor(two_ranks()))
    client.force_login(world.viewer)
    page = client.get(f"/task-monitoring/{running_task.pk}/").content.decode()
    part = client.get(f"/task-monitoring/{running_task.pk}/instances/").content.decode()
    for html in (page, part):
        assert 'data-instance="0"' in html and 'data-instance="1"' in html
        assert "10.0.0.1" in html and "1.50</span> / 2 cores" in html and "2.00 GiB</span> / 8 GiB" in html
        assert "hcs-task-9-1.apps.example.org" in html and ">TLS<" in html and "80→8000/TCP" in html
        assert "<code>HF_TOKEN</code>" in html and "hf_value_never_shown" not in html
        assert "87% · 61.5 / " in html
        assert "CPU and memory of some instances unknown: no metrics yet." in html
    assert 'data-instances-url="/task-monitoring/' in page
    client.force_login(world.outsider)
    assert client.get(f"/task-monitoring/{running_task.pk}/instances/").status_code == 404
