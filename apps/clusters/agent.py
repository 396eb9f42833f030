"""The node agent's collector: reads this host's accelerators through NVML (``pynvml``).

Pure Python, no Django: the ``node_agent`` command runs it every 10 s and posts the report to
``/api/v1/agent/report/``. Tests pass a fake NVML module with the same functions.
"""

from __future__ import annotations

import logging
import os
import socket
from dataclasses import asdict, dataclass, field

log = logging.getLogger(__name__)

# Health penalties, folded into a 0-100 score (100 = healthy). Uncorrected ECC errors and critical
# XIDs mean data or the context was lost: the device should not take new work.
PENALTY_UNCORRECTED_ECC = 60
PENALTY_CORRECTED_ECC = 10  # more than CORRECTED_ECC_TOLERATED since the driver loaded
CORRECTED_ECC_TOLERATED = 100
PENALTY_RETIRED_PAGES_PENDING = 20
PENALTY_PER_XID = 40
PENALTY_HOT = 20
HOT_CELSIUS = 85


@dataclass
class DeviceReport:
    """One accelerator as NVML sees it."""

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


@dataclass
class NodeReport:
    """What the agent posts: the host and its devices; ``message`` says why there are none."""

    node: str
    cpu: int
    memory_gib: float
    driver: str = ""
    devices: list[DeviceReport] = field(default_factory=list)
    message: str = ""

    def as_dict(self) -> dict:
        return asdict(self)


def health_score(d: DeviceReport, retired_pending: bool = False) -> int:
    score = 100
    if d.ecc_uncorrected:
        score -= PENALTY_UNCORRECTED_ECC
    if d.ecc_corrected > CORRECTED_ECC_TOLERATED:
        score -= PENALTY_CORRECTED_ECC
    if retired_pending:
        score -= PENALTY_RETIRED_PAGES_PENDING
    score -= PENALTY_PER_XID * d.xid_errors
    if d.temperature_c is not None and d.temperature_c >= HOT_CELSIUS:
        score -= PENALTY_HOT
    return max(0, min(100, score))


def _text(value) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _host_memory_gib() -> float:
    return round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 2)


class Collector:
    """Reads devices through an NVML module (real ``pynvml`` or a fake with the same functions).

    XID critical errors arrive as NVML events; the collector keeps one event set open and counts
    the events seen since the previous report.
    """

    def __init__(self, nvml=None, node_name: str | None = None):
        if nvml is None:
            import pynvml as nvml  # noqa: PLC0415 - optional at import time for tests
        self.nvml = nvml
        self.node_name = node_name or socket.gethostname()
        self.available = False
        self.reason = ""
        self._events = None
        self._xids: dict[int, int] = {}

    def start(self) -> bool:
        """Initialise NVML; False (and ``reason``) when this host has no NVIDIA driver or GPU."""
        try:
            self.nvml.nvmlInit()
        except self.nvml.NVMLError as exc:
            self.reason = f"no NVIDIA GPU found on {self.node_name} (NVML: {exc}); reporting no devices"
            return False
        self.available = True
        try:
            self._events = self.nvml.nvmlEventSetCreate()
            for i in range(self.nvml.nvmlDeviceGetCount()):
                handle = self.nvml.nvmlDeviceGetHandleByIndex(i)
                self.nvml.nvmlDeviceRegisterEvents(handle, self.nvml.nvmlEventTypeXidCriticalError, self._events)
        except self.nvml.NVMLError as exc:
            log.info("XID events unavailable (%s); XID errors will read as 0", exc)
            self._events = None
        return True

    def stop(self) -> None:
        if self.available:
            self.nvml.nvmlShutdown()
            self.available = False

    def _drain_xids(self, bus_to_index: dict[str, int]) -> None:
        if self._events is None:
            return
        while True:
            try:
                event = self.nvml.nvmlEventSetWait(self._events, 0)
            except self.nvml.NVMLError:
                return  # timeout: nothing pending
            bus = _text(self.nvml.nvmlDeviceGetPciInfo(event.device).busId)
            index = bus_to_index.get(bus)
            if index is not None:
                self._xids[index] = self._xids.get(index, 0) + 1
                log.warning("XID %s on GPU %s", event.eventData, index)

    def collect(self) -> NodeReport:
        """One report of the host and its devices."""
        report = NodeReport(node=self.node_name, cpu=os.cpu_count() or 1, memory_gib=_host_memory_gib())
        if not self.available:
            report.message = self.reason
            return report
        n = self.nvml
        report.driver = _text(n.nvmlSystemGetDriverVersion())
        handles = [n.nvmlDeviceGetHandleByIndex(i) for i in range(n.nvmlDeviceGetCount())]
        bus_ids = [_text(n.nvmlDeviceGetPciInfo(h).busId) for h in handles]
        bus_to_index = {bus: i for i, bus in enumerate(bus_ids)}
        self._drain_xids(bus_to_index)
        for i, h in enumerate(handles):
            memory = n.nvmlDeviceGetMemoryInfo(h)
            device = DeviceReport(
                index=i,
                uuid=_text(n.nvmlDeviceGetUUID(h)),
                name=_text(n.nvmlDeviceGetName(h)),
                vram_total_gib=round(memory.total / 2**30, 2),
                vram_used_gib=round(memory.used / 2**30, 2),
                utilization=int(n.nvmlDeviceGetUtilizationRates(h).gpu),
                temperature_c=self._optional(lambda h=h: int(n.nvmlDeviceGetTemperature(h, n.NVML_TEMPERATURE_GPU))),
                ecc_uncorrected=self._ecc(h, n.NVML_MEMORY_ERROR_TYPE_UNCORRECTED),
                ecc_corrected=self._ecc(h, 0),
                xid_errors=self._xids.pop(i, 0),
                pci_bus_id=bus_ids[i],
                numa_node=self._optional(lambda h=h: int(n.nvmlDeviceGetNumaNodeId(h))),
                links=self._links(h, bus_to_index),
            )
            pending = bool(self._optional(lambda h=h: n.nvmlDeviceGetRetiredPagesPendingStatus(h)) or 0)
            device.health_score = health_score(device, pending)
            report.devices.append(device)
        return report

    def _optional(self, read):
        try:
            return read()
        except self.nvml.NVMLError:
            return None

    def _ecc(self, handle, error_type: int) -> int:
        value = self._optional(
            lambda: self.nvml.nvmlDeviceGetTotalEccErrors(handle, error_type, self.nvml.NVML_VOLATILE_ECC)
        )
        return int(value or 0)

    def _links(self, handle, bus_to_index: dict[str, int]) -> list[dict]:
        """Active NVLinks to peer GPUs of this host, one entry per peer with the summed link count."""
        n = self.nvml
        peers: dict[int, int] = {}
        for link in range(n.NVML_NVLINK_MAX_LINKS):
            try:
                if n.nvmlDeviceGetNvLinkState(handle, link) != n.NVML_FEATURE_ENABLED:
                    continue
                remote = _text(n.nvmlDeviceGetNvLinkRemotePciInfo(handle, link).busId)
            except n.NVMLError:
                continue  # no such link on this GPU, or NVLink not supported
            if remote in bus_to_index:
                peers[bus_to_index[remote]] = peers.get(bus_to_index[remote], 0) + 1
        # Per-link bandwidth differs by generation; 25 GB/s per direction per link is NVLink 3/4's figure.
        return [{"peer": p, "type": "nvlink", "bandwidth_gbps": 50 * count} for p, count in sorted(peers.items())]
