"""The node agent's collector: reads this host's accelerators through the vendor detectors.

Pure Python, no Django: the ``node_agent`` command runs it every 10 s and posts the report to
``/api/v1/agent/report/``. The detectors live in :mod:`apps.clusters.detectors`; this module keeps the
NVML-only :class:`Collector` the agent started with (tests pass a fake NVML module to it).
"""

from __future__ import annotations

from apps.clusters.detectors import DETECTORS, NodeCollector, detectors_for
from apps.clusters.detectors.base import (
    CORRECTED_ECC_TOLERATED,
    HOT_CELSIUS,
    PENALTY_CORRECTED_ECC,
    PENALTY_HOT,
    PENALTY_PER_XID,
    PENALTY_RETIRED_PAGES_PENDING,
    PENALTY_UNCORRECTED_ECC,
    DeviceReport,
    NodeReport,
    health_score,
)
from apps.clusters.detectors.nvml import NvmlDetector

__all__ = [
    "CORRECTED_ECC_TOLERATED",
    "DETECTORS",
    "HOT_CELSIUS",
    "PENALTY_CORRECTED_ECC",
    "PENALTY_HOT",
    "PENALTY_PER_XID",
    "PENALTY_RETIRED_PAGES_PENDING",
    "PENALTY_UNCORRECTED_ECC",
    "Collector",
    "DeviceReport",
    "NodeCollector",
    "NodeReport",
    "detectors_for",
    "health_score",
]


class Collector(NodeCollector):
    """A node collector over NVML alone (real ``pynvml`` or a fake with the same functions)."""

    def __init__(self, nvml=None, node_name: str | None = None):
        super().__init__([NvmlDetector(nvml)], node_name)

    @property
    def nvml(self):
        return self.detectors[0].nvml

    @property
    def available(self) -> bool:
        return bool(self.started)
