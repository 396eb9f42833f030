"""MIG profiles and time-sliced replicas in the GPU spec grammar and the catalog, and the node agent reporting a
card's MIG layout through NVML (a fake NVML: no GPU here)."""

from decimal import Decimal
from types import SimpleNamespace

import pynvml
import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from rest_framework.test import APIClient

from apps.clusters.agent import Collector
from apps.clusters.catalog import GPU_CATALOG, MIG_CATALOG, MIG_PROFILES
from apps.clusters.choices import Sharing
from apps.clusters.gpuspec import Catalog, GPURequest, GPUSpecError, equivalents, format_gpu_spec, parse_gpu_spec
from apps.clusters.models import Device, GPUModel
from apps.clusters.services import issue_agent_token
from tests.clusters.test_node_agent import GPUS, FakeNVML

D = Decimal
CATALOG = Catalog.default()
# A catalog with time-sliced rows as an admin's declarations create them (4 and 2 replicas of an A100-80G).
WITH_TS = Catalog(
    [
        *GPU_CATALOG,
        *MIG_CATALOG,
        *(
            {
                "name": f"A100-80G-ts{n}",
                "vendor": "nvidia",
                "aliases": ["A100-80G-ts", "a100-ts"],
                "vram_gib": 80,
                "exchange_rate": 1 / n,
                "partition": "time_slice",
                "parent": "A100-80G",
                "replicas": n,
            }
            for n in (2, 4)
        ),
    ]
)


def parse(text, catalog=CATALOG):
    return parse_gpu_spec(text, catalog)


# --- grammar ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "models", "count"),
    [
        ("1(A100-80G-1g.10gb)", ("A100-80G-1g.10gb",), 1),
        ("2(a100-3g.40gb)", ("A100-80G-3g.40gb",), 2),
        ("1(H100_1g.10gb)", ("H100-1g.10gb",), 1),
        ("1(a100-sxm4-80gb-7g.80gb)", ("A100-80G-7g.80gb",), 1),
        ("1(A100-80G-1g.10gb|H100-1g.10gb)", ("A100-80G-1g.10gb", "H100-1g.10gb"), 1),
    ],
)
def test_a_mig_profile_is_named_card_dash_profile_through_any_card_alias(text, models, count):
    req = parse(text)
    assert req == GPURequest(count=D(count), models=models)
    assert parse(format_gpu_spec(req)) == req


def test_a_time_sliced_replica_is_card_dash_ts_and_means_any_declared_replica_count():
    req = parse("1(A100-ts)", WITH_TS)
    assert req.models == ("A100-80G-ts2", "A100-80G-ts4")
    assert parse(format_gpu_spec(req), WITH_TS) == req
    # At submit a request is worth its cheapest landing: a quarter card.
    assert equivalents(req, WITH_TS) == D("0.25")
    assert equivalents(req, WITH_TS, "A100-80G-ts2") == D("0.5")


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            "1(A100-80G-5g.50gb)",
            "unknown MIG profile '5g.50gb' of A100-80G .*; its profiles: 1g.10gb, 1g.20gb, "
            "2g.20gb, 3g.40gb, 4g.40gb, 7g.80gb",
        ),
        ("1(T4-1g.10gb)", "T4 has no MIG profiles in the catalog"),
        ("1(A100-80G-ts)", "no A100-80G card is declared time-sliced"),
        ("0.5(A100-80G-1g.10gb)", "a MIG instance cannot be split further"),
        ("1(A100-80G-1g.10gb,5G)", "a MIG instance cannot be split further"),
        ("1(A100-80G-1g.10gb,vgpu)", "a MIG instance cannot be split further"),
        ("1(Z999-1g.10gb)", "unknown GPU model 'Z999-1g.10gb'"),
        ("1(A100-80G-1g.10gb", "expected '\\)' to close"),
    ],
)
def test_bad_mig_requests_say_what_was_expected(text, message):
    with pytest.raises(GPUSpecError, match=message):
        parse(text)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("2(A100-ts)", "a count of 1 for a time-sliced replica"),
        ("0.5(A100-ts)", "cannot be split further"),
        ("1(A100-80G-ts8)", "declared: A100-80G-ts2, A100-80G-ts4"),
    ],
)
def test_bad_time_slice_requests_say_what_was_expected(text, message):
    with pytest.raises(GPUSpecError, match=message):
        parse(text, WITH_TS)


