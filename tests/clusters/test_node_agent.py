"""The node agent: NVML collection (fake NVML backend), health folding, and the report endpoint."""

import hashlib
import io
import json
import shutil
import subprocess
from decimal import Decimal
from pathlib import Path
from types import SimpleNamespace

import pynvml
import pytest
from django.core.management import CommandError, call_command
from rest_framework.test import APIClient

from apps.clusters.agent import Collector, DeviceReport, health_score
from apps.clusters.models import AgentToken, Device
from apps.clusters.services import issue_agent_token, match_gpu_model


class FakeNVML:
    """The NVML functions the collector calls, over a list of fake GPUs joined in NVLink pairs."""

    NVMLError = pynvml.NVMLError
    NVML_TEMPERATURE_GPU = 0
    NVML_MEMORY_ERROR_TYPE_UNCORRECTED = 1
    NVML_VOLATILE_ECC = 0
    NVML_NVLINK_MAX_LINKS = 4
    NVML_FEATURE_ENABLED = 1
    nvmlEventTypeXidCriticalError = 8

    def __init__(self, gpus, xids=()):
        self.gpus = gpus
        self.xids = list(xids)  # (gpu index, xid) events waiting
        self.shut = False

    def nvmlInit(self):
        pass

    def nvmlShutdown(self):
        self.shut = True

    def nvmlSystemGetDriverVersion(self):
        return "550.54.15"

    def nvmlDeviceGetCount(self):
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, i):
        return i

    def nvmlDeviceGetPciInfo(self, h):
        return SimpleNamespace(busId=f"00000000:{0x17 + h:02X}:00.0".encode())

    def nvmlDeviceGetMemoryInfo(self, h):
        return SimpleNamespace(total=self.gpus[h]["vram"] * 2**30, used=self.gpus[h].get("used", 0) * 2**30)

    def nvmlDeviceGetUUID(self, h):
        return f"GPU-fake-{h}"

    def nvmlDeviceGetName(self, h):
        return self.gpus[h]["name"]

    def nvmlDeviceGetUtilizationRates(self, h):
        return SimpleNamespace(gpu=self.gpus[h].get("util", 0), memory=0)

    def nvmlDeviceGetTemperature(self, h, sensor):
        return self.gpus[h].get("temp", 40)

    def nvmlDeviceGetTotalEccErrors(self, h, error_type, counter):
        return self.gpus[h].get("ecc_uncorrected" if error_type == 1 else "ecc_corrected", 0)

    def nvmlDeviceGetNumaNodeId(self, h):
        return h // 4

    def nvmlDeviceGetRetiredPagesPendingStatus(self, h):
        return 0

    def nvmlDeviceGetNvLinkState(self, h, link):
        if link >= 2:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return 1

    def nvmlDeviceGetNvLinkRemotePciInfo(self, h, link):
        return self.nvmlDeviceGetPciInfo(h ^ 1)  # pairs 0-1, 2-3 with two links each

    def nvmlEventSetCreate(self):
        return object()

    def nvmlDeviceRegisterEvents(self, h, kind, events):
        pass

    def nvmlEventSetWait(self, events, timeout_ms):
        if not self.xids:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_TIMEOUT)
        index, xid = self.xids.pop(0)
        return SimpleNamespace(device=index, eventData=xid)


GPUS = [{"name": "NVIDIA A100-SXM4-80GB", "vram": 80, "used": 10, "util": 55, "temp": 50} for _ in range(4)]


def test_collector_reports_devices_memory_utilisation_temperature_and_nvlink_pairs():
    collector = Collector(FakeNVML(GPUS), node_name="gpu-a")
    assert collector.start()
    report = collector.collect()
    assert report.node == "gpu-a" and report.driver == "550.54.15" and len(report.devices) == 4
    d0 = report.devices[0]
    assert (d0.vram_total_gib, d0.vram_used_gib, d0.utilization, d0.temperature_c) == (80, 10, 55, 50)
    assert d0.links == [{"peer": 1, "type": "nvlink", "bandwidth_gbps": 100}]
    assert report.devices[2].links[0]["peer"] == 3
    assert d0.health_score == 100


