"""What the worker log says about a cluster whose backend does not answer: the first failure at warning, then at
most one warning a minute per cluster while it stays unreachable (with how many failures were not logged), and one
info line when it answers again.

The reconciliation lists every cluster every 2 s and the health check probes it every 10 s, in several worker
processes, so the minute is kept in Redis (``hcs:unreachable:<cluster id>:*``) and holds across them; while Redis
is out, each process keeps its own.
"""

from __future__ import annotations

import logging
import threading
import time

import redis

from apps.clusters.models import Cluster
from hcsportal import redis_guard

log = logging.getLogger(__name__)

# At most one warning per cluster this often while it stays unreachable.
REPEAT_S = 60
# Outage marks are forgotten after this long without a failure (a cluster deleted while unreachable).
FORGET_S = 24 * 3600
_KEY = "hcs:unreachable:{cluster_id}:{what}"


class _Local:
    """The few Redis commands used here, in this process only: the fallback while Redis is out."""

    def __init__(self) -> None:
        self._values: dict[str, tuple[str, float | None]] = {}
        self._lock = threading.Lock()

    def _live(self, key: str) -> str | None:
        value, until = self._values.get(key, (None, None))
        if until is not None and time.monotonic() >= until:
            self._values.pop(key, None)
            return None
        return value

    def set(self, key: str, value, *, nx: bool = False, ex: float | None = None) -> bool:
        with self._lock:
            if nx and self._live(key) is not None:
                return False
            self._values[key] = (str(value), None if ex is None else time.monotonic() + ex)
            return True

    def get(self, key: str) -> str | None:
        with self._lock:
            return self._live(key)

    def incr(self, key: str) -> int:
        with self._lock:
            count = int(self._live(key) or 0) + 1
            self._values[key] = (str(count), None)
            return count

    def getset(self, key: str, value) -> str | None:
        with self._lock:
            old = self._live(key)
            self._values[key] = (str(value), None)
            return old

    def delete(self, *keys: str) -> int:
        with self._lock:
            return sum(self._values.pop(key, None) is not None for key in keys)

    def expire(self, key: str, seconds: float) -> bool:
        return True  # in one process the marks go with it


_local = _Local()


def _keys(cluster: Cluster) -> tuple[str, str, str]:
    return tuple(_KEY.format(cluster_id=cluster.pk, what=what) for what in ("since", "warned", "skipped"))


def _text(value) -> str | None:
    return value.decode() if isinstance(value, bytes) else value


def _run(action):
    """``action`` on Redis, or on this process's marks while Redis is out."""
    try:
        return action(redis_guard.client())
    except redis.RedisError:
        return action(_local)


def unreachable(cluster: Cluster, message: str) -> None:
    """A call to the cluster's backend failed for want of an answer: logged at warning the first time, then at most
    once per ``REPEAT_S`` (saying for how long and how many failures were not logged), else at debug."""
    since_key, warned_key, skipped_key = _keys(cluster)

    def note(store) -> tuple[bool, bool, str | None, int]:
        now = time.time()
        first = bool(store.set(since_key, f"{now:.3f}", nx=True, ex=FORGET_S))
        store.expire(since_key, FORGET_S)
        if not store.set(warned_key, "1", nx=True, ex=REPEAT_S):
            store.incr(skipped_key)
            store.expire(skipped_key, FORGET_S)
            return False, first, None, 0
        return True, first, _text(store.get(since_key)), int(_text(store.getset(skipped_key, 0)) or 0)

    warn, first, since, skipped = _run(note)
    if not warn:
        log.debug("cluster %s still does not answer: %s", cluster.name, message)
    elif first or since is None:
        log.warning("cluster %s does not answer: %s", cluster.name, message)
    else:
        log.warning(
            "cluster %s still does not answer after %d s (%d failure(s) not logged since the last warning): %s",
            cluster.name,
            time.time() - float(since),
            skipped,
            message,
        )


def answered(cluster: Cluster) -> None:
    """The cluster's backend answered: an info line when it had not been answering, else nothing."""

    def clear(store) -> str | None:
        since = _text(store.get(_keys(cluster)[0]))
        if since is not None:
            store.delete(*_keys(cluster))
        return since

    since = _run(clear)
    if since is not None:
        log.info("cluster %s answers again, after %d s without an answer", cluster.name, time.time() - float(since))
