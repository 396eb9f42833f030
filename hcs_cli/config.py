"""Where ``hcs`` keeps the server and token of ``hcs login``: a JSON file only its owner can read.

``HCS_URL`` and ``HCS_TOKEN`` override the file, so a script or CI job needs no login at all. The file is never
written or read through a symbolic link, and a file that another user owns or others may read is refused.
"""

from __future__ import annotations

import errno
import json
import os
import secrets
import stat
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


def _refusal(path: Path, why: str) -> ConfigError:
    return ConfigError(f"Refusing {path}: {why}. hcs keeps its token only in a file of its own; run `hcs login` again")


def _stored() -> dict:
    """The login file's contents; a link, another user's file or one others may read is refused, not read."""
    path = config_path()
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except FileNotFoundError:
        return {}
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise _refusal(path, "it is a symbolic link (remove it)") from None
        raise ConfigError(f"Cannot read {path}: {exc}; run `hcs login` again") from None
    with os.fdopen(fd, "rb") as fh:
        info = os.fstat(fh.fileno())
        if not stat.S_ISREG(info.st_mode):
            raise _refusal(path, "it is not a regular file")
        if info.st_uid != os.getuid():
            raise _refusal(path, f"it belongs to uid {info.st_uid}, not to you (uid {os.getuid()})")
        if info.st_mode & 0o077:
            raise _refusal(path, f"others may read or write it (mode {stat.S_IMODE(info.st_mode):04o}, expected 0600)")
        try:
            data = json.loads(fh.read())
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


def _open_private_dir(directory: Path) -> int:
    """A descriptor of ``directory``, which must be a real directory of the user's that nobody else may write."""
    try:
        fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENOTDIR):
            raise _refusal(directory, "it is a symbolic link or not a directory") from None
        raise ConfigError(f"Cannot open {directory}: {exc}") from None
    info = os.fstat(fd)
    if info.st_uid != os.getuid() or info.st_mode & 0o022:
        os.close(fd)
        why = (
            f"it belongs to uid {info.st_uid}, not to you"
            if info.st_uid != os.getuid()
            else f"others may write to it (mode {stat.S_IMODE(info.st_mode):04o}; chmod 700 it)"
        )
        raise _refusal(directory, why)
    return fd


def save(config: Config) -> Path:
    """Write the login file, mode 0600 in a 0700 directory: the token opens the user's account.

    The contents go to a new file (created exclusively, never through a link) that then replaces the login file,
    all relative to the directory opened once, so a link planted at either name cannot redirect the token.
    """
    path = config_path()
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    dir_fd = _open_private_dir(path.parent)
    try:
        try:
            existing = os.stat(path.name, dir_fd=dir_fd, follow_symlinks=False)
        except FileNotFoundError:
            existing = None
        if existing is not None and not stat.S_ISREG(existing.st_mode):
            raise _refusal(path, "it is a symbolic link or not a regular file (remove it)")
        temporary = f".{path.name}.{secrets.token_hex(8)}"
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW
        fd = os.open(temporary, flags, 0o600, dir_fd=dir_fd)
        try:
            with os.fdopen(fd, "w") as fh:
                json.dump({"url": config.url, "token": config.token, "username": config.username}, fh)
                fh.write("\n")
                fh.flush()
                os.fsync(fh.fileno())
            os.replace(temporary, path.name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
        except BaseException:
            os.unlink(temporary, dir_fd=dir_fd)
            raise
    finally:
        os.close(dir_fd)
    return path


def forget() -> bool:
    """Remove the login file; False when there was none."""
    try:
        config_path().unlink()
    except FileNotFoundError:
        return False
    return True