class FakeNVMLWithReserve(FakeNVML):
    """A driver from 510 on: the first memory call counts the driver's reserve as used, ``_v2`` reports it apart.

    Seen on a real H100 (driver 580, scripts/gpu_check.py): 0.47 GiB used by the first call on an idle card,
    0 by nvidia-smi, which uses the second.
    """

    nvmlMemory_v2 = pynvml.nvmlMemory_v2
    reserve_gib = 0.47

    def __init__(self, gpus, has_v2=True):
        super().__init__(gpus)
        self.has_v2 = has_v2

    def nvmlDeviceGetMemoryInfo(self, h, version=None):
        total, used = self.gpus[h]["vram"] * 2**30, self.gpus[h].get("used", 0) * 2**30
        reserved = int(self.reserve_gib * 2**30)
        if version is None:
            return SimpleNamespace(total=total, used=used + reserved, free=total - used - reserved)
        assert version == pynvml.nvmlMemory_v2
        if not self.has_v2:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_FUNCTION_NOT_FOUND)
        return SimpleNamespace(total=total, reserved=reserved, used=used, free=total - used - reserved)


@pytest.mark.parametrize(("has_v2", "used"), [(True, [0.0, 10.0]), (False, [0.47, 10.47])])
def test_used_memory_leaves_out_the_drivers_own_reserve_where_the_driver_reports_it_apart(has_v2, used):
    gpus = [dict(GPUS[0], used=0), dict(GPUS[0])]
    collector = Collector(FakeNVMLWithReserve(gpus, has_v2=has_v2), node_name="gpu-a")
    collector.start()
    report = collector.collect()
    assert [d.vram_used_gib for d in report.devices] == used
    assert [d.vram_total_gib for d in report.devices] == [80, 80] and report.message == ""


def test_ecc_and_xid_errors_fold_into_the_health_score():
    gpus = [dict(GPUS[0]), dict(GPUS[0], ecc_uncorrected=2), dict(GPUS[0], temp=90), dict(GPUS[0])]
    collector = Collector(FakeNVML(gpus, xids=[(3, 79)]), node_name="gpu-a")
    collector.start()
    scores = [d.health_score for d in collector.collect().devices]
    assert scores == [100, 40, 80, 60]
    assert [d.xid_errors for d in collector.collect().devices] == [0, 0, 0, 0]  # counted once


def test_health_score_never_leaves_0_to_100():
    d = DeviceReport(0, "u", "n", 1, 0, 0, 99, 5, 500, 9, "", None)
    assert health_score(d, retired_pending=True) == 0


def test_real_nvml_reads_this_host():
    """Runs everywhere, never skipped: on a GPU host (nvidia-smi present) it reads the real devices through pynvml
    and checks them against nvidia-smi; without one it checks that the agent reports none and says why."""
    collector = Collector(node_name="this-host")
    if shutil.which("nvidia-smi") is None:
        assert not collector.start()
        report = collector.collect()
        assert report.devices == [] and "no NVIDIA GPU" in report.message
        return
    assert collector.start(), collector.reason
    try:
        report = collector.collect()
    finally:
        collector.stop()
    smi = (
        subprocess.run(
            ["nvidia-smi", "--query-gpu=name,memory.total,pci.bus_id,driver_version", "--format=csv,noheader,nounits"],
            capture_output=True,
            text=True,
            check=True,
            timeout=30,
        )
        .stdout.strip()
        .splitlines()
    )
    assert report.message == "" and len(report.devices) == len(smi) >= 1
    for device, line in zip(report.devices, smi, strict=True):
        name, mib, bus, driver = (part.strip() for part in line.split(","))
        assert device.name == name and device.pci_bus_id.upper() == bus.upper() and report.driver == driver
        assert abs(device.vram_total_gib - int(mib) / 1024) < 0.1
        assert device.uuid.startswith("GPU-") and 0 <= device.utilization <= 100 and device.runtime_version
        assert 0 <= device.health_score <= 100


@pytest.mark.parametrize(
    ("name", "vram", "expected"),
    [
        ("NVIDIA A100-SXM4-80GB", 80, "A100-80G"),
        ("NVIDIA H100 80GB HBM3", 80, "H100"),
        ("Tesla V100-SXM2-32GB", 32, "V100-32G"),
        ("Tesla V100-PCIE-16GB", 16, "V100-16G"),
        ("Tesla T4", 15, "T4"),
        ("NVIDIA Quadro RTX 9999", 48, None),
    ],
)
def test_nvml_names_map_onto_the_catalog(db, name, vram, expected):
    from apps.clusters.models import GPUModel

    model = match_gpu_model(name, vram, list(GPUModel.objects.all()))
    assert (model.name if model else None) == expected


