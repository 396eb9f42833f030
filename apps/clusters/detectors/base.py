"""What every detector reports, the health folding they share, and running a vendor tool safely.

Pure Python, no Django: the node agent runs on GPU hosts that need only this package and ``requests``.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from dataclasses import asdict, dataclass, field

# Health penalties, folded into a 0-100 score (100 = healthy). Uncorrected ECC errors and critical
# XIDs mean data or the context was lost: the device should not take new work.
PENALTY_UNCORRECTED_ECC = 60
PENALTY_CORRECTED_ECC = 10  # more than CORRECTED_ECC_TOLERATED since the driver loaded
CORRECTED_ECC_TOLERATED = 100
PENALTY_RETIRED_PAGES_PENDING = 20
PENALTY_PER_XID = 40
PENALTY_HOT = 20
HOT_CELSIUS = 85
# A vendor tool's own verdict (npu-smi "Warning", "Alarm", "Critical"; amd-smi/cnmon error states).
PENALTY_STATUS = {"ok": 0, "warning": 20, "critical": 60}

TOOL_TIMEOUT_S = 10.0
MAX_TOOL_OUTPUT = 4_000_000  # bytes; a runaway tool must not exhaust the agent


@dataclass
class DeviceReport:
    """One accelerator as its vendor's library or tool sees it; the same fields for every vendor."""

    index: int
    uuid: str
    name: str
    vram_total_gib: float
    vram_used_gib: float
    utilization: int
    temperature_c: int | None
    ecc_uncorrected: int
    ecc_corrected: int
    xid_errors: int
    pci_bus_id: str
    numa_node: int | None
    links: list[dict] = field(default_factory=list)
    health_score: int = 100
    vendor: str = ""
    driver_version: str = ""
    runtime_version: str = ""
    # The tool's own verdict, normalised to ok / warning / critical ("" when the tool gives none).
    health_status: str = ""
    health_reasons: list[str] = field(default_factory=list)
    # Measured by the tool or a probe; None: not measured here (the portal takes the catalog's figure).
    memory_bandwidth_gbps: float | None = None
    # NVIDIA MIG: the card is in MIG mode, with these instances ({"profile", "uuid", "gpu_instance_id"}).
    mig_mode: bool = False
    mig: list[dict] = field(default_factory=list)


@dataclass
class NodeReport:
    """What the agent posts: the host and its devices; ``message`` says why there are none or what failed."""

    node: str
    cpu: int
    memory_gib: float
    driver: str = ""
    devices: list[DeviceReport] = field(default_factory=list)
    message: str = ""
    runtime: str = ""
    detectors: list[str] = field(default_factory=list)

    def as_dict(self) -> dict:
        return asdict(self)


def health_findings(d: DeviceReport, retired_pending: bool = False) -> list[tuple[int, str]]:
    """The penalties a device's own signals earn, each with the reason an admin reads."""
    found = []
    if d.ecc_uncorrected:
        found.append((PENALTY_UNCORRECTED_ECC, f"{d.ecc_uncorrected} uncorrected ECC error(s)"))
    if d.ecc_corrected > CORRECTED_ECC_TOLERATED:
        found.append((PENALTY_CORRECTED_ECC, f"{d.ecc_corrected} corrected ECC errors"))
    if retired_pending:
        found.append((PENALTY_RETIRED_PAGES_PENDING, "retired memory pages pending a reset"))
    if d.xid_errors:
        found.append((PENALTY_PER_XID * d.xid_errors, f"{d.xid_errors} critical XID error(s)"))
    if d.temperature_c is not None and d.temperature_c >= HOT_CELSIUS:
        found.append((PENALTY_HOT, f"{d.temperature_c} °C (hot from {HOT_CELSIUS} °C)"))
    if PENALTY_STATUS.get(d.health_status):
        found.append((PENALTY_STATUS[d.health_status], f"the vendor tool reports health {d.health_status}"))
    return found


def health_score(d: DeviceReport, retired_pending: bool = False) -> int:
    """Fold a device's health signals into 0-100 (100 = healthy)."""
    return max(0, min(100, 100 - sum(p for p, _ in health_findings(d, retired_pending))))


def fold_health(d: DeviceReport, retired_pending: bool = False) -> DeviceReport:
    """Set the device's score and reasons from its signals; returns the device."""
    findings = health_findings(d, retired_pending)
    d.health_score = max(0, min(100, 100 - sum(p for p, _ in findings)))
    d.health_reasons = [reason for _, reason in findings]
    return d


class DetectorError(Exception):
    """A detector could not read its devices; the message says which tool failed and how."""


def which(tool: str) -> str | None:
    """The tool's path on PATH, or None."""
    return shutil.which(tool)


