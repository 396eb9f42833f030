"""Where ``hcs`` keeps the server and token of ``hcs login``: a JSON file only its owner can read.

``HCS_URL`` and ``HCS_TOKEN`` override the file, so a script or CI job needs no login at all.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path


class ConfigError(Exception):
    """The client does not know which server to talk to, or has no token for it."""


@dataclass(frozen=True)
class Config:
    url: str
    token: str
    username: str = ""


def config_path() -> Path:
    """``$XDG_CONFIG_HOME/hcs/config.json`` (``~/.config`` when unset, as the XDG spec says)."""
    base = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base) / "hcs" / "config.json"


def normalise_url(url: str) -> str:
    """The server's base URL without a trailing slash; ``host:port`` means plain HTTP."""
    url = url.strip().rstrip("/")
    if not url:
        raise ConfigError("Expected a server URL such as https://portal.example")
    if "://" not in url:
        url = f"http://{url}"
    return url.removesuffix("/api/v1")


def _stored() -> dict:
    path = config_path()
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as exc:
        raise ConfigError(f"Cannot read {path}: {exc}; run `hcs login` again") from None
    return data if isinstance(data, dict) else {}


def load(url_override: str | None = None) -> Config:
    """The server and token to use: command line, then ``HCS_URL`` / ``HCS_TOKEN``, then the login file."""
    stored = _stored()
    url = url_override or os.environ.get("HCS_URL") or stored.get("url") or ""
    token = os.environ.get("HCS_TOKEN") or stored.get("token") or ""
    if not url and not token:
        raise ConfigError("Not logged in: run `hcs login --url https://portal.example`, or set HCS_URL and HCS_TOKEN")
    if not url:
        raise ConfigError("No server: run `hcs login --url https://portal.example`, or set HCS_URL")
    if not token:
        raise ConfigError("Not logged in: run `hcs login`, or set HCS_TOKEN")
    return Config(normalise_url(url), token, stored.get("username", ""))


def save(config: Config) -> Path:
    """Write the login file with mode 0600 (its directory 0700): the token opens the user's account."""
    path = config_path()
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.fchmod(fd, 0o600)  # a file left by an older login keeps its mode through O_CREAT
    with os.fdopen(fd, "w") as fh:
        json.dump({"url": config.url, "token": config.token, "username": config.username}, fh)
        fh.write("\n")
    return path


def forget() -> bool:
    """Remove the login file; False when there was none."""
    try:
        config_path().unlink()
    except FileNotFoundError:
        return False
    return True
