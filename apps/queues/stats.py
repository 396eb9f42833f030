"""Counters of the scheduling loop kept in Redis, so the web process can expose what the worker did.

Redis is reached through :mod:`hcsportal.redis_guard`: a dead or hung Redis costs a cycle or a /metrics request one
short timeout, and nothing while the breaker is open.
"""

from __future__ import annotations

import logging

import redis

from hcsportal import redis_guard

log = logging.getLogger(__name__)

KEY = "hcs:stats:scheduler:{vdc}"
# Fields of each VDC's hash: cycles, cycle_seconds_sum, last_cycle_seconds, starts, preemptions, resizes, waiting.


def record_cycle(vdc: str, seconds: float, starts: int, preemptions: int, resizes: int, waiting: int) -> None:
    """Add one cycle's figures; a Redis outage only loses statistics, never a cycle."""
    try:
        pipe = redis_guard.client().pipeline()
        key = KEY.format(vdc=vdc)
        pipe.hincrby(key, "cycles", 1)
        pipe.hincrbyfloat(key, "cycle_seconds_sum", seconds)
        pipe.hset(key, mapping={"last_cycle_seconds": seconds, "waiting": waiting})
        pipe.hincrby(key, "starts", starts)
        pipe.hincrby(key, "preemptions", preemptions)
        pipe.hincrby(key, "resizes", resizes)
        pipe.execute()
    except redis.RedisError as exc:
        log.warning("scheduler statistics not recorded: %s", exc)


def read_all() -> dict[str, dict[str, float]]:
    """Every VDC's counters, as floats, keyed by VDC name."""
    client = redis_guard.client(decode_responses=True)
    out = {}
    for key in client.scan_iter(KEY.format(vdc="*")):
        out[key.rsplit(":", 1)[1]] = {k: float(v) for k, v in client.hgetall(key).items()}
    return out


# Latency histograms per VDC and priority class, kept in Redis like the cycle counters: every process that sees a
# task start adds its observation, and /metrics reads the sums. Buckets in seconds (Prometheus' "le" bounds).
LATENCY_BUCKETS = (1, 5, 15, 30, 60, 120, 300, 600, 1800, 3600, 4 * 3600, 12 * 3600, 24 * 3600)
LATENCY_KEY = "hcs:stats:latency:{metric}:{vdc}:{klass}"
LATENCIES = ("submit_to_running", "queue_wait")


def record_latency(metric: str, vdc: str, klass: str, seconds: float) -> None:
    """Add one observation to a latency histogram; a Redis outage only loses statistics."""
    if metric not in LATENCIES:
        raise ValueError(f"unknown latency {metric!r}; expected one of {LATENCIES}")
    seconds = max(0.0, seconds)
    try:
        pipe = redis_guard.client().pipeline()
        key = LATENCY_KEY.format(metric=metric, vdc=vdc, klass=klass)
        for bound in LATENCY_BUCKETS:
            if seconds <= bound:
                pipe.hincrby(key, f"le:{bound}", 1)
        pipe.hincrby(key, "count", 1)
        pipe.hincrbyfloat(key, "sum", seconds)
        pipe.execute()
    except redis.RedisError as exc:
        log.warning("latency statistics not recorded: %s", exc)


def read_latencies() -> dict[tuple[str, str, str], dict[str, float]]:
    """Every histogram's fields, keyed by (metric, vdc, class)."""
    client = redis_guard.client(decode_responses=True)
    out = {}
    for key in client.scan_iter(LATENCY_KEY.format(metric="*", vdc="*", klass="*")):
        _hcs, _stats, _latency, metric, vdc, klass = key.split(":", 5)
        out[(metric, vdc, klass)] = {k: float(v) for k, v in client.hgetall(key).items()}
    return out


# Background jobs that expired in the queue before a worker took them (the workers were all busy), by job name.
EXPIRED_KEY = "hcs:stats:expired-jobs"


def record_expired(job: str) -> None:
    """Count one job that expired unrun; a Redis outage only loses statistics."""
    try:
        redis_guard.client().hincrby(EXPIRED_KEY, job, 1)
    except redis.RedisError as exc:
        log.warning("expired job not counted: %s", exc)


def read_expired() -> dict[str, float]:
    """Expired jobs so far, by job name."""
    client = redis_guard.client(decode_responses=True)
    return {job: float(count) for job, count in client.hgetall(EXPIRED_KEY).items()}