def test_any_gpu_and_vendor_neutral_requests_are_never_worth_a_unit():
    # "1" is one card of the cheapest model, not a 1g.10gb instance worth 0.143.
    assert equivalents(parse("1"), CATALOG) == min(e.exchange_rate for e in CATALOG if not e.partition)
    assert equivalents(parse("1", WITH_TS), WITH_TS) == equivalents(parse("1"), CATALOG)


# --- catalog ---------------------------------------------------------------------------------


def test_mig_rows_are_worth_the_larger_of_their_compute_and_memory_share_of_the_card():
    rates = {e["name"]: e["exchange_rate"] for e in MIG_CATALOG}
    assert rates["A100-80G-1g.10gb"] == 0.143  # 1/7 of the compute
    assert rates["A100-80G-1g.20gb"] == 0.25  # a quarter of the memory
    assert rates["A100-80G-3g.40gb"] == 0.5
    assert rates["A100-80G-7g.80gb"] == 1.0
    assert rates["H100-1g.10gb"] == round(3.17 / 7, 3)
    assert rates["A800-80G-7g.80gb"] == 0.7
    cards = {c["name"] for c in GPU_CATALOG}
    assert {e["parent"] for e in MIG_CATALOG} == cards & set(MIG_PROFILES)
    for entry in MIG_CATALOG:
        profile = entry["mig_profile"]
        assert entry["resource_name"] == f"nvidia.com/mig-{profile}" and entry["slurm_gres_type"] == profile


def test_the_migration_seeds_a_row_per_mig_profile_under_its_card(db):
    rows = GPUModel.objects.filter(partition="mig").select_related("parent_model")
    assert rows.count() == len(MIG_CATALOG)
    row = rows.get(name="A100-80G-2g.20gb")
    assert (row.parent_model.name, row.exchange_rate, row.resource_name) == (
        "A100-80G",
        D("0.286"),
        "nvidia.com/mig-2g.20gb",
    )
    assert row.as_catalog_entry()["partition"] == "mig" and row.as_catalog_entry()["parent"] == "A100-80G"


# --- node agent ------------------------------------------------------------------------------


class FakeMigNVML(FakeNVML):
    """FakeNVML whose cards listed in ``mig`` are in MIG mode with those profiles (GPU instance ids 1, 2 ...).

    MIG device handles are ("mig", card, position); like real NVML, a card in MIG mode has no utilisation.
    """

    NVML_DEVICE_MIG_ENABLE = pynvml.NVML_DEVICE_MIG_ENABLE

    def __init__(self, gpus, mig):
        super().__init__(gpus)
        self.mig = mig

    def nvmlDeviceGetMigMode(self, h):
        if h == 3:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)  # a card without MIG
        return [1, 1] if h in self.mig else [0, 0]

    def nvmlDeviceGetMaxMigDeviceCount(self, h):
        return 7

    def nvmlDeviceGetMigDeviceHandleByIndex(self, h, j):
        if j >= len(self.mig[h]):
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_FOUND)
        return ("mig", h, j)

    def nvmlDeviceGetName(self, h):
        if isinstance(h, tuple):
            return f"{self.gpus[h[1]]['name']} MIG {self.mig[h[1]][h[2]]}".encode()
        return super().nvmlDeviceGetName(h)

    def nvmlDeviceGetUUID(self, h):
        return f"MIG-{h[1]}-{h[2]}" if isinstance(h, tuple) else super().nvmlDeviceGetUUID(h)

    def nvmlDeviceGetGpuInstanceId(self, h):
        return h[2] + 1

    def nvmlDeviceGetUtilizationRates(self, h):
        if h in self.mig:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return SimpleNamespace(gpu=self.gpus[h].get("util", 0), memory=0)


def test_the_nvml_detector_reports_mig_mode_and_instances():
    collector = Collector(FakeMigNVML(GPUS, {1: ["3g.40gb", "1g.10gb"]}), node_name="gpu-m")
    assert collector.start()
    devices = collector.collect().devices
    assert [d.mig_mode for d in devices] == [False, True, False, False]
    assert devices[1].mig == [
        {"profile": "3g.40gb", "uuid": "MIG-1-0", "gpu_instance_id": 1},
        {"profile": "1g.10gb", "uuid": "MIG-1-1", "gpu_instance_id": 2},
    ]
    assert devices[1].utilization == 0 and devices[0].utilization == 55


