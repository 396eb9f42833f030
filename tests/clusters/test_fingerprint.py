"""Agent report -> API -> database -> admin: device fingerprints checked against the catalog, new models."""

from __future__ import annotations

from decimal import Decimal

import pytest
from django.core.exceptions import ValidationError
from django.db import IntegrityError, transaction
from rest_framework.test import APIClient

from apps.clusters.agent import Collector
from apps.clusters.detectors import NodeCollector
from apps.clusters.detectors.ascend import AscendDetector
from apps.clusters.fingerprint import fingerprint
from apps.clusters.models import Device, GPUModel, Node
from apps.clusters.services import catalog, issue_agent_token
from tests.api.base import client_for
from tests.clusters import fake_tools
from tests.clusters.fake_tools import NPU_SMI
from tests.clusters.test_node_agent import GPUS, FakeNVML


def _post(world, report: dict):
    secret = issue_agent_token(world.cluster, report["node"])
    response = APIClient().post("/api/v1/agent/report/", report, format="json", HTTP_AUTHORIZATION=f"Agent {secret}")
    assert response.status_code == 202, response.content
    return response.json()


def _nvml_report(gpus, node="gpu-m"):
    collector = Collector(FakeNVML(gpus), node_name=node)
    collector.start()
    return collector.collect().as_dict()


def test_a_card_reporting_less_memory_than_its_model_loses_health_with_a_reason(world, client):
    half = [GPUS[0], dict(GPUS[0], vram=39.5)]  # an "A100-80GB" that shows 39.5 GiB
    answer = _post(world, _nvml_report(half))
    assert "GPU 1 (A100-80G): reports 39.5 GiB of memory; A100-80G has 80 GiB" in answer["message"]

    good, short = Device.objects.filter(node__name="gpu-m").order_by("index")
    assert (good.health_score, good.health_reason) == (100, "")
    assert short.health_score == 60 and short.health_reason == "reports 39.5 GiB of memory; A100-80G has 80 GiB"
    assert Node.objects.get(name="gpu-m").health_score == 60
    # The fingerprint: catalog figures for compute and bandwidth, the link kind, the driver the agent saw.
    assert (good.memory_bandwidth_gbps, good.tflops_fp16, good.tflops_fp32) == (
        Decimal("2039.0"),
        Decimal("312.00"),
        Decimal("19.50"),
    )
    assert (good.figures_source, good.interconnect, good.driver_version) == ("catalog", "nvlink", "550.54.15")
    assert good.reported_name == "NVIDIA A100-SXM4-80GB"

    # The API and the admin show the reason.
    api = client_for(world.admin).get(f"/api/v1/devices/{short.pk}/")
    assert api.status_code == 200 and api.json()["health_reason"] == short.health_reason
    assert api.json()["interconnect"] == "nvlink" and api.json()["memory_bandwidth_gbps"] == "2039.0"
    client.force_login(world.admin)
    page = client.get(f"/admin/clusters/device/{short.pk}/change/")
    assert page.status_code == 200 and "reports 39.5 GiB of memory; A100-80G has 80 GiB" in page.content.decode()
    listing = client.get("/admin/clusters/device/", {"node__cluster__id__exact": world.cluster.pk})
    assert "reports 39.5 GiB of memory" in listing.content.decode()

    # Fixed card, next report: healthy again.
    _post(world, _nvml_report(GPUS[:2]))
    short.refresh_from_db()
    assert (short.health_score, short.health_reason) == (100, "")


def test_an_unknown_model_waits_unrated_and_unscheduled_until_an_admin_rates_it(world, client):
    report = _nvml_report([GPUS[0], {"name": "NVIDIA Quadro RTX 9999", "vram": 48}], node="gpu-q")
    answer = _post(world, report)
    assert answer["devices"] == 1 and "new model Quadro-RTX-9999: set its exchange rate" in answer["message"]
    new = GPUModel.objects.get(name="Quadro-RTX-9999")
    assert (new.exchange_rate, new.enabled, new.vendor, new.vram_gib) == (None, False, "nvidia", Decimal("48.00"))
    assert new.resource_name == "nvidia.com/gpu" and not new.is_rated
    assert "Quadro-RTX-9999" not in catalog()  # the GPU spec parser and the scheduler never see it
    _post(world, report)  # reported again: still one catalog row, still no device
    assert GPUModel.objects.filter(name="Quadro-RTX-9999").count() == 1
    assert not Device.objects.filter(gpu_model=new).exists()

    # The admin flags it, and will not enable it (nor a device of it) without a rate; neither will the database.
    client.force_login(world.admin)
    page = client.get("/admin/clusters/gpumodel/", {"rated": "no"}).content.decode()
    assert "new model: set its exchange rate" in page and ">Quadro-RTX-9999</a>" in page and ">A100-80G</a>" not in page
    new.enabled = True
    with pytest.raises(ValidationError, match="New model: set its exchange rate"):
        new.full_clean()
    with pytest.raises(ValidationError, match="set its exchange rate in the GPU catalog first"):
        Device(node=world.node, index=99, gpu_model=new, vram_gib=48).full_clean()
    with transaction.atomic(), pytest.raises(IntegrityError):
        GPUModel.objects.filter(pk=new.pk).update(enabled=True)

    # Rated and enabled: the next report adds the card at that rate.
    new.exchange_rate = Decimal("0.9")
    new.full_clean()
    new.save()
    answer = _post(world, report)
    assert answer["devices"] == 2 and "new model" not in answer["message"]
    assert Device.objects.get(node__name="gpu-q", index=1).gpu_model == new
    assert catalog().rate("Quadro-RTX-9999") == 0.9


