"""Scheduled minimums of an inference service (docs/rules.md#autoscaling, docs/tasks.md "Scheduled minimums"):
entries "from HH:MM to HH:MM on days, in a time zone, at least N replicas", what they say at a given moment, and
the one-line form the submit page, the CLI and the API take (``Mon-Fri 08:00-20:00 4 Europe/Berlin``).

An entry is stored as ``{"days": "Mon-Fri", "from": "08:00", "to": "20:00", "timezone": "UTC", "min_replicas": 4}``:
``days`` a comma-separated list of days and ranges of days (``Mon-Fri``, ``Sat,Sun``, ``Fri-Mon``), ``to``
earlier than ``from`` crosses midnight (the window belongs to the day it starts on), ``to`` may be ``24:00``.
"""

from __future__ import annotations

import contextlib
import re
from datetime import datetime
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

DAYS = ("Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun")
MAX_ENTRIES = 20
KEYS = ("days", "from", "to", "timezone", "min_replicas")
TIME = re.compile(r"([01]\d|2[0-3]):([0-5]\d)|24:00")
LINE = re.compile(r"(?P<days>\S+)\s+(?P<from>\d\d:\d\d)-(?P<to>\d\d:\d\d)\s+(?P<min>\d+)(?:\s+(?P<tz>\S+))?")
LINE_FORM = "DAYS HH:MM-HH:MM N [TIME ZONE], e.g. 'Mon-Fri 08:00-20:00 4 Europe/Berlin'"


def parse_days(text: str) -> frozenset[int]:
    """The weekdays (0 = Monday) of ``Mon-Fri``, ``Sat,Sun``, ``Fri-Mon``; raises ValueError naming what is wrong."""
    index = {d.lower(): i for i, d in enumerate(DAYS)}
    out: set[int] = set()
    for part in text.split(","):
        ends = [e.strip().lower() for e in part.split("-")]
        if len(ends) > 2 or any(e not in index for e in ends):
            raise ValueError(
                f"Expected days of Mon..Sun, ranges like Mon-Fri or lists like Sat,Sun, got {part.strip()!r}."
            )
        first, last = index[ends[0]], index[ends[-1]]
        out.update((first + k) % 7 for k in range((last - first) % 7 + 1))
    return frozenset(out)


def _minutes(text: str) -> int:
    hours, minutes = text.split(":")
    return int(hours) * 60 + int(minutes)


def parse_line(text: str) -> dict:
    """An entry from its one-line form ``DAYS HH:MM-HH:MM N [TIME ZONE]`` (not yet checked: see :func:`errors`)."""
    match = LINE.fullmatch(text.strip())
    if match is None:
        raise ValueError(f"Expected {LINE_FORM}, got {text.strip()!r}.")
    return {
        "days": match["days"],
        "from": match["from"],
        "to": match["to"],
        "timezone": match["tz"] or "UTC",
        "min_replicas": int(match["min"]),
    }


def format_entry(entry: dict) -> str:
    """The one-line form of a stored entry."""
    return f"{entry['days']} {entry['from']}-{entry['to']} {entry['min_replicas']} {entry.get('timezone') or 'UTC'}"


