"""AMD GPUs (``amd-smi``, else ``rocm-smi``) and Hygon DCUs (``hy-smi``), all through their JSON output.

amd-smi (ROCm 6+) prints a list of per-GPU objects whose figures are either plain numbers or
``{"value": ..., "unit": ...}``; newer releases wrap the list in ``{"gpu_data": [...]}``. rocm-smi and
Hygon's hy-smi (a rocm-smi derivative that says DCU where rocm-smi says GPU) print
``{"card0": {"<label> (<unit>)": "<value>", ...}, "system": {...}}``; hy-smi may print banner lines
around the JSON, which :func:`load_json` tolerates.
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
    load_json,
    normalise_bus_id,
    number,
    read_version_file,
    run_tool,
    to_gib,
    which,
)

log = logging.getLogger(__name__)


def _gpu_list(data, tool: str) -> list[dict]:
    if isinstance(data, dict):
        data = data.get("gpu_data", data.get("gpus", [data]))
    if not isinstance(data, list) or not all(isinstance(item, dict) for item in data):
        raise DetectorError(f"{tool} printed JSON of an unexpected shape (expected a list of GPUs)")
    return data


def _get(obj, *path, default=None):
    for key in path:
        if not isinstance(obj, dict) or key not in obj:
            return default
        obj = obj[key]
    return obj


def _valid(value) -> bool:
    return number(value) is not None


def rocm_version(*homes: str) -> str:
    """The ROCm (or Hygon DTK) release, from ``<home>/.info/version``."""
    return read_version_file(*(os.path.join(home, ".info", "version") for home in homes if home))


def parse_amd_smi(static, metric, listing=None, topology=None) -> list[DeviceReport]:
    """Devices from ``amd-smi static/metric/list/topology --json`` (list and topology may be None)."""
    static_by = {int(g.get("gpu", i)): g for i, g in enumerate(_gpu_list(static, "amd-smi static"))}
    metric_by = {int(g.get("gpu", i)): g for i, g in enumerate(_gpu_list(metric, "amd-smi metric"))}
    uuid_by = {int(g.get("gpu", i)): str(g.get("uuid", "")) for i, g in enumerate(_gpu_list(listing or [], "list"))}
    links_by: dict[int, list[dict]] = {}
    for i, entry in enumerate(_gpu_list(topology or [], "amd-smi topology")):
        gpu = int(entry.get("gpu", i))
        for link in entry.get("links") or []:
            if not isinstance(link, dict) or link.get("gpu") in (None, gpu):
                continue
            if str(link.get("link_type", "")).upper() == "XGMI" and str(link.get("link_status", "ENABLED")).upper() in (
                "ENABLED",
                "UP",
                "TRUE",
            ):
                links_by.setdefault(gpu, []).append({"peer": int(link["gpu"]), "type": "xgmi"})
    devices = []
    for gpu in sorted(static_by):
        s, m = static_by[gpu], metric_by.get(gpu, {})
        total = _get(m, "mem_usage", "total_vram")
        if not _valid(total):
            total = _get(s, "vram", "size")
        temps = _get(m, "temperature", default={}) or {}
        temperature = next(
            (number(temps.get(k)) for k in ("edge", "hotspot", "junction") if _valid(temps.get(k))), None
        )
        ecc = _get(m, "ecc", default={}) or {}
        status = "warning" if _get(m, "throttle", "status") in ("THROTTLED",) else ""
        device = DeviceReport(
            index=gpu,
            uuid=uuid_by.get(gpu, ""),
            name=str(_get(s, "asic", "market_name", default="") or _get(s, "board", "product_name", default="")),
            vram_total_gib=to_gib(total, "mb"),
            vram_used_gib=to_gib(_get(m, "mem_usage", "used_vram", default=0), "mb"),
            utilization=max(0, min(100, int(number(_get(m, "usage", "gfx_activity"), 0)))),
            temperature_c=int(temperature) if temperature is not None else None,
            ecc_uncorrected=int(number(ecc.get("total_uncorrectable_count"), 0)),
            ecc_corrected=int(number(ecc.get("total_correctable_count"), 0)),
            xid_errors=0,
            pci_bus_id=normalise_bus_id(str(_get(s, "bus", "bdf", default="") or "")),
            numa_node=number(_get(s, "numa", "node")),
            links=links_by.get(gpu, []),
            vendor="amd",
            driver_version=str(_get(s, "driver", "version", default="") or ""),
            health_status=status,
        )
        devices.append(device)
    return devices


def _field(card: dict, *patterns: str):
    """The first value whose key (case-insensitive) matches one of the regular expressions."""
    for pattern in patterns:
        rx = re.compile(pattern, re.IGNORECASE)
        for key, value in card.items():
            if rx.fullmatch(key.strip()):
                return value
    return None


def parse_rocm_smi(data, vendor: str) -> tuple[list[DeviceReport], str]:
    """(devices, driver version) from rocm-smi or hy-smi ``--json`` output."""
    if not isinstance(data, dict):
        raise DetectorError("expected an object of cards (card0, card1, ...)")
    system = next((v for k, v in data.items() if k.lower() == "system" and isinstance(v, dict)), {})
    driver = str(_field(system, r"driver version") or "")
    cards = sorted(
        (int(k[4:]), v) for k, v in data.items() if re.fullmatch(r"card\d+", k, re.IGNORECASE) and isinstance(v, dict)
    )
    devices = []
    for index, card in cards:
        name = _field(card, r"card series", r"card name", r"product name", r"card model") or ""
        temperature = _field(
            card,
            r"temperature \(sensor edge\) \(c\)",
            r"temperature \(sensor junction\) \(c\)",
            r"temperature \(sensor core\) \(c\)",
            r"temperature.*\(c\)",
        )
        uncorrected = corrected = 0
        for key, value in card.items():
            lowered = key.lower()
            if "uncorrectable" in lowered or "uncorrected" in lowered:
                uncorrected += int(number(value, 0))
            elif "correctable" in lowered or "corrected" in lowered:
                corrected += int(number(value, 0))
        device = DeviceReport(
            index=index,
            uuid=str(_field(card, r"unique id", r"uuid") or ""),
            name=str(name).strip(),
            vram_total_gib=to_gib(_field(card, r"vram total memory \(b\)") or 0),
            vram_used_gib=to_gib(_field(card, r"vram total used memory \(b\)") or 0),
            utilization=max(0, min(100, int(number(_field(card, r"(gpu|dcu|hcu) use \(%\)"), 0)))),
            temperature_c=int(number(temperature)) if _valid(temperature) else None,
            ecc_uncorrected=uncorrected,
            ecc_corrected=corrected,
            xid_errors=0,
            pci_bus_id=normalise_bus_id(str(_field(card, r"pci bus") or "")),
            numa_node=number(_field(card, r"\(topology\) numa node", r"numa node")),
            vendor=vendor,
            driver_version=driver,
        )
        devices.append(device)
    return devices, driver


ROCM_SMI_ARGS = [
    "--showproductname",
    "--showmeminfo",
    "vram",
    "--showuse",
    "--showtemp",
    "--showbus",
    "--showuniqueid",
    "--showdriverversion",
    "--json",
]


class AmdDetector(Detector):
    """AMD Instinct/Radeon GPUs: amd-smi when installed, else rocm-smi (older ROCm)."""

    name = "amd"
    vendor = "amd"
    tools = ("amd-smi", "rocm-smi")

    def present(self) -> bool:
        # Hygon's DTK ships rocm-smi too; on a Hygon host hy-smi is the right tool.
        return not which("hy-smi") and super().present()

    def read(self) -> tuple[list[DeviceReport], str, str]:
        runtime = ""
        if which("amd-smi"):
            static = load_json(run_tool(["amd-smi", "static", "--json"]), "amd-smi static")
            metric = load_json(run_tool(["amd-smi", "metric", "--json"]), "amd-smi metric")
            listing = self._optional(["amd-smi", "list", "--json"])
            topology = self._optional(["amd-smi", "topology", "--json"])
            devices = parse_amd_smi(static, metric, listing, topology)
            version = self._optional(["amd-smi", "version", "--json"])
            version = version[0] if isinstance(version, list) and version else version
            runtime = str(_get(version, "rocm_version", default="") or "") if isinstance(version, dict) else ""
        else:
            data = load_json(run_tool(["rocm-smi", *ROCM_SMI_ARGS]), "rocm-smi")
            devices, _ = parse_rocm_smi(data, self.vendor)
        runtime = runtime or rocm_version(os.environ.get("ROCM_PATH", ""), "/opt/rocm")
        driver = next((d.driver_version for d in devices if d.driver_version), "")
        for d in devices:
            d.runtime_version = runtime
            fold_health(d)
        return devices, driver, runtime

    def _optional(self, argv: list[str]):
        try:
            return load_json(run_tool(argv), " ".join(argv[:2]))
        except DetectorError as exc:
            log.info("%s", exc)
            return None


class HygonDetector(Detector):
    """Hygon DCUs through hy-smi's JSON output; the runtime is the DTK release."""

    name = "hygon"
    vendor = "hygon"
    tools = ("hy-smi",)

    def read(self) -> tuple[list[DeviceReport], str, str]:
        data = load_json(run_tool(["hy-smi", *ROCM_SMI_ARGS]), "hy-smi")
        try:
            devices, driver = parse_rocm_smi(data, self.vendor)
        except DetectorError as exc:
            raise DetectorError(f"hy-smi: {exc}") from None
        if not devices:
            raise DetectorError("hy-smi listed no DCU (expected card0, card1, ... in its JSON)")
        runtime = rocm_version(os.environ.get("ROCM_PATH", ""), "/opt/dtk")
        for d in devices:
            d.runtime_version = runtime
            fold_health(d)
        return devices, driver, runtime