def test_the_gpu_model_api_refuses_an_enabled_model_without_a_rate(world):
    body = {
        "name": "K100-AI",
        "vendor": "hygon",
        "vram_gib": "64",
        "resource_name": "hygon.com/dcu",
        "visible_devices_env": "HIP_VISIBLE_DEVICES",
        "enabled": True,
    }
    response = client_for(world.admin).post("/api/v1/gpu-models/", body, format="json")
    assert response.status_code == 400 and "exchange rate" in str(response.json())
    assert not GPUModel.objects.filter(name="K100-AI").exists()


def test_ascend_report_through_the_api_matches_910b3_and_flags_910b4_as_new(world, tmp_path, monkeypatch):
    fake_tools.install(tmp_path / "bin", "npu-smi", NPU_SMI)
    monkeypatch.setenv("PATH", str(tmp_path / "bin"))
    collector = NodeCollector([AscendDetector()], node_name="npu-1")
    collector.start()
    answer = _post(world, collector.collect().as_dict())
    assert answer["devices"] == 3 and "GPU 3 (Ascend 910B4): new model 910B4" in answer["message"]
    devices = list(Device.objects.filter(node__name="npu-1").order_by("index"))
    assert [d.gpu_model.name for d in devices] == ["Ascend910B"] * 3
    d0, d1, d2 = devices
    assert (d0.interconnect, d0.driver_version, d0.tflops_fp16, d0.memory_bandwidth_gbps) == (
        "hccs",
        "23.0.rc3",
        Decimal("280.00"),
        None,  # Huawei publishes no bandwidth for the 910B
    )
    assert d1.health_score == 40 and "2 uncorrected ECC error(s)" in d1.health_reason
    assert d2.health_score == 60 and "the vendor tool reports health warning" in d2.health_reason
    assert GPUModel.objects.get(name="910B4").vendor == "huawei"


@pytest.mark.parametrize(
    ("device", "reasons"),
    [
        ({"vram_total_gib": 79.6}, []),
        (
            {"vram_total_gib": 120.0},
            ["reports 120 GiB of memory, more than A100-80G's 80 GiB: check the catalog match"],
        ),
        (
            {"vram_total_gib": 80.0, "memory_bandwidth_gbps": 900.0},
            ["measured 900 GB/s memory bandwidth; A100-80G peaks at 2039.0 GB/s"],
        ),
        (
            {"vram_total_gib": 80.0, "vendor": "huawei"},
            ["reported by the huawei detector but A100-80G is a nvidia model"],
        ),
    ],
    ids=["within-tolerance", "more-memory", "slow-memory", "other-vendor"],
)
def test_fingerprint_mismatches(db, device, reasons):
    a100 = GPUModel.objects.get(name="A100-80G")
    fp = fingerprint({"links": [], **device}, a100, "550", "12.4")
    assert fp.reasons == reasons and (fp.penalty > 0) == bool(reasons)
    assert (fp.driver_version, fp.runtime_version, fp.interconnect) == ("550", "12.4", "pcie")
    assert fp.figures_source == ("measured" if "memory_bandwidth_gbps" in device else "catalog")


def test_cards_of_a_disabled_model_are_left_out_and_named(world):
    GPUModel.objects.filter(name="T4").update(enabled=False)
    answer = _post(world, _nvml_report([{"name": "Tesla T4", "vram": 15}], node="gpu-t"))
    assert answer["devices"] == 0 and "GPU 0 (Tesla T4) is of the disabled model T4" in answer["message"]
    assert not GPUModel.objects.filter(exchange_rate__isnull=True).exists()  # no second, unrated T4


def test_a_rated_model_cannot_go_back_to_unrated(db):
    a100 = GPUModel.objects.get(name="A100-80G")
    a100.exchange_rate = None
    a100.enabled = False
    with pytest.raises(ValidationError, match=r"Expected an exchange rate \(it was 1.000\)"):
        a100.full_clean()


def test_a_new_model_the_catalog_cannot_take_still_leaves_the_report_accepted(world, monkeypatch):
    def refuse(**kwargs):
        raise IntegrityError('duplicate key value violates unique constraint "clusters_gpumodel_pkey"')

    monkeypatch.setattr(GPUModel.objects, "get_or_create", refuse)
    answer = _post(world, _nvml_report([GPUS[0], {"name": "NVIDIA Quadro RTX 9999", "vram": 48}], node="gpu-x"))
    assert answer["devices"] == 1
    assert (
        "GPU 1 (NVIDIA Quadro RTX 9999) is of a model the catalog lacks and that could not be entered"
        in (answer["message"])
    )
