"""Counters of the scheduling loop kept in Redis, so the web process can expose what the worker did."""

from __future__ import annotations

import logging

import redis
from django.conf import settings

log = logging.getLogger(__name__)

KEY = "hcs:stats:scheduler:{vdc}"
# Fields of each VDC's hash: cycles, cycle_seconds_sum, last_cycle_seconds, starts, preemptions, resizes, waiting.


def record_cycle(vdc: str, seconds: float, starts: int, preemptions: int, resizes: int, waiting: int) -> None:
    """Add one cycle's figures; a Redis outage only loses statistics, never a cycle."""
    try:
        client = redis.Redis.from_url(settings.REDIS_URL, socket_connect_timeout=1)
        pipe = client.pipeline()
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
    client = redis.Redis.from_url(settings.REDIS_URL, socket_connect_timeout=1, decode_responses=True)
    out = {}
    for key in client.scan_iter(KEY.format(vdc="*")):
        out[key.rsplit(":", 1)[1]] = {k: float(v) for k, v in client.hgetall(key).items()}
    return out
