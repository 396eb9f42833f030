"""How ``hcs`` prints: aligned tables for people, times in the local zone with how far away they are."""

from __future__ import annotations

import json
import sys
from datetime import datetime


def print_json(data) -> None:
    json.dump(data, sys.stdout, indent=2, ensure_ascii=False)
    sys.stdout.write("\n")


def table(headers: list[str], rows: list[list]) -> str:
    """Columns padded to their widest cell; empty cells shown as ``-``."""
    cells = [[("-" if value in (None, "") else str(value)) for value in row] for row in rows]
    widths = [max(len(h), *(len(row[i]) for row in cells)) if cells else len(h) for i, h in enumerate(headers)]
    lines = ["  ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True)).rstrip()]
    lines += ["  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in cells]
    return "\n".join(lines)


def relative(delta_s: float) -> str:
    """``in 3 min`` / ``2 h ago``: the rough distance of a time from now."""
    ahead, seconds = delta_s >= 0, abs(delta_s)
    for unit, size in (("d", 86400), ("h", 3600), ("min", 60)):
        if seconds >= size:
            amount = f"{int(seconds // size)} {unit}"
            break
    else:
        return "now" if seconds < 5 else ("in a few s" if ahead else "a few s ago")
    return f"in {amount}" if ahead else f"{amount} ago"


def when(value: str | None, *, now: datetime | None = None) -> str:
    """An ISO 8601 time from the API in this machine's zone, with its zone name and distance from now."""
    if not value:
        return ""
    moment = datetime.fromisoformat(value.replace("Z", "+00:00")).astimezone()
    now = now or datetime.now().astimezone()
    return f"{moment:%Y-%m-%d %H:%M:%S %Z} ({relative((moment - now).total_seconds())})"
