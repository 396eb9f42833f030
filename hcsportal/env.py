"""Typed readers for environment variables that fail loudly, naming the variable.

Settings read every knob through these helpers so that a typo such as ``DEBUG=ture`` stops the
portal at start-up with a message that says which variable is wrong and what was expected.
"""

from __future__ import annotations

import ipaddress
import os
import re
from urllib.parse import urlparse
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from django.core.exceptions import ImproperlyConfigured

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off", ""}


def env_str(name: str, default: str = "") -> str:
    """The variable's value, or ``default`` when unset."""
    return os.environ.get(name, default)


def env_bool(name: str, default: bool) -> bool:
    """A boolean variable: one of 1/0, true/false, yes/no, on/off (case-insensitive)."""
    raw = os.environ.get(name)
    if raw is None:
        return default
    value = raw.strip().lower()
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    raise ImproperlyConfigured(f"{name} must be a boolean (true/false, 1/0, yes/no, on/off), got {raw!r}")


def env_int(name: str, default: int, *, minimum: int | None = None) -> int:
    """An integer variable, optionally bounded below."""
    raw = os.environ.get(name)
    if raw is None or raw.strip() == "":
        return default
    try:
        value = int(raw)
    except ValueError:
        raise ImproperlyConfigured(f"{name} must be an integer, got {raw!r}")
    if minimum is not None and value < minimum:
        raise ImproperlyConfigured(f"{name} must be at least {minimum}, got {value}")
    return value


def env_list(name: str, default: list[str]) -> list[str]:
    """A comma-separated list; blanks are dropped."""
    raw = os.environ.get(name)
    if raw is None:
        return list(default)
    return [item.strip() for item in raw.split(",") if item.strip()]


def env_networks(name: str) -> list[str]:
    """A comma-separated list of IP addresses or networks (``10.0.0.5``, ``10.0.0.0/8``, ``::1``); empty when unset."""
    entries = env_list(name, [])
    for entry in entries:
        try:
            ipaddress.ip_network(entry, strict=False)
        except ValueError:
            raise ImproperlyConfigured(
                f"{name} must list IP addresses or networks such as 10.0.0.5 or 10.0.0.0/8, got {entry!r}"
            ) from None
    return entries


def env_url(name: str, schemes: tuple[str, ...]) -> str | None:
    """A URL whose scheme is one of ``schemes``, or None when unset."""
    raw = os.environ.get(name, "").strip()
    if not raw:
        return None
    parsed = urlparse(raw)
    if parsed.scheme not in schemes:
        raise ImproperlyConfigured(
            f"{name} must be a URL starting with one of {', '.join(s + '://' for s in schemes)}, got {raw!r}"
        )
    if parsed.scheme not in ("unix", "redis+socket", "sqlite") and not parsed.hostname:
        raise ImproperlyConfigured(f"{name} must name a host, got {raw!r}")
    return raw


def env_choice(name: str, choices: tuple[str, ...], default: str) -> str:
    """One of ``choices`` (case-insensitive), or ``default`` when unset."""
    raw = os.environ.get(name)
    if raw is None or raw.strip() == "":
        return default
    value = raw.strip().lower()
    if value not in choices:
        raise ImproperlyConfigured(f"{name} must be one of {', '.join(choices)}, got {raw!r}")
    return value


def env_timezone(name: str, default: str) -> str:
    """An IANA time zone name (``Asia/Shanghai``, ``UTC``) that this machine's zone database knows."""
    value = os.environ.get(name, default).strip()
    try:
        ZoneInfo(value)
    except (ZoneInfoNotFoundError, ValueError):
        raise ImproperlyConfigured(f"{name} must be an IANA time zone name such as UTC or Asia/Shanghai, got {value!r}")
    return value


_LABEL = r"[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?"
_DOMAIN = re.compile(rf"^(?P<name>{_LABEL}(?:\.{_LABEL})+)(?::(?P<port>[0-9]{{1,5}}))?$")


def env_domain(name: str, default: str) -> str:
    """A DNS domain of at least two labels, optionally with a port (``apps.example.org``, ``apps.localhost:8000``),
    in lower case."""
    raw = os.environ.get(name)
    value = (default if raw is None or not raw.strip() else raw).strip().lower()
    match = _DOMAIN.match(value)
    if not match or len(match["name"]) > 253 or not 0 < int(match["port"] or 1) < 65536:
        raise ImproperlyConfigured(
            f"{name} must be a domain of two labels or more such as apps.example.org, optionally with :port, "
            f"got {raw!r}"
        )
    return value
