"""Device fingerprints (docs/rules.md#cards): what an agent reports, checked against the device's catalog model.

A card that reports less memory than its model has (a disabled HBM stack, a wrong model match, a card
sold as something it is not), measures well under the model's memory bandwidth, or comes from another
vendor than its model loses health, with a reason the admin and the API show.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from decimal import Decimal

from apps.clusters.choices import FiguresSource, Vendor

# Cards report a little less than the marketed size (ECC, driver reserve: a T4 "16 GB" reads 14.75 GiB);
# under 90 % means memory is missing. Over 125 % the model match itself is wrong.
MEMORY_SHORT = 0.9
MEMORY_LONG = 1.25
# A bandwidth probe reaches 80-90 % of the published peak; under 70 % something is wrong.
BANDWIDTH_SHORT = 0.7
PENALTY_MEMORY_SHORT = 40
PENALTY_MEMORY_LONG = 20
PENALTY_BANDWIDTH = 20
PENALTY_VENDOR = 40

# Words in tool-reported names that name the vendor or the product line, not the model.
VENDOR_WORDS = {"nvidia", "tesla", "huawei", "ascend", "amd", "instinct", "hygon", "cambricon"}
_SAFE_NAME = re.compile(r"[^A-Za-z0-9._-]+")


@dataclass
class Fingerprint:
    """The stored fingerprint of one device and the health it loses for not matching its model."""

    memory_bandwidth_gbps: Decimal | None
    tflops_fp16: Decimal | None
    tflops_fp32: Decimal | None
    figures_source: str
    interconnect: str
    driver_version: str
    runtime_version: str
    penalty: int = 0
    reasons: list[str] = field(default_factory=list)


def _figure(value) -> Decimal | None:
    return None if value in (None, 0) or Decimal(value) == 0 else Decimal(value)


def model_words(name: str) -> list[str]:
    """The words of a reported name that name the model: "NVIDIA A100-SXM4-80GB" -> A100, SXM4, 80GB."""
    return [w for w in re.split(r"[\s_\-/]+", name.strip()) if w and w.lower() not in VENDOR_WORDS]


def new_model_name(reported: str) -> str:
    """A catalog name for a model the catalog lacks, writable in a GPU spec: "Quadro RTX 9999" -> Quadro-RTX-9999."""
    name = _SAFE_NAME.sub("-", "-".join(model_words(reported))).strip("-._")[:64]
    return name or "unknown-model"


def vendor_of(reported_vendor: str) -> str:
    """The report's vendor when it is one the catalog knows; NVIDIA for old NVML-only agents that send none."""
    return reported_vendor if reported_vendor in Vendor.values else Vendor.NVIDIA


def fingerprint(device: dict, model, node_driver: str = "", node_runtime: str = "") -> Fingerprint:
    """The fingerprint of a reported device (a validated report dict) against its catalog ``model``."""
    measured = device.get("memory_bandwidth_gbps")
    catalog_bw = _figure(model.memory_bandwidth_gbps)
    kinds = sorted({link["type"] for link in device.get("links") or []})
    fp = Fingerprint(
        memory_bandwidth_gbps=Decimal(str(round(measured, 1))) if measured else catalog_bw,
        tflops_fp16=_figure(model.tflops_fp16),
        tflops_fp32=_figure(model.tflops_fp32),
        figures_source=FiguresSource.MEASURED if measured else FiguresSource.CATALOG,
        interconnect="+".join(kinds) or "pcie",
        driver_version=(device.get("driver_version") or node_driver)[:64],
        runtime_version=(device.get("runtime_version") or node_runtime)[:64],
    )
    reported, expected = float(device["vram_total_gib"]), float(model.vram_gib)
    if expected and reported < expected * MEMORY_SHORT:
        fp.penalty += PENALTY_MEMORY_SHORT
        fp.reasons.append(f"reports {reported:g} GiB of memory; {model.name} has {expected:g} GiB")
    elif expected and reported > expected * MEMORY_LONG:
        fp.penalty += PENALTY_MEMORY_LONG
        fp.reasons.append(
            f"reports {reported:g} GiB of memory, more than {model.name}'s {expected:g} GiB: check the catalog match"
        )
    if measured and catalog_bw and measured < float(catalog_bw) * BANDWIDTH_SHORT:
        fp.penalty += PENALTY_BANDWIDTH
        fp.reasons.append(f"measured {measured:g} GB/s memory bandwidth; {model.name} peaks at {catalog_bw:g} GB/s")
    vendor = device.get("vendor") or ""
    if vendor and vendor != model.vendor:
        fp.penalty += PENALTY_VENDOR
        fp.reasons.append(f"reported by the {vendor} detector but {model.name} is a {model.vendor} model")
    return fp
