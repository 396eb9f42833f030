"""The Device admin page declares a card's sharing (MIG layout, time-sliced replicas) through the service."""

from __future__ import annotations

from apps.clusters.models import Device
from tests.admin.conftest import admin_url, form_data


def test_the_admin_device_form_declares_a_mig_layout_and_shows_a_bad_one_as_a_field_error(admin_web, world):
    device = Device.objects.get(node=world.node, index=0, parent=None)
    data = form_data(admin_web.get(admin_url(device)))
    bad = admin_web.post(admin_url(device), {**data, "sharing_mode": "mig", "mig_layout": "4g.40gb, 4g.40gb"})
    assert bad.status_code == 200
    assert "needs 8 slices" in str(bad.context["adminform"].form.errors["mig_layout"])
    assert not device.units.exists()
    good = admin_web.post(admin_url(device), {**data, "sharing_mode": "mig", "mig_layout": "3g.40gb, 1g.10gb x2"})
    assert good.status_code == 302
    assert sorted(device.units.values_list("gpu_model__name", flat=True)) == [
        "A100-80G-1g.10gb",
        "A100-80G-1g.10gb",
        "A100-80G-3g.40gb",
    ]
    again = form_data(admin_web.get(admin_url(device)))
    assert again["mig_layout"] == "3g.40gb, 1g.10gb, 1g.10gb" and again["sharing_mode"] == "mig"
    slices = admin_web.post(admin_url(device), {**again, "sharing_mode": "time_slicing", "replicas": "3"})
    assert slices.status_code == 302
    device.refresh_from_db()
    assert device.sharing == "time_slicing" and device.units.filter(gpu_model__name="A100-80G-ts3").count() == 3