def test_report_endpoint_upserts_the_node_and_devices_with_an_agent_token(world):
    secret = issue_agent_token(world.cluster, "gpu-b")
    gpus = GPUS[:2] + [{"name": "NVIDIA Quadro RTX 9999", "vram": 48}]
    collector = Collector(FakeNVML(gpus), node_name="gpu-b")
    collector.start()
    client = APIClient()
    response = client.post(
        "/api/v1/agent/report/", collector.collect().as_dict(), format="json", HTTP_AUTHORIZATION=f"Agent {secret}"
    )
    assert response.status_code == 202, response.content
    assert response.json()["devices"] == 2
    assert "new model Quadro-RTX-9999: set its exchange rate" in response.json()["message"]
    devices = Device.objects.filter(node__name="gpu-b", node__cluster=world.cluster).order_by("index")
    assert [d.gpu_model.name for d in devices] == ["A100-80G", "A100-80G"]
    assert devices[0].links[0]["peer"] == 1

    # The next report, without device 1, marks it missing (never deleted: a task may hold it); a bad token changes
    # nothing.
    collector.nvml.gpus = GPUS[:1]
    again = client.post(
        "/api/v1/agent/report/", collector.collect().as_dict(), format="json", HTTP_AUTHORIZATION=f"Agent {secret}"
    )
    assert again.status_code == 202, again.content
    assert devices.all().count() == 2 and devices.all().present().count() == 1
    assert "GPU 1 (GPU-fake-1) is no longer reported: marked missing" in again.json()["message"]
    bad = client.post("/api/v1/agent/report/", {"node": "x"}, format="json", HTTP_AUTHORIZATION="Agent nope")
    assert bad.status_code == 401


def test_an_agent_token_reports_for_its_own_node_only(world):
    """A host's token cannot add devices to another node, nor empty it with a report of no devices."""
    secret = issue_agent_token(world.cluster, "gpu-c")
    client = APIClient()
    own = {"node": "gpu-c", "cpu": 64, "memory_gib": 512.0, "devices": [_device(0)]}
    response = client.post("/api/v1/agent/report/", own, format="json", HTTP_AUTHORIZATION=f"Agent {secret}")
    assert response.status_code == 202, response.content

    cards = world.node.devices.count()
    for node in (world.node.name, "gpu-new"):
        other = {"node": node, "cpu": 1, "memory_gib": 1.0, "devices": []}
        refused = client.post("/api/v1/agent/report/", other, format="json", HTTP_AUTHORIZATION=f"Agent {secret}")
        assert refused.status_code == 403, refused.content
        detail = refused.json()["detail"]
        assert f"reports for node 'gpu-c' of cluster '{world.cluster.name}' only, not '{node}'" in detail
        assert f"issue_agent_token {world.cluster.name} {node}" in detail
    world.node.refresh_from_db()
    assert world.node.devices.count() == cards and world.node.cpu == 64
    assert not world.cluster.nodes.filter(name="gpu-new").exists()


def test_a_cluster_wide_token_from_before_node_scoping_is_refused_with_what_to_do(world):
    secret = "old-cluster-wide-token"
    AgentToken.objects.create(cluster=world.cluster, name="agent", key_hash=hashlib.sha256(secret.encode()).hexdigest())
    body = {"node": world.node.name, "cpu": 64, "memory_gib": 512.0, "devices": []}
    response = APIClient().post("/api/v1/agent/report/", body, format="json", HTTP_AUTHORIZATION=f"Agent {secret}")
    assert response.status_code == 403
    assert "cluster-wide" in response.json()["detail"]
    assert "issue_agent_token <cluster> <node>" in response.json()["detail"]
    assert world.node.devices.count() == 8


def test_issue_agent_token_command_binds_the_token_to_the_node(world):
    out = io.StringIO()
    call_command("issue_agent_token", world.cluster.name, "gpu-d", stdout=out)
    token = AgentToken.objects.get(cluster=world.cluster, node_name="gpu-d")
    assert token.key_hash == hashlib.sha256(out.getvalue().strip().encode()).hexdigest()
    assert token.name == "gpu-d"
    with pytest.raises(CommandError, match="Expected a node name of 1 to 128 characters"):
        call_command("issue_agent_token", world.cluster.name, " ", stdout=io.StringIO())
    with pytest.raises(CommandError, match="Expected the name of one cluster"):
        call_command("issue_agent_token", "no-such-cluster", "gpu-d", stdout=io.StringIO())


