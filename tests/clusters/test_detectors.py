"""Vendor detectors against recorded tool output, run as real executables on PATH (see fake_tools.py).

The NVML detector is tested with a fake NVML module in test_node_agent.py and against the real library
in ``test_real_nvml_reads_this_host``.
"""

from __future__ import annotations

import pytest
from django.core.management import CommandError, call_command

from apps.clusters.detectors import NodeCollector, base, detectors_for
from apps.clusters.detectors.ascend import AscendDetector, parse_ecc, parse_info, parse_topo
from apps.clusters.detectors.cambricon import CambriconDetector
from apps.clusters.detectors.rocm import AmdDetector, HygonDetector
from tests.clusters import fake_tools
from tests.clusters.fake_tools import AMD_SMI, CNMON, FIXTURES, HY_SMI, NPU_SMI, ROCM_SMI


@pytest.fixture
def tools(tmp_path, monkeypatch):
    """A PATH holding only the fake tools a test installs: ``tools("npu-smi", NPU_SMI)``."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    monkeypatch.setenv("PATH", str(bin_dir))
    monkeypatch.setenv("ROCM_PATH", str(tmp_path / "rocm"))
    monkeypatch.setenv("ASCEND_TOOLKIT_HOME", str(tmp_path / "ascend"))

    def install(name: str, answers: dict) -> None:
        fake_tools.install(bin_dir, name, answers)

    install.root = tmp_path
    return install


def _collect(*detectors):
    collector = NodeCollector(list(detectors), node_name="host-1")
    collector.start()
    return collector.collect()


def test_ascend_npu_smi_table_ecc_and_hccs_topology(tools):
    tools("npu-smi", NPU_SMI)
    (tools.root / "ascend").mkdir()
    info = tools.root / "ascend" / "ascend_toolkit_install.info"
    info.write_text("package_name=Ascend-cann-toolkit\nversion=7.0.0\n")
    report = _collect(AscendDetector())
    assert report.message == "" and report.detectors == ["ascend"]
    assert (report.driver, report.runtime) == ("23.0.rc3", "7.0.0")
    d0, d1, d2, d3 = report.devices
    assert (d0.name, d0.vendor, d0.vram_total_gib, d0.vram_used_gib, d0.utilization, d0.temperature_c) == (
        "Ascend 910B3",
        "huawei",
        64.0,
        3.09,
        37,
        40,
    )
    assert d0.pci_bus_id == "0000:C1:00.0" and d0.health_score == 100 and d0.health_status == "ok"
    assert d0.links == [{"peer": 1, "type": "hccs"}, {"peer": 2, "type": "hccs"}] and d3.links == []
    # NPU 1: two double-bit (uncorrectable) HBM errors; the aggregate lifetime counter is not added again.
    assert (d1.ecc_uncorrected, d1.ecc_corrected, d1.health_score) == (2, 5, 40)
    assert "2 uncorrected ECC error(s)" in d1.health_reasons
    # NPU 2: the tool says Warning and it runs at 88 °C.
    assert d2.health_status == "warning" and d2.health_score == 60 and len(d2.health_reasons) == 2
    assert (d3.name, d3.vram_total_gib) == ("Ascend 910B4", 32.0)
    assert all(d.driver_version == "23.0.rc3" and d.runtime_version == "7.0.0" for d in report.devices)


def test_ascend_parsers_ignore_the_process_table_and_legend():
    text = (FIXTURES / "npu-smi-info.txt").read_text()
    driver, chips = parse_info(text)
    assert driver == "23.0.rc3" and [c["npu"] for c in chips] == [0, 1, 2, 3]
    assert parse_topo((FIXTURES / "npu-smi-topo.txt").read_text())[3] == []
    assert parse_ecc("HBM Double Bit Error Count : 3\nDDR Single Bit Error Count : 4\n") == (3, 4)


def test_amd_smi_json_static_metric_list_topology_version(tools):
    tools("amd-smi", AMD_SMI)
    report = _collect(AmdDetector())
    assert report.message == "" and (report.driver, report.runtime) == ("6.7.0", "6.2.1")
    d0, d1 = report.devices
    assert (d0.name, d0.vendor, d0.vram_total_gib, d0.vram_used_gib, d0.utilization, d0.temperature_c) == (
        "AMD Instinct MI300X",
        "amd",
        191.98,
        147.5,
        87,
        71,
    )
    assert d0.uuid == "a4ff74a1-0000-1000-80f1-c6a0b7942a8e" and d0.pci_bus_id == "0000:0C:00.0"
    assert d0.numa_node == 0 and d0.links == [{"peer": 1, "type": "xgmi"}]
    assert (d0.ecc_corrected, d0.health_score) == (3, 100)
    assert (d1.ecc_uncorrected, d1.health_score) == (4, 40)


def test_amd_falls_back_to_rocm_smi_json_without_amd_smi(tools):
    tools("rocm-smi", ROCM_SMI)
    (tools.root / "rocm" / ".info").mkdir(parents=True)
    (tools.root / "rocm" / ".info" / "version").write_text("6.0.2-115\n")
    report = _collect(AmdDetector())
    assert report.message == "" and (report.driver, report.runtime) == ("6.3.6", "6.0.2-115")
    d0, d1 = report.devices
    assert (d0.name, d0.vram_total_gib, d0.vram_used_gib, d0.utilization, d0.temperature_c) == (
        "AMD Instinct MI250X",
        128.0,
        10.0,
        12,
        36,
    )
    assert d0.uuid == "0x1b3f2ab7e4c9d5a1" and d0.pci_bus_id == "0000:C1:00.0" and d1.vram_total_gib == 63.98


def test_hygon_hy_smi_json_between_banner_lines(tools):
    tools("hy-smi", HY_SMI)
    tools("rocm-smi", ROCM_SMI)  # DTK ships rocm-smi too: the AMD detector must stand aside
    names = [d.name for d in detectors_for("auto")]
    assert names == ["hygon"]
    report = _collect(HygonDetector())
    assert report.message == "" and report.driver == "5.16.29"
    d0, d1 = report.devices
    assert (d0.name, d0.vendor, d0.vram_total_gib, d0.vram_used_gib, d0.utilization, d0.temperature_c) == (
        "Z100L",
        "hygon",
        31.98,
        19.2,
        63,
        45,
    )
    assert d1.name == "Z100" and d1.pci_bus_id == "0000:3E:00.0"


def test_cambricon_cnmon_sections_by_indentation(tools):
    tools("cnmon", CNMON)
    report = _collect(CambriconDetector())
    assert report.message == "" and report.driver == "4.20.18"
    d0, d1 = report.devices
    assert (d0.name, d0.vendor, d0.vram_total_gib, d0.vram_used_gib, d0.utilization, d0.temperature_c) == (
        "MLU370-X8",
        "cambricon",
        48.0,
        1.17,
        42,
        34,
    )
    assert d0.uuid == "MLU-20005012-1916-0000-0000-000000000000" and d0.pci_bus_id == "0000:1A:00.0"
    assert d0.health_status == "ok" and d0.health_score == 100
    # Card 1: Warning, one uncorrected and seven corrected ECC errors.
    assert (d1.health_status, d1.ecc_uncorrected, d1.ecc_corrected, d1.health_score) == ("warning", 1, 7, 20)


def test_auto_detection_runs_every_vendor_present_and_numbers_devices_once(tools):
    tools("npu-smi", NPU_SMI)
    tools("cnmon", CNMON)
    detectors = detectors_for("auto")
    assert [d.name for d in detectors] == ["ascend", "cambricon"]
    report = _collect(*detectors)
    assert report.detectors == ["ascend", "cambricon"]
    assert [d.index for d in report.devices] == [0, 1, 2, 3, 4, 5]
    assert [d.vendor for d in report.devices[3:]] == ["huawei", "cambricon", "cambricon"]
    assert report.devices[0].links[0]["peer"] == 1
    assert report.driver == "23.0.rc3, 4.20.18"


def test_no_tool_at_all_reports_no_devices_and_says_why(tools):
    assert detectors_for("auto") == []
    report = _collect()
    assert report.devices == [] and "no accelerator library or tool found" in report.message


@pytest.mark.parametrize(
    ("answers", "expected"),
    [
        (
            {"*": {"exit": 9, "stderr": "dcmi module initialize failed. ret is -8005"}},
            "npu-smi info exited with 9: dcmi module initialize failed",
        ),
        ({"*": {"sleep": 5}}, "npu-smi info did not answer within 0.3 s"),
        ({"*": {"text": "+----+\n| nothing here |\n"}}, "npu-smi info listed no NPU"),
    ],
    ids=["tool-fails", "tool-hangs", "tool-prints-no-table"],
)
def test_a_failing_tool_gives_a_clear_error_in_the_report_never_a_crash(tools, monkeypatch, answers, expected):
    monkeypatch.setattr(base, "TOOL_TIMEOUT_S", 0.3)
    tools("npu-smi", answers)
    report = _collect(AscendDetector())
    assert report.devices == []
    assert report.message.startswith("ascend: ") and expected in report.message


def test_json_tools_printing_garbage_are_named_in_the_report(tools):
    tools("amd-smi", {"*": {"text": "Segmentation fault (core dumped)\n"}})
    tools("cnmon", CNMON)
    report = _collect(AmdDetector(), CambriconDetector())
    assert "amd: amd-smi static printed no JSON" in report.message
    assert [d.vendor for d in report.devices] == ["cambricon", "cambricon"]  # the other vendor still reports


def test_tool_output_of_an_unexpected_shape_is_an_error_in_the_report_not_a_crash(tools):
    tools("amd-smi", {"static --json": {"text": '["MI300X"]'}, "metric --json": {"text": "[]"}})
    assert "amd: amd-smi static printed JSON of an unexpected shape" in _collect(AmdDetector()).message
    tools("amd-smi", {"static --json": {"text": '[{"gpu": "first"}]'}, "metric --json": {"text": "[]"}})
    report = _collect(AmdDetector())
    assert report.devices == [] and "amd: could not read its tool's output (ValueError" in report.message


def test_a_forced_detector_whose_tool_is_missing_says_so(tools):
    report = _collect(*detectors_for("amd"))
    assert report.devices == [] and "rocm-smi is not on PATH" in report.message
    with pytest.raises(ValueError, match="Expected a detector of auto, nvml, ascend"):
        detectors_for("tpu")


def test_node_agent_command_forces_a_detector_and_posts_its_report(tools, monkeypatch):
    tools("cnmon", CNMON)
    tools("npu-smi", NPU_SMI)
    posted = []

    class Answer:
        status_code = 202

        @staticmethod
        def json():
            return {"node": 1, "devices": 2, "message": ""}

    monkeypatch.setattr(
        "apps.clusters.management.commands.node_agent.requests.post",
        lambda url, json, timeout, headers: posted.append((url, json, headers)) or Answer(),
    )
    call_command("node_agent", "--token", "s3cret", "--once", "--detector", "cambricon", "--node", "mlu-1")
    url, body, headers = posted[0]
    assert url == "http://127.0.0.1:8000/api/v1/agent/report/" and headers == {"Authorization": "Agent s3cret"}
    assert body["node"] == "mlu-1" and body["detectors"] == ["cambricon"] and len(body["devices"]) == 2
    with pytest.raises(CommandError, match="invalid choice: 'tpu'"):
        call_command("node_agent", "--token", "x", "--once", "--detector", "tpu")