def run_tool(argv: list[str], timeout: float | None = None) -> str:
    """Run a vendor tool and return its standard output; DetectorError on absence, failure or timeout."""
    timeout = timeout or TOOL_TIMEOUT_S
    path = which(argv[0])
    if path is None:
        raise DetectorError(f"{argv[0]} is not on PATH")
    try:
        done = subprocess.run(  # fixed argv, no shell
            [path, *argv[1:]], capture_output=True, timeout=timeout, check=False, env={**os.environ, "LC_ALL": "C"}
        )
    except subprocess.TimeoutExpired:
        raise DetectorError(f"{' '.join(argv)} did not answer within {timeout:g} s") from None
    except OSError as exc:
        raise DetectorError(f"{' '.join(argv)} could not run: {exc}") from None
    out = done.stdout[:MAX_TOOL_OUTPUT].decode(errors="replace")
    if done.returncode != 0:
        err = (done.stderr.decode(errors="replace").strip() or out.strip())[:300]
        raise DetectorError(f"{' '.join(argv)} exited with {done.returncode}: {err or 'no message'}")
    return out


def load_json(text: str, tool: str):
    """Parse a tool's JSON output, tolerating banner lines around it (hy-smi prints some)."""
    try:
        return json.loads(text)
    except ValueError:
        pass
    starts = [i for i in (text.find("{"), text.find("[")) if i >= 0]
    if starts:
        start = min(starts)
        end = max(text.rfind("}"), text.rfind("]"))
        try:
            return json.loads(text[start : end + 1])
        except ValueError:
            pass
    raise DetectorError(f"{tool} printed no JSON (expected its --json output); it began: {text[:120]!r}")


_NUMBER = re.compile(r"[-+]?\d+(?:\.\d+)?")


def number(value, default=None):
    """The first number in a tool's value ("35.0", "24576 MiB", {"value": 40, "unit": "C"}), or default."""
    if isinstance(value, dict):
        value = value.get("value")
    if isinstance(value, bool) or value is None:
        return default
    if isinstance(value, int | float):
        return value
    match = _NUMBER.search(str(value))
    if not match:
        return default
    text = match.group()
    return float(text) if "." in text else int(text)


_UNITS = {"b": 1, "kb": 1e3, "kib": 2**10, "mb": 1e6, "mib": 2**20, "gb": 1e9, "gib": 2**30}


def to_gib(value, unit: str = "b") -> float:
    """A memory amount in GiB; ``unit`` is the default when the value names none ("MB" = MiB in these tools)."""
    if isinstance(value, dict):
        unit = str(value.get("unit") or unit)
        value = value.get("value")
    amount = number(value, 0)
    named = re.search(r"[a-zA-Z]+", str(value)) if isinstance(value, str) else None
    if named:
        unit = named.group()
    # Vendor tools write MB/GB for binary units (npu-smi, amd-smi, cnmon all mean MiB).
    factor = {"mb": 2**20, "gb": 2**30, "kb": 2**10}.get(unit.lower(), _UNITS.get(unit.lower(), 1))
    return round(amount * factor / 2**30, 2)


def normalise_bus_id(bus: str) -> str:
    """PCI bus ids as NVML writes them, upper-case with a domain: 0000:C1:00.0."""
    bus = bus.strip()
    if not bus:
        return ""
    if bus.count(":") == 1:
        bus = "0000:" + bus
    return bus.upper()


def read_version_file(*paths: str) -> str:
    """The first line of the first readable version file (``key=value`` lines give the ``version`` value)."""
    for path in paths:
        try:
            with open(path, encoding="utf-8", errors="replace") as handle:
                lines = [line.strip() for line in handle.read(4096).splitlines() if line.strip()]
        except OSError:
            continue
        for line in lines:
            key, sep, value = line.partition("=")
            if sep and key.strip().lower() in ("version", "version_dir"):
                return value.strip()[:64]
        if lines:
            return lines[0][:64]
    return ""


class Detector:
    """One vendor's way of reading accelerators. Subclasses set ``name``/``vendor`` and implement the three hooks."""

    name = ""
    vendor = ""
    tools: tuple[str, ...] = ()  # found on PATH means this host has the vendor's stack

    def present(self) -> bool:
        """Whether this host has the vendor's library or tool (cheap: no device access)."""
        return any(which(tool) for tool in self.tools)

    def start(self) -> None:
        """Open the library or check the tool; DetectorError says why it cannot be used."""

    def read(self) -> tuple[list[DeviceReport], str, str]:
        """(devices, driver version, runtime version); DetectorError when the read fails."""
        raise NotImplementedError

    def stop(self) -> None:
        """Release what start() opened."""