def test_report_with_a_malformed_body_is_rejected_and_writes_nothing(world):
    secret = issue_agent_token(world.cluster, "gpu-c")
    response = APIClient().post(
        "/api/v1/agent/report/", {"node": "gpu-c", "cpu": -1}, format="json", HTTP_AUTHORIZATION=f"Agent {secret}"
    )
    assert response.status_code == 400 and "cpu" in response.json()
    assert not world.cluster.nodes.filter(name="gpu-c").exists()


def _device(index: int, **overrides) -> dict:
    return {
        "index": index,
        "uuid": f"GPU-{index}",
        "name": "NVIDIA A100-SXM4-80GB",
        "vram_total_gib": 80.0,
        "vram_used_gib": 1.0,
        "utilization": 5,
        **overrides,
    }


@pytest.mark.parametrize(
    ("field", "report"),
    [
        ("cpu", {"cpu": 1e30}),
        ("memory_gib", {"memory_gib": 1e30}),
        ("devices", {"devices": [_device(0, vram_total_gib=1e30)]}),
        ("devices", {"devices": [_device(0, xid_errors=10**30)]}),
        ("devices", {"devices": [_device(0, temperature_c=10**6)]}),
        ("devices", {"devices": [_device(0, links=[{"peer": 1, "type": "warp-drive"}])]}),
        ("devices", {"devices": [_device(0, links=[{"peer": "x\u0000", "type": "nvlink"}])]}),
        ("devices", {"devices": [_device(0), _device(0)]}),
    ],
    ids=[
        "huge-cpu",
        "huge-memory",
        "huge-vram",
        "huge-xid-count",
        "hot-device",
        "unknown-link-type",
        "nul-link",
        "duplicate-device-index",
    ],
)
def test_reports_out_of_bounds_are_a_400_and_write_nothing(world, field, report):
    secret = issue_agent_token(world.cluster, "gpu-c")
    body = {"node": "gpu-c", "cpu": 64, "memory_gib": 512.0, **report}
    response = APIClient().post("/api/v1/agent/report/", body, format="json", HTTP_AUTHORIZATION=f"Agent {secret}")
    assert response.status_code == 400, response.content
    assert field in response.json()
    assert not world.cluster.nodes.filter(name="gpu-c").exists()


def test_xid_errors_accumulate_up_to_what_the_column_holds(world):
    secret = issue_agent_token(world.cluster, "gpu-c")
    body = {"node": "gpu-c", "cpu": 64, "memory_gib": 512.0, "devices": [_device(0, xid_errors=10**9)]}
    client = APIClient()
    for _ in range(3):
        response = client.post("/api/v1/agent/report/", body, format="json", HTTP_AUTHORIZATION=f"Agent {secret}")
        assert response.status_code == 202, response.content
    assert Device.objects.get(node__name="gpu-c").xid_errors == 2**31 - 1


def test_a_report_read_off_a_real_h100_lands_as_a_healthy_h100(world):
    """fixtures/nvml-h100-report.json is what the NVML collector reported on an NVIDIA H100 80GB HBM3 (driver
    580.159.04, CUDA 13.0) in scripts/gpu_check.py, byte for byte: the portal matches it to the catalog's H100
    without a fingerprint complaint (79.65 GiB is within 90 % of 80) and stores what the card said."""
    report = json.loads((Path(__file__).parent / "fixtures" / "nvml-h100-report.json").read_text())
    secret = issue_agent_token(world.cluster, report["node"])
    response = APIClient().post("/api/v1/agent/report/", report, format="json", HTTP_AUTHORIZATION=f"Agent {secret}")
    assert response.status_code == 202, response.content
    assert response.json()["devices"] == 1 and response.json()["message"] == ""
    device = Device.objects.get(node__name=report["node"], node__cluster=world.cluster)
    assert device.gpu_model.name == "H100" and device.reported_name == "NVIDIA H100 80GB HBM3"
    assert (device.health_score, device.health_reason) == (100, "")
    assert device.vram_gib == Decimal("79.65") and device.vram_used_gib == 0
    assert (device.driver_version, device.runtime_version) == ("580.159.04", "13.0")
    assert device.uuid == report["devices"][0]["uuid"] and device.pci_bus_id == "00000000:00:06.0"
    assert device.interconnect == "pcie"  # one card: no NVLink peers
