"""Capacity reservations through the API and the admin: clear errors on bad input, nothing saved."""

from datetime import timedelta

import pytest
from django.utils import timezone

from apps.clusters.models import CapacityReservation, GPUModel
from tests.admin.conftest import admin_url, form_data
from tests.api.base import client_for
from tests.factories import ClusterFactory, NodeFactory

URL = "/api/v1/capacity-reservations/"


def body(world, **fields):
    start = timezone.now() + timedelta(days=1)
    data = {
        "vdc": world.vdc.pk,
        "name": "rack-b",
        "starts_at": start.isoformat(),
        "ends_at": (start + timedelta(hours=4)).isoformat(),
    }
    data.update(fields)
    return data


def a100_pk():
    return GPUModel.objects.get(name="A100-80G").pk


def test_admin_creates_an_event_reservation_and_members_read_it(world):
    r = client_for(world.admin).post(
        URL,
        body(world, cluster=world.cluster.pk, gpu_model=a100_pk(), cards=4, projects=[world.project.pk]),
        format="json",
    )
    assert r.status_code == 201, r.content
    assert r.json()["holds"] == "4 × A100-80G on local-1 (whole nodes)" and r.json()["maintenance"] is False
    listed = client_for(world.member).get(URL, {"window": "upcoming"}).json()["results"]
    assert [x["name"] for x in listed] == ["rack-b"]
    assert client_for(world.member).post(URL, body(world, name="mine"), format="json").status_code == 403


@pytest.mark.parametrize(
    ("fields", "field", "message"),
    [
        ({"ends_at": None}, "ends_at", "Expected an end after the start"),
        ({"gpu_model": "a100", "cards": 9}, "cards", "Expected at most 8 A100-80G cards (what VDC main has)."),
        ({"gpu": "8.5"}, "gpu", "Expected at most 8 GPU-equivalents (what VDC main has)."),
        ({"cpu": "65"}, "cpu", "Expected at most 64 CPU cores (what VDC main has)."),
        ({"cards": 2}, "gpu_model", "Expected the GPU model whose cards are held."),
        ({"gpu_model": "a100", "cards": 2, "gpu": "1"}, "gpu", "Hold either cards of a model or GPU-equivalents"),
        ({"nodes": "node", "cards": 1, "gpu_model": "a100"}, "nodes", "Hold either named nodes or an amount"),
        ({"cluster": "other"}, "cluster", "Expected a cluster of VDC main"),
    ],
)
def test_bad_input_is_refused_with_a_clear_error_and_nothing_saved(world, fields, field, message):
    data = body(world)
    for key, value in fields.items():
        if key == "ends_at":
            value = data["starts_at"]
        elif value == "a100":
            value = a100_pk()
        elif key == "nodes":
            value = [world.node.pk]
        elif key == "cluster":
            value = ClusterFactory(name="elsewhere").pk
        data[key] = value
    r = client_for(world.admin).post(URL, data, format="json")
    assert r.status_code == 400, r.content
    assert any(message in text for text in r.json()[field]), r.json()
    assert not CapacityReservation.objects.exists()


def test_nodes_of_another_cluster_are_refused(world):
    other = NodeFactory(cluster=ClusterFactory(vdc=world.vdc, name="local-2"), name="n2")
    r = client_for(world.admin).post(URL, body(world, cluster=world.cluster.pk, nodes=[other.pk]), format="json")
    assert r.status_code == 400 and "Expected nodes of cluster local-1" in r.json()["nodes"][0]


def test_outsider_of_the_vdc_does_not_see_it(world):
    from tests.factories import VDCFactory

    north = VDCFactory(name="north")
    CapacityReservation.objects.create(
        vdc=north, name="north-only", starts_at=timezone.now(), ends_at=timezone.now() + timedelta(hours=1)
    )
    assert client_for(world.member).get(URL).json()["results"] == []


def test_admin_form_refuses_an_end_before_the_start_and_saves_a_valid_one(client, world):
    client.force_login(world.admin)
    admin_web = client
    page = admin_web.get(admin_url(CapacityReservation, "add"))
    data = form_data(page)
    start = timezone.now() + timedelta(days=1)
    data.update(
        {
            "vdc": world.vdc.pk,
            "cluster": world.cluster.pk,
            "name": "firmware",
            "starts_at_0": start.strftime("%Y-%m-%d"),
            "starts_at_1": "10:00:00",
            "ends_at_0": start.strftime("%Y-%m-%d"),
            "ends_at_1": "09:00:00",
            "nodes": [world.node.pk],
        }
    )
    r = admin_web.post(admin_url(CapacityReservation, "add"), data)
    assert r.status_code == 200 and "Expected an end after the start" in r.content.decode()
    data["ends_at_1"] = "18:00:00"
    data.update({"gpu_model": a100_pk(), "cards": 2})
    r = admin_web.post(admin_url(CapacityReservation, "add"), data)
    assert r.status_code == 200 and "Hold either named nodes or an amount, not both." in r.content.decode()
    data.update({"gpu_model": "", "cards": 0})
    r = admin_web.post(admin_url(CapacityReservation, "add"), data)
    assert r.status_code == 302, r.content.decode()[:2000]
    saved = CapacityReservation.objects.get()
    assert list(saved.nodes.all()) == [world.node] and saved.held_summary() == "nodes gpu-node-1"


def test_windows_filter_the_same_in_the_api_and_the_admin(world, client):
    client.force_login(world.admin)
    admin_web = client
    now = timezone.now()
    for name, start, end in (("past", -3, -1), ("now", -1, 1), ("soon", 1, 3)):
        CapacityReservation.objects.create(
            vdc=world.vdc, name=name, starts_at=now + timedelta(hours=start), ends_at=now + timedelta(hours=end)
        )
    expected = {"current": ["now"], "upcoming": ["soon"], "ended": ["past"], "active": ["now", "soon"]}
    for window, names in expected.items():
        listed = client_for(world.member).get(URL, {"window": window}).json()["results"]
        assert sorted(x["name"] for x in listed) == names, window
        if window != "active":  # the admin's list filter offers the three states
            page = admin_web.get(admin_url(CapacityReservation, "changelist"), {"window": window}).content.decode()
            assert [n for n in ("past", "now", "soon") if f">{n}<" in page] == [
                n for n in ("past", "now", "soon") if n in names
            ], window
    assert client_for(world.member).get(URL, {"window": "someday"}).status_code == 400
    # A hand-edited admin URL filters nothing rather than failing.
    page = admin_web.get(admin_url(CapacityReservation, "changelist"), {"window": "someday"})
    assert page.status_code == 200 and all(f">{n}<" in page.content.decode() for n in ("past", "now", "soon"))