def entry_error(entry, low: int | None, high: int | None) -> str | None:
    """What is wrong with one entry (None when nothing): shapes, times, days, time zone, and N within low..high."""
    if isinstance(entry, str):
        try:
            entry = parse_line(entry)
        except ValueError as exc:
            return str(exc)
    if not isinstance(entry, dict):
        return f"Expected an object with {', '.join(KEYS)} or the line {LINE_FORM}."
    unknown = sorted(set(entry) - set(KEYS))
    if unknown:
        return f"Unknown key {unknown[0]!r}: expected {', '.join(KEYS)}."
    missing = [k for k in ("days", "from", "to", "min_replicas") if k not in entry]
    if missing:
        return f"Missing {', '.join(missing)}: expected days, from, to and min_replicas (timezone defaults to UTC)."
    for key in ("from", "to"):
        value = entry[key]
        if not isinstance(value, str) or not TIME.fullmatch(value) or (key == "from" and value == "24:00"):
            return f"Expected {key} as HH:MM (00:00 to 23:59{', or 24:00' if key == 'to' else ''}), got {value!r}."
    if _minutes(entry["from"]) == _minutes(entry["to"]):
        return f"Expected from and to to differ, got {entry['from']} to {entry['to']}."
    if not isinstance(entry["days"], str):
        return f"Expected days as text like Mon-Fri or Sat,Sun, got {entry['days']!r}."
    try:
        parse_days(entry["days"])
    except ValueError as exc:
        return str(exc)
    zone = entry.get("timezone", "UTC")
    if not isinstance(zone, str) or not zone:
        return f"Expected a time zone name such as UTC or Europe/Berlin, got {zone!r}."
    try:
        ZoneInfo(zone)
    except (ZoneInfoNotFoundError, ValueError):
        return f"Expected a time zone name such as UTC or Europe/Berlin, got {zone!r}."
    count = entry["min_replicas"]
    if isinstance(count, bool) or not isinstance(count, int):
        return f"Expected min_replicas as a whole number, got {count!r}."
    if low is None or high is None:
        return "A schedule needs autoscaling: set min and max replicas too."
    if not low <= count <= high:
        return f"Expected min_replicas within the service's replicas {low}..{high}, got {count}."
    return None


def schedule_error(schedule, low: int | None, high: int | None) -> str | None:
    """What is wrong with a whole schedule (None when nothing); an entry's message names its position."""
    if schedule in (None, []):
        return None
    if not isinstance(schedule, list):
        return "Expected a list of entries."
    if len(schedule) > MAX_ENTRIES:
        return f"Expected at most {MAX_ENTRIES} entries, got {len(schedule)}."
    for i, entry in enumerate(schedule, start=1):
        message = entry_error(entry, low, high)
        if message:
            return f"Entry {i}: {message}"
    return None


def normalise(schedule):
    """Entries given as lines become objects; objects get their time zone (UTC) when they name none. Anything
    else is left as it is, for :func:`schedule_error` to name."""
    if not isinstance(schedule, list):
        return schedule
    out = []
    for entry in schedule:
        if isinstance(entry, str):
            with contextlib.suppress(ValueError):
                entry = parse_line(entry)
        elif isinstance(entry, dict) and "timezone" not in entry:
            entry = {**entry, "timezone": "UTC"}
        out.append(entry)
    return out


def active(entry: dict, when: datetime) -> bool:
    """Whether the (valid) entry holds at the aware instant ``when``, in the entry's time zone."""
    local = when.astimezone(ZoneInfo(entry.get("timezone") or "UTC"))
    days = parse_days(entry["days"])
    start, end = _minutes(entry["from"]), _minutes(entry["to"])
    now = local.hour * 60 + local.minute
    day = local.weekday()
    if start < end:
        return day in days and start <= now < end
    return (day in days and now >= start) or ((day - 1) % 7 in days and now < end)


def floor_at(schedule, when: datetime) -> int | None:
    """The highest minimum of the entries holding at ``when`` (None when none holds or the schedule is empty);
    entries that are not valid are skipped."""
    counts = []
    for entry in normalise(list(schedule or ())):
        if isinstance(entry, dict) and entry_error(entry, 1, 1 << 30) is None and active(entry, when):
            counts.append(entry["min_replicas"])
    return max(counts, default=None)


def minimum_at(low: int | None, high: int | None, schedule, when: datetime) -> int:
    """A service's minimum at ``when``: ``low`` raised by a scheduled minimum holding then, never above ``high``."""
    low = max(low or 1, 1)
    return min(max(low, floor_at(schedule, when) or 0), max(high or low, low))
