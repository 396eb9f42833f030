"""GPU waste: GPU-equivalent hours held by running tasks whose cards all report utilisation under the VDC's idle
threshold (docs/rules.md#monitoring-and-alerts). Kept in Redis as counters per VDC and project, like the scheduler's.

The project-alerts job sees the idle tasks every minute and adds, per task, the time since it last saw it idle
(at most ``MAX_STEP``, so a stopped beat does not count its whole gap). /metrics exports the counters as
``hcs_gpu_idle_hours``; over ``hcs_usage_unit_hours{resource="gpu_eq"}`` they give the waste rate.
"""

from __future__ import annotations

import logging
from datetime import datetime, timedelta

import redis

from hcsportal import redis_guard

log = logging.getLogger(__name__)

TOTALS = "hcs:stats:gpu_idle_hours"  # field "<vdc id>:<project id>" -> GPU-equivalent hours
SEEN = "hcs:stats:gpu_idle_seen"  # field "<task id>" -> when it was last seen idle (epoch seconds)
MAX_STEP = timedelta(minutes=5)


def _client() -> redis.Redis:
    return redis_guard.client(decode_responses=True)


def record_idle(tasks: list[dict], now: datetime) -> None:
    """Add the idle time of these tasks (rows with pk, vdc_id, project_id, allocated_gpu) since last seen idle.

    A task not idle now is forgotten, so its next idle spell starts from zero.
    """
    try:
        client = _client()
        seen = client.hgetall(SEEN)
        pipe = client.pipeline()
        stamp = now.timestamp()
        for t in tasks:
            last = seen.get(str(t["pk"]))
            if last is not None:
                hours = min(stamp - float(last), MAX_STEP.total_seconds()) / 3600
                if hours > 0:
                    pipe.hincrbyfloat(TOTALS, f"{t['vdc_id']}:{t['project_id']}", float(t["allocated_gpu"]) * hours)
        idle_now = {str(t["pk"]) for t in tasks}
        gone = [pk for pk in seen if pk not in idle_now]
        if gone:
            pipe.hdel(SEEN, *gone)
        if idle_now:
            pipe.hset(SEEN, mapping=dict.fromkeys(idle_now, stamp))
        pipe.execute()
    except redis.RedisError as exc:
        log.warning("GPU waste not recorded: %s", exc)


def idle_hours() -> dict[tuple[int, int], float]:
    """GPU-equivalent hours held idle, per (VDC id, project id)."""
    out = {}
    for field, value in _client().hgetall(TOTALS).items():
        vdc_id, project_id = field.split(":")
        out[(int(vdc_id), int(project_id))] = float(value)
    return out
