"""A card is known by what the hardware says, never deleted while held, and the same row when it comes back."""

import pytest
from django.db import transaction
from django.db.models import ProtectedError
from django.test import Client
from rest_framework.test import APIClient

from apps.billing import alerts
from apps.clusters.models import Device
from apps.clusters.services import issue_agent_token
from apps.control.scheduling import run_cycle
from apps.tasks.models import Task
from apps.tasks.services import stop_task, submit_task


def _card(index: int, uuid: str) -> dict:
    bus = f"00000000:{0x17 + int(uuid[-1]):02X}:00.0"
    return {
        "index": index,
        "uuid": uuid,
        "name": "NVIDIA A100-SXM4-80GB",
        "vram_total_gib": 80.0,
        "vram_used_gib": 0.0,
        "utilization": 0,
        "pci_bus_id": bus,
    }


@pytest.fixture
def reporter(world):
    """Posts node agent reports for the world's node, which starts with no cards."""
    world.node.devices.all().delete()
    secret = issue_agent_token(world.cluster, world.node.name, "rack-1")
    client = APIClient()

    def report(*uuids: str) -> dict:
        body = {
            "node": world.node.name,
            "cpu": 64,
            "memory_gib": 512.0,
            "devices": [_card(index, uuid) for index, uuid in enumerate(uuids)],
        }
        response = client.post("/api/v1/agent/report/", body, format="json", HTTP_AUTHORIZATION=f"Agent {secret}")
        assert response.status_code == 202, response.content
        return response.json()

    return report


def _submit(world, spec: str, name: str) -> Task:
    return submit_task(
        world.member, project=world.project, queue="high", kind="training", name=name, command="sleep 60", gpu_spec=spec
    )


def _cards(task: Task) -> set[int]:
    task.refresh_from_db()
    return {d["id"] for p in task.placement for d in p["devices"]}


def _by_uuid(world) -> dict[str, Device]:
    return {d.uuid: d for d in Device.objects.filter(node=world.node)}


def test_a_held_card_missing_from_a_report_is_kept_and_is_the_same_card_when_it_returns(world, reporter, settings):
    settings.METRICS_TOKEN = "card-identity"
    reporter("GPU-0", "GPU-1", "GPU-2", "GPU-3")
    rows = _by_uuid(world)
    holder = _submit(world, "2(A100)", "holder")
    run_cycle(world.vdc.pk)
    held = _cards(holder)
    assert holder.status == "scheduled" and len(held) == 2
    gone = next(uuid for uuid, row in rows.items() if row.pk in held)

    # The card drops out of the report; NVML numbers the others from 0 again.
    message = reporter(*[uuid for uuid in ("GPU-0", "GPU-1", "GPU-2", "GPU-3") if uuid != gone])["message"]
    after = _by_uuid(world)
    assert after[gone].pk == rows[gone].pk and after[gone].missing_since is not None
    assert f"({gone}) is no longer reported: marked missing" in message
    assert {uuid: row.pk for uuid, row in after.items()} == {uuid: row.pk for uuid, row in rows.items()}
    assert sorted(row.index for row in after.values() if row.missing_since is None) == [0, 1, 2]
    holder.refresh_from_db()
    assert holder.status == "scheduled" and _cards(holder) == held
    # Operators are told: the portal's own alert, and the gauge Prometheus alerts on.
    fired = [a for a in alerts.evaluate() if a.rule == "CardMissing"]
    assert [a.subject for a in fired] == [f"cluster {world.cluster.name} ({world.vdc.name})"]
    metrics = Client().get("/metrics", HTTP_AUTHORIZATION="Bearer card-identity").content.decode()
    assert f'hcs_cluster_missing_cards{{cluster="{world.cluster.name}",vdc="{world.vdc.name}"}} 1.0' in metrics

    # Nothing new is placed on the missing card, nor on the card the holder still has.
    second = _submit(world, "2(A100)", "second")
    run_cycle(world.vdc.pk)
    assert not _cards(second) & held and len(_cards(second)) == 2

    # It comes back: the same row, still the holder's; a third task finds nothing free.
    reporter("GPU-0", "GPU-1", "GPU-2", "GPU-3")
    back = _by_uuid(world)
    assert back[gone].pk == rows[gone].pk and back[gone].missing_since is None
    assert {row.index for row in back.values()} == {0, 1, 2, 3}
    third = _submit(world, "1(A100)", "third")
    run_cycle(world.vdc.pk)
    third.refresh_from_db()
    assert third.status == "queued"
    assert not [a for a in alerts.evaluate() if a.rule == "CardMissing"]


def test_a_held_card_is_never_deleted_whatever_deletes_it(world, reporter):
    reporter("GPU-0", "GPU-1")
    holder = _submit(world, "1(A100)", "holder")
    run_cycle(world.vdc.pk)
    (card_id,) = _cards(holder)
    # Each refusal in a savepoint of its own: the deletion runs in the caller's transaction, which it breaks.
    with pytest.raises(ProtectedError, match=f"held by task\\(s\\) #{holder.pk}"), transaction.atomic():
        Device.objects.get(pk=card_id).delete()
    with pytest.raises(ProtectedError), transaction.atomic():
        world.node.delete()
    assert Device.objects.filter(pk=card_id).exists()
    # Stopped, its job is still being cancelled: the card stays until the backend confirms the job gone.
    stop_task(holder, world.member)
    with pytest.raises(ProtectedError, match=f"#{holder.pk}"), transaction.atomic():
        Device.objects.get(pk=card_id).delete()
    holder.backend_objects.update(state="ended")
    Device.objects.get(pk=card_id).delete()


def test_a_report_naming_one_uuid_twice_is_refused_and_changes_nothing(world, reporter):
    reporter("GPU-0")
    secret = issue_agent_token(world.cluster, world.node.name, "rack-2")
    body = {
        "node": world.node.name,
        "cpu": 64,
        "memory_gib": 512.0,
        "devices": [_card(0, "GPU-7"), {**_card(1, "GPU-8"), "uuid": "GPU-7"}],
    }
    response = APIClient().post("/api/v1/agent/report/", body, format="json", HTTP_AUTHORIZATION=f"Agent {secret}")
    assert response.status_code == 400
    assert "Expected each device UUID once, got GPU-7 more than once." in str(response.json())
    assert list(Device.objects.filter(node=world.node).values_list("uuid", flat=True)) == ["GPU-0"]


def test_a_swapped_card_is_a_new_card_and_the_one_it_replaced_is_missing(world, reporter):
    reporter("GPU-0", "GPU-1")
    first = _by_uuid(world)
    reporter("GPU-0", "GPU-9")  # the card in slot 1 was replaced by another one
    after = _by_uuid(world)
    assert after["GPU-0"].pk == first["GPU-0"].pk
    assert after["GPU-1"].pk == first["GPU-1"].pk and after["GPU-1"].missing_since is not None
    assert after["GPU-9"].pk not in {row.pk for row in first.values()} and after["GPU-9"].index == 1
    assert world.vdc.capacity()["gpu"] == 2  # the missing card is no capacity
