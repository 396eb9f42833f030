"""Cambricon MLUs through ``cnmon info`` (the driver's management tool).

cnmon prints, per card, a ``Card N`` line followed by ``Key : Value`` lines grouped under section titles
(``Memory Usage``, ``Utilization``, ``Temperature``, ``ECC``, ...) that are indented one level deeper;
it has no JSON output. The parser keeps the nesting by indentation, so extra or reordered keys in
newer releases do not shift anything.
"""

from __future__ import annotations

import re

from apps.clusters.detectors.base import (
    Detector,
    DetectorError,
    DeviceReport,
    fold_health,
    normalise_bus_id,
    number,
    run_tool,
    to_gib,
)

_CARD = re.compile(r"^\s*Card\s*:?\s*(\d+)\s*$", re.IGNORECASE)


def parse_cnmon(text: str) -> list[dict]:
    """One dict per card: ``{"index": n, "": {top-level keys}, "<section>": {keys}}``, keys lower-cased."""
    cards: list[dict] = []
    card: dict | None = None
    section = ""
    section_indent = -1
    for raw in text.splitlines():
        if not raw.strip():
            continue
        match = _CARD.match(raw)
        if match:
            card = {"index": int(match.group(1)), "": {}}
            cards.append(card)
            section, section_indent = "", -1
            continue
        if card is None:
            continue
        indent = len(raw) - len(raw.lstrip())
        key, sep, value = raw.strip().partition(":")
        key = re.sub(r"\s+", " ", key.strip().lower())
        if section and indent <= section_indent:
            section, section_indent = "", -1
        if not sep or not value.strip() and not section:
            # A title line opens a section ("Memory Usage", "ECC", or "Utilization:" on some releases).
            section, section_indent = key, indent
            card.setdefault(section, {})
            continue
        card.setdefault(section, {})[key] = value.strip()
    return cards


def _find(card: dict, section_words: tuple[str, ...], *keys: str):
    for name, values in card.items():
        if not isinstance(values, dict) or not all(word in name for word in section_words):
            continue
        for key in keys:
            if key in values:
                return values[key]
    return None


def _bus_id(card: dict) -> str:
    pci = next((v for k, v in card.items() if isinstance(v, dict) and k.startswith("pci")), {})
    domain, bus, device, function = (
        number(pci.get(k), None) if not str(pci.get(k, "")).lower().startswith("0x") else int(pci[k], 16)
        for k in ("domain id", "bus num", "device", "function")
    )
    if bus is None:
        return ""
    return normalise_bus_id(f"{domain or 0:04x}:{bus:02x}:{device or 0:02x}.{function or 0:x}")


class CambriconDetector(Detector):
    """Cambricon MLUs, one device per card entry cnmon lists."""

    name = "cambricon"
    vendor = "cambricon"
    tools = ("cnmon",)

    def read(self) -> tuple[list[DeviceReport], str, str]:
        cards = parse_cnmon(run_tool(["cnmon", "info"]))
        if not cards:
            raise DetectorError("cnmon info listed no MLU (expected 'Card 0' entries)")
        devices = []
        driver = ""
        for card in cards:
            top = card[""]
            driver = driver or str(top.get("driver", "")).lstrip("v")
            status = str(top.get("health", top.get("status", ""))).lower()
            temperature = _find(card, ("temperature",), "board", "chip", "cluster 0")
            device = DeviceReport(
                index=card["index"],
                uuid=str(top.get("uuid", top.get("mlu unit serial number", ""))),
                name=str(top.get("product name", "")),
                vram_total_gib=to_gib(_find(card, ("memory",), "physical memory total", "total") or 0, "mib"),
                vram_used_gib=to_gib(_find(card, ("memory",), "physical memory used", "used") or 0, "mib"),
                utilization=max(0, min(100, int(number(_find(card, ("utili",), "mlu average", "average"), 0)))),
                temperature_c=int(number(temperature)) if number(temperature) is not None else None,
                ecc_uncorrected=int(number(_find(card, ("ecc",), "uncorrected error", "multiple error"), 0)),
                ecc_corrected=int(number(_find(card, ("ecc",), "corrected error", "one bit error"), 0)),
                xid_errors=0,
                pci_bus_id=_bus_id(card),
                numa_node=None,
                vendor=self.vendor,
                driver_version=driver,
                health_status={"ok": "ok", "normal": "ok", "warning": "warning", "error": "critical"}.get(status, ""),
            )
            devices.append(fold_health(device))
        return devices, driver, ""