def _post(client, secret, collector):
    return client.post(
        "/api/v1/agent/report/", collector.collect().as_dict(), format="json", HTTP_AUTHORIZATION=f"Agent {secret}"
    )


def test_the_agent_report_keeps_the_cards_mig_layout_in_step(world):
    secret = issue_agent_token(world.cluster, "gpu-m")
    client = APIClient()
    collector = Collector(FakeMigNVML(GPUS[:2], {0: ["3g.40gb", "1g.10gb", "1g.10gb"]}), node_name="gpu-m")
    collector.start()
    response = _post(client, secret, collector)
    assert response.status_code == 202, response.content
    assert response.json()["devices"] == 2  # cards, not their instances
    card = Device.objects.get(node__name="gpu-m", index=0, parent=None)
    assert card.sharing == Sharing.MIG
    units = list(card.units.order_by("slot").values_list("slot", "uuid", "gpu_model__name"))
    assert units == [
        (1, "MIG-0-0", "A100-80G-3g.40gb"),
        (2, "MIG-0-1", "A100-80G-1g.10gb"),
        (3, "MIG-0-2", "A100-80G-1g.10gb"),
    ]
    # The same layout again changes nothing, and takes no VDC lock (a scheduling cycle would skip the VDC);
    # MIG mode turned off gives the whole card back.
    ids = set(card.units.values_list("pk", flat=True))
    with CaptureQueriesContext(connection) as queries:
        assert _post(client, secret, collector).status_code == 202
    assert not [q["sql"] for q in queries if "vdc_vdc" in q["sql"] and "FOR UPDATE" in q["sql"]]
    assert set(card.units.values_list("pk", flat=True)) == ids
    collector.nvml.mig = {}
    assert _post(client, secret, collector).status_code == 202
    card.refresh_from_db()
    assert card.sharing == Sharing.WHOLE and not card.units.exists()


def test_an_agent_report_with_a_bad_mig_layout_is_a_note_or_a_400_and_changes_nothing(world):
    secret = issue_agent_token(world.cluster, "gpu-x")
    client = APIClient()
    collector = Collector(FakeMigNVML(GPUS[:1], {0: ["4g.40gb", "4g.40gb"]}), node_name="gpu-x")
    collector.start()
    response = _post(client, secret, collector)
    assert response.status_code == 202
    assert "the reported MIG layout is not applied" in response.json()["message"]
    assert Device.objects.get(node__name="gpu-x", parent=None).sharing == Sharing.WHOLE
    body = collector.collect().as_dict()
    body["devices"][0]["mig"] = [{"profile": "lots", "uuid": "x"}]
    bad = client.post("/api/v1/agent/report/", body, format="json", HTTP_AUTHORIZATION=f"Agent {secret}")
    assert bad.status_code == 400 and "profile" in str(bad.json())


def test_time_sliced_replicas_show_their_cards_figures_after_each_report(world):
    from apps.clusters.partitions import set_device_sharing

    secret = issue_agent_token(world.cluster, "gpu-t")
    client = APIClient()
    collector = Collector(FakeMigNVML(GPUS[:1], {}), node_name="gpu-t")
    collector.start()
    assert _post(client, secret, collector).status_code == 202
    card = Device.objects.get(node__name="gpu-t", parent=None)
    set_device_sharing(card, Sharing.TIME_SLICING, replicas=2)
    assert _post(client, secret, collector).status_code == 202
    assert list(card.units.values_list("utilization", "vram_used_gib")) == [(55, D(10)), (55, D(10))]
    card.refresh_from_db()
    assert card.sharing == Sharing.TIME_SLICING  # NVML cannot see time-slicing: the declaration stays


def test_a_mig_job_on_a_local_cluster_needs_the_instance_uuid():
    from apps.clusters.executors.base import DeviceSlot, ExecutorError, GPUModelSpec, JobSpec
    from apps.clusters.executors.local import _visible_id

    model = GPUModelSpec(
        "A100-80G-1g.10gb", "nvidia", "nvidia.com/mig-1g.10gb", "NVIDIA_VISIBLE_DEVICES", partition="mig"
    )
    spec = JobSpec(task_id=1, attempt=1, name="j", project="p", owner="o", kind="training", gpu_model=model)
    assert _visible_id(spec, DeviceSlot(index=2, uuid="MIG-1234")) == "MIG-1234"
    with pytest.raises(ExecutorError, match="MIG instance on card 2 has no uuid: run the node agent"):
        _visible_id(spec, DeviceSlot(index=2))
