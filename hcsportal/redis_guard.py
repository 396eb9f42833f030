"""Redis for the portal's own code: short timeouts, and a breaker so a dead or hung Redis costs little.

Nothing the portal keeps in Redis is the record of anything. Triggers, live-update notes, request counters,
statistics and queued jobs are accelerators or figures; the database holds the state, and the periodic loops act
on it (docs/deploy.md, "Broker and Redis faults"). So every use of Redis may fail, and must fail fast:

* :func:`client` is the process's client: connecting and each reply wait at most ``TIMEOUT_S``;
* its commands and pipelines go through the breaker: the first one that times out or cannot connect opens it, and
  for ``OPEN_S`` seconds every further one in this process fails at once with :class:`Unavailable` (a
  ``redis.ConnectionError``, which callers already treat as an outage) without touching the network. A request
  that uses Redis five times waits for one timeout, not five; the next use after ``OPEN_S`` tries again;
* :func:`enqueue` queues a Celery job through the same breaker, on broker connections of its own with the same
  timeouts, and never raises.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import time

import kombu.exceptions
import kombu.pools
import redis
from django.conf import settings
from redis.client import Pipeline

log = logging.getLogger(__name__)

TIMEOUT_S = 0.5
OPEN_S = 5.0
# What says Redis (or the broker on it) is unreachable or hung; a command Redis refuses (a ResponseError) is not.
OUTAGES = (redis.ConnectionError, redis.TimeoutError, OSError, kombu.exceptions.OperationalError)

_failed_at = 0.0
_failure = ""


class Unavailable(redis.ConnectionError):
    """Redis failed moments ago: this use was skipped without trying."""


@contextlib.contextmanager
def guard():
    """Run one use of Redis or the broker: at once :class:`Unavailable` while the breaker is open; an outage
    inside opens it."""
    global _failed_at, _failure
    since = time.monotonic() - _failed_at
    if since < OPEN_S:
        raise Unavailable(f"Redis failed {since:.1f} s ago ({_failure}); not tried again for {OPEN_S - since:.1f} s")
    try:
        yield
    except OUTAGES as exc:
        _failed_at, _failure = time.monotonic(), f"{type(exc).__name__}: {exc}"
        raise


def reset() -> None:
    """Close the breaker (tests; a process that knows Redis is back)."""
    global _failed_at
    _failed_at = 0.0


class GuardedPipeline(Pipeline):
    """A pipeline whose ``execute`` goes through the breaker."""

    def execute(self, raise_on_error: bool = True) -> list:
        with guard():
            return super().execute(raise_on_error)


class GuardedRedis(redis.Redis):
    """A client whose every command and pipeline goes through the breaker."""

    def execute_command(self, *args, **options):
        with guard():
            return super().execute_command(*args, **options)

    def pipeline(self, transaction: bool = True, shard_hint=None) -> GuardedPipeline:
        return GuardedPipeline(self.connection_pool, self.response_callbacks, transaction, shard_hint)


@functools.cache
def _client(url: str, decode_responses: bool) -> GuardedRedis:
    return GuardedRedis.from_url(
        url, socket_connect_timeout=TIMEOUT_S, socket_timeout=TIMEOUT_S, decode_responses=decode_responses
    )


def client(*, decode_responses: bool = False) -> GuardedRedis:
    """The process's client of ``REDIS_URL``: its connections outlive a request, so a use costs a round trip."""
    return _client(settings.REDIS_URL, decode_responses)


@functools.cache
def _producers(app, url: str) -> kombu.pools.ProducerPool:
    """Producers on broker connections that wait ``TIMEOUT_S`` and connect once, without kombu's retries. The app's
    own connections wait as long as Redis does, which suits the worker and beat (docs/deploy.md), not a request."""
    options = {"socket_timeout": TIMEOUT_S, "socket_connect_timeout": TIMEOUT_S, "max_retries": 0}
    return kombu.pools.producers[app.connection_for_write(url, transport_options=options)]


def enqueue(job, *args, countdown: float = 0.0, expires: float | None = 30.0) -> bool:
    """Queue a Celery job without waiting on a broken broker; False (and a warning) when it could not be queued,
    which the caller accepts because a periodic loop covers the work."""
    try:
        with (
            guard(),
            _producers(job.app, settings.CELERY_BROKER_URL).acquire(block=True, timeout=TIMEOUT_S) as producer,
        ):
            job.apply_async(args, countdown=countdown, expires=expires, retry=False, producer=producer)
    except Exception as exc:  # any failure to queue: the work is covered, the request must go on
        log.warning("cannot queue %s (the periodic loop will do the work): %s", job.name, exc)
        return False
    return True
