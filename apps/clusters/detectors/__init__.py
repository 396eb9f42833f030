"""Node agent detectors: one per accelerator vendor, behind one interface (:class:`Detector`).

``NodeCollector`` runs the detectors this host has (or the one ``node_agent --detector`` names) and folds
their devices into one :class:`NodeReport`; a detector that fails puts its error in the report's message
instead of stopping the agent.
"""

from __future__ import annotations

import logging
import os
import socket

from apps.clusters.detectors.ascend import AscendDetector
from apps.clusters.detectors.base import Detector, DetectorError, DeviceReport, NodeReport, health_score
from apps.clusters.detectors.cambricon import CambriconDetector
from apps.clusters.detectors.nvml import NvmlDetector
from apps.clusters.detectors.rocm import AmdDetector, HygonDetector

__all__ = [
    "DETECTORS",
    "Detector",
    "DetectorError",
    "DeviceReport",
    "NodeCollector",
    "NodeReport",
    "health_score",
    "detectors_for",
]

log = logging.getLogger(__name__)

DETECTORS: dict[str, type[Detector]] = {
    "nvml": NvmlDetector,
    "ascend": AscendDetector,
    "hygon": HygonDetector,
    "amd": AmdDetector,
    "cambricon": CambriconDetector,
}
MAX_MESSAGE = 2000  # what the report endpoint accepts


def detectors_for(choice: str = "auto") -> list[Detector]:
    """The detectors to run: every one whose library or tool this host has ("auto"), or the one named."""
    if choice != "auto":
        if choice not in DETECTORS:
            raise ValueError(f"Expected a detector of auto, {', '.join(DETECTORS)}; got {choice!r}.")
        return [DETECTORS[choice]()]
    found = []
    for name, cls in DETECTORS.items():
        try:
            detector = cls()
        except ImportError as exc:  # pynvml missing: the host cannot use NVML anyway
            log.info("detector %s unavailable: %s", name, exc)
            continue
        if detector.present():
            found.append(detector)
    return found


def _host_memory_gib() -> float:
    return round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 2)


class NodeCollector:
    """Reads this host's accelerators through its detectors into one report, every device numbered once."""

    def __init__(self, detectors: list[Detector], node_name: str | None = None):
        self.detectors = detectors
        self.node_name = node_name or socket.gethostname()
        self.started: list[Detector] = []
        self.reason = ""

    def start(self) -> bool:
        """Start each detector; False (and ``reason``) when none can read devices on this host."""
        problems = []
        for detector in self.detectors:
            try:
                detector.start()
            except DetectorError as exc:
                problems.append(f"{detector.name}: {exc}")
                continue
            self.started.append(detector)
        if not self.detectors:
            names = ", ".join(DETECTORS)
            problems.append(f"no accelerator library or tool found ({names}); reporting no devices")
        self.reason = "; ".join(problems)
        if not self.started and self.detectors:
            self.reason = f"no accelerator readable on {self.node_name} ({self.reason}); reporting no devices"
        return bool(self.started)

    def stop(self) -> None:
        for detector in self.started:
            try:
                detector.stop()
            except Exception as exc:  # shutting down: one failing library must not block the rest
                log.warning("stopping %s failed: %s", detector.name, exc)
        self.started = []

    def collect(self) -> NodeReport:
        """One report of the host and its devices; failed detectors are named in ``message``."""
        report = NodeReport(node=self.node_name, cpu=os.cpu_count() or 1, memory_gib=_host_memory_gib())
        notes = [self.reason] if self.reason else []
        drivers, runtimes = [], []
        for detector in self.started:
            try:
                devices, driver, runtime = detector.read()
            except DetectorError as exc:
                notes.append(f"{detector.name}: {exc}")
                continue
            except Exception as exc:  # a parser bug on odd tool output must not kill the agent
                log.exception("detector %s failed", detector.name)
                notes.append(f"{detector.name}: could not read its tool's output ({type(exc).__name__}: {exc})")
                continue
            report.detectors.append(detector.name)
            offset = len(report.devices)
            for device in sorted(devices, key=lambda d: d.index):
                # Indexes are per vendor; a host with two vendors numbers the second one's after the first's.
                mapping = offset + device.index
                device.index = mapping
                for link in device.links:
                    link["peer"] += offset
                report.devices.append(device)
            drivers.append(driver)
            runtimes.append(runtime)
        report.driver = ", ".join(d for d in drivers if d)[:128]
        report.runtime = ", ".join(r for r in runtimes if r)[:128]
        report.message = "; ".join(notes)[:MAX_MESSAGE]
        return report
