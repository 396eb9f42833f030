"""Huawei Ascend NPUs through ``npu-smi`` (the driver's management tool).

npu-smi has no JSON output, so its documented text is parsed by structure, not column offsets:
``npu-smi info`` is a table of ``|``-separated cells where each NPU is a block (between ``+===`` rules)
of one NPU row (id, name, health, power, temperature) and one row per chip (chip id, bus id, AI core %,
memory used / total); ``npu-smi info -t ecc -i N -c C`` prints ``key : value`` lines; ``npu-smi info -t topo``
prints a peer matrix (HCCS = Huawei Cache Coherence System link). The DSMI C library gives the same figures,
but reading it needs the driver's struct layouts per release; the tool is what Huawei documents as stable.
"""

from __future__ import annotations

import logging
import os
import re

from apps.clusters.detectors.base import (
    Detector,
    DetectorError,
    DeviceReport,
    fold_health,
    normalise_bus_id,
    number,
    read_version_file,
    run_tool,
)

log = logging.getLogger(__name__)

HEALTH = {"ok": "ok", "warning": "warning", "alarm": "critical", "critical": "critical"}
_BUS = re.compile(r"[0-9A-Fa-f]{4}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.[0-9A-Fa-f]")
_PAIR = re.compile(r"(\d+)\s*/\s*(\d+)")


def cann_version() -> str:
    """The CANN toolkit version (the Ascend runtime), from the toolkit's install info."""
    home = os.environ.get("ASCEND_TOOLKIT_HOME", "/usr/local/Ascend/ascend-toolkit/latest")
    arch = os.uname().machine
    return read_version_file(
        os.path.join(home, f"{arch}-linux", "ascend_toolkit_install.info"),
        os.path.join(home, "ascend_toolkit_install.info"),
        os.path.join(home, "version.cfg"),
    )


def _cells(line: str) -> list[str]:
    return [cell.strip() for cell in line.strip().strip("|").split("|")]


def parse_info(text: str) -> tuple[str, list[dict]]:
    """(driver version, chips) from ``npu-smi info``; each chip a dict of the table's figures."""
    version = re.search(r"Version:\s*([\w.\-]+)", text)
    driver = version.group(1) if version else ""
    hbm = "HBM-Usage" in text  # 910-class cards show HBM; 310-class show only Memory-Usage
    chips: list[dict] = []
    block: list[list[str]] = []
    started = False

    def flush() -> None:
        if len(block) < 2:
            return
        head = block[0]
        npu_name = head[0].split(None, 1)
        if len(npu_name) != 2 or not npu_name[0].isdigit():
            return
        npu, name = int(npu_name[0]), npu_name[1]
        figures = head[2].split() if len(head) > 2 else []
        for row in block[1:]:
            if len(row) < 3:
                continue
            bus = _BUS.search(row[1])
            chip_id = row[0].split()[0] if row[0].split() else ""
            if not chip_id.isdigit():
                continue
            pairs = _PAIR.findall(row[2])
            used, total = pairs[-1] if hbm and pairs else pairs[0] if pairs else ("0", "0")
            chips.append(
                {
                    "npu": npu,
                    "chip": int(chip_id),
                    "name": name,
                    "health": HEALTH.get(head[1].lower(), "") if len(head) > 1 else "",
                    "temperature": number(figures[1]) if len(figures) > 1 else None,
                    "aicore": number(row[2].split()[0] if row[2].split() else None, 0),
                    "used_mib": int(used),
                    "total_mib": int(total),
                    "bus": normalise_bus_id(bus.group()) if bus else "",
                }
            )

    for line in text.splitlines():
        stripped = line.strip()
        if "Process id" in stripped or "Process name" in stripped:
            flush()
            break  # the processes table follows the devices
        if stripped.startswith("+"):
            if "=" in stripped:
                started = True
            flush()
            block = []
            continue
        if started and stripped.startswith("|"):
            block.append(_cells(stripped))
    else:
        flush()
    return driver, chips


def parse_ecc(text: str) -> tuple[int, int]:
    """(uncorrected, corrected) from ``npu-smi info -t ecc``: double-bit errors are uncorrectable."""
    uncorrected = corrected = 0
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if not sep:
            continue
        key = key.strip().lower()
        if "aggregate" in key or "isolated" in key:
            continue  # lifetime totals and page isolation counts repeat the current counters
        if "double bit error count" in key:
            uncorrected += number(value, 0)
        elif "single bit error count" in key:
            corrected += number(value, 0)
    return int(uncorrected), int(corrected)


def parse_topo(text: str) -> dict[int, list[int]]:
    """NPU id -> NPU ids it reaches over HCCS, from ``npu-smi info -t topo``."""
    header: list[int] | None = None
    peers: dict[int, list[int]] = {}
    for line in text.splitlines():
        words = line.split()
        if not words:
            continue
        if words[0].lower().startswith("legend"):
            break
        ids = [int(w[3:]) for w in words if re.fullmatch(r"NPU\d+", w)]
        if header is None and len(ids) >= 1 and re.fullmatch(r"NPU\d+", words[0]):
            header = ids
            continue
        if header is not None and re.fullmatch(r"NPU\d+", words[0]):
            me = int(words[0][3:])
            relations = words[1 : 1 + len(header)]
            peers[me] = [header[i] for i, rel in enumerate(relations) if rel.upper() == "HCCS" and header[i] != me]
    return peers


class AscendDetector(Detector):
    """Huawei Ascend NPUs, one device per chip, from npu-smi."""

    name = "ascend"
    vendor = "huawei"
    tools = ("npu-smi",)

    def read(self) -> tuple[list[DeviceReport], str, str]:
        driver, chips = parse_info(run_tool(["npu-smi", "info"]))
        if not chips:
            raise DetectorError("npu-smi info listed no NPU (expected its device table)")
        runtime = cann_version()
        try:
            topo = parse_topo(run_tool(["npu-smi", "info", "-t", "topo"]))
        except DetectorError as exc:
            log.info("no HCCS topology: %s", exc)
            topo = {}
        first_chip = {}
        for index, chip in enumerate(chips):
            first_chip.setdefault(chip["npu"], index)
        devices = []
        for index, chip in enumerate(chips):
            try:
                uncorrected, corrected = parse_ecc(
                    run_tool(["npu-smi", "info", "-t", "ecc", "-i", str(chip["npu"]), "-c", str(chip["chip"])])
                )
            except DetectorError as exc:
                log.info("no ECC counters for NPU %s chip %s: %s", chip["npu"], chip["chip"], exc)
                uncorrected = corrected = 0
            links = [
                {"peer": first_chip[peer], "type": "hccs"}
                for peer in topo.get(chip["npu"], [])
                if peer in first_chip and first_chip[peer] != index
            ]
            device = DeviceReport(
                index=index,
                uuid="",
                name=f"Ascend {chip['name']}",
                vram_total_gib=round(chip["total_mib"] / 1024, 2),
                vram_used_gib=round(chip["used_mib"] / 1024, 2),
                utilization=max(0, min(100, int(chip["aicore"]))),
                temperature_c=int(chip["temperature"]) if chip["temperature"] is not None else None,
                ecc_uncorrected=uncorrected,
                ecc_corrected=corrected,
                xid_errors=0,
                pci_bus_id=chip["bus"],
                numa_node=None,
                links=links,
                vendor=self.vendor,
                driver_version=driver,
                runtime_version=runtime,
                health_status=chip["health"],
            )
            devices.append(fold_health(device))
        return devices, driver, runtime
