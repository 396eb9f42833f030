"""NVIDIA GPUs through NVML (``pynvml``): memory, utilisation, temperature, ECC, XID events and NVLink peers."""

from __future__ import annotations

import ctypes.util
import logging
import re

from apps.clusters.detectors.base import Detector, DetectorError, DeviceReport, fold_health

log = logging.getLogger(__name__)

# A MIG device's name ends with its profile: "NVIDIA A100-SXM4-80GB MIG 1g.10gb".
_MIG_PROFILE_RE = re.compile(r"(\d+g\.\d+gb)\s*$", re.IGNORECASE)


def _text(value) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


class NvmlDetector(Detector):
    """Reads devices through an NVML module (real ``pynvml`` or a fake with the same functions).

    XID critical errors arrive as NVML events; the detector keeps one event set open and counts
    the events seen since the previous read.
    """

    name = "nvml"
    vendor = "nvidia"
    tools = ("nvidia-smi",)

    def __init__(self, nvml=None):
        if nvml is None:
            import pynvml as nvml  # optional at import time for tests
        self.nvml = nvml
        self.available = False
        self._events = None
        self._xids: dict[int, int] = {}

    def present(self) -> bool:
        # The library is what NVML needs; nvidia-smi ships with it but containers often carry only the library.
        return bool(ctypes.util.find_library("nvidia-ml")) or super().present()

    def start(self) -> None:
        try:
            self.nvml.nvmlInit()
        except self.nvml.NVMLError as exc:
            raise DetectorError(f"no NVIDIA GPU found (NVML: {exc})") from None
        self.available = True
        try:
            self._events = self.nvml.nvmlEventSetCreate()
            for i in range(self.nvml.nvmlDeviceGetCount()):
                handle = self.nvml.nvmlDeviceGetHandleByIndex(i)
                self.nvml.nvmlDeviceRegisterEvents(handle, self.nvml.nvmlEventTypeXidCriticalError, self._events)
        except self.nvml.NVMLError as exc:
            log.info("XID events unavailable (%s); XID errors will read as 0", exc)
            self._events = None

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

    def _runtime(self) -> str:
        """The CUDA version the driver supports, e.g. 12.4 (NVML gives 12040)."""
        read = getattr(self.nvml, "nvmlSystemGetCudaDriverVersion", None)
        value = self._optional(read) if read else None
        return f"{value // 1000}.{value % 1000 // 10}" if isinstance(value, int) and value > 0 else ""

    def read(self) -> tuple[list[DeviceReport], str, str]:
        if not self.available:
            raise DetectorError("NVML is not initialised")
        n = self.nvml
        try:
            driver = _text(n.nvmlSystemGetDriverVersion())
            runtime = self._runtime()
            handles = [n.nvmlDeviceGetHandleByIndex(i) for i in range(n.nvmlDeviceGetCount())]
            bus_ids = [_text(n.nvmlDeviceGetPciInfo(h).busId) for h in handles]
            bus_to_index = {bus: i for i, bus in enumerate(bus_ids)}
            self._drain_xids(bus_to_index)
            devices = []
            for i, h in enumerate(handles):
                memory = self._memory(h)
                device = DeviceReport(
                    index=i,
                    uuid=_text(n.nvmlDeviceGetUUID(h)),
                    name=_text(n.nvmlDeviceGetName(h)),
                    vram_total_gib=round(memory.total / 2**30, 2),
                    vram_used_gib=round(memory.used / 2**30, 2),
                    # A card in MIG mode has no card-wide utilisation (NVML: not supported).
                    utilization=int(self._optional(lambda h=h: n.nvmlDeviceGetUtilizationRates(h).gpu) or 0),
                    temperature_c=self._optional(
                        lambda h=h: int(n.nvmlDeviceGetTemperature(h, n.NVML_TEMPERATURE_GPU))
                    ),
                    ecc_uncorrected=self._ecc(h, n.NVML_MEMORY_ERROR_TYPE_UNCORRECTED),
                    ecc_corrected=self._ecc(h, 0),
                    xid_errors=self._xids.pop(i, 0),
                    pci_bus_id=bus_ids[i],
                    numa_node=self._optional(lambda h=h: int(n.nvmlDeviceGetNumaNodeId(h))),
                    links=self._links(h, bus_to_index),
                    vendor=self.vendor,
                    driver_version=driver,
                    runtime_version=runtime,
                )
                device.mig_mode, device.mig = self._mig(h)
                pending = bool(self._optional(lambda h=h: n.nvmlDeviceGetRetiredPagesPendingStatus(h)) or 0)
                devices.append(fold_health(device, pending))
        except n.NVMLError as exc:
            raise DetectorError(f"NVML read failed: {exc}") from None
        return devices, driver, runtime

    def _memory(self, handle):
        """Total and used memory, used without what the driver reserves for itself.

        NVML's first memory call counts the driver's reservation as used (0.47 GiB on an idle H100 with driver
        580, where nvidia-smi shows 0 MiB); ``nvmlDeviceGetMemoryInfo_v2`` (drivers from 510) reports it apart,
        as nvidia-smi does. Older drivers answer FUNCTION_NOT_FOUND: then the first call.
        """
        n = self.nvml
        version = getattr(n, "nvmlMemory_v2", None)
        if version is not None:
            try:
                return n.nvmlDeviceGetMemoryInfo(handle, version=version)
            except n.NVMLError as exc:
                log.debug("nvmlDeviceGetMemoryInfo_v2 unavailable (%s); used memory includes the driver's reserve", exc)
        return n.nvmlDeviceGetMemoryInfo(handle)

    def _mig(self, handle) -> tuple[bool, list[dict]]:
        """Whether the card is in MIG mode and its MIG instances (profile, uuid, GPU instance id).

        A driver or card without MIG answers NOT_SUPPORTED, which reads as "not in MIG mode".
        """
        n = self.nvml
        read = getattr(n, "nvmlDeviceGetMigMode", None)
        modes = self._optional(lambda: read(handle)) if read else None
        if not modes or modes[0] != getattr(n, "NVML_DEVICE_MIG_ENABLE", 1):
            return False, []
        instances = []
        for j in range(self._optional(lambda: n.nvmlDeviceGetMaxMigDeviceCount(handle)) or 0):
            mig = self._optional(lambda j=j: n.nvmlDeviceGetMigDeviceHandleByIndex(handle, j))
            if mig is None:
                continue  # no instance at this position
            match = _MIG_PROFILE_RE.search(_text(n.nvmlDeviceGetName(mig)))
            if match is None:
                log.warning("MIG device %s of GPU %s has no profile in its name; skipped", j, handle)
                continue
            instances.append(
                {
                    "profile": match.group(1).lower(),
                    "uuid": _text(n.nvmlDeviceGetUUID(mig)),
                    "gpu_instance_id": self._optional(lambda mig=mig: int(n.nvmlDeviceGetGpuInstanceId(mig))),
                }
            )
        return True, instances

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
