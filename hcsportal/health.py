"""Liveness and readiness for process supervisors and load balancers: ``/healthz`` and ``/readyz``.

Answered by the first middleware, before host validation and the HTTPS redirect: a Kubernetes probe or a load
balancer asks by the pod's address over plain HTTP. Neither says more than which dependency failed.

* ``/healthz``: the process serves requests (200, nothing checked).
* ``/readyz``: it can do its work: the database answers ``SELECT 1`` and Redis answers ``PING`` (200), else 503
  with the failing part. A web process that is not ready is taken out of the load balancer, not restarted.
  A connection the server dropped is not a database that is down: the check asks once more on a fresh connection
  before it says "unavailable", so probes do not flap while the pool replaces dropped connections.
"""

from __future__ import annotations

import redis
from django.conf import settings
from django.db import connection
from django.http import HttpRequest, HttpResponse, JsonResponse

from hcsportal import db_faults

REDIS_TIMEOUT_S = 1.0


def _select_one() -> None:
    with connection.cursor() as cursor:
        cursor.execute("SELECT 1")
        cursor.fetchone()


def _database() -> str:
    try:
        try:
            _select_one()
        except db_faults.FAULTS:
            db_faults.recover()
            _select_one()
    except Exception as exc:  # any failure means not ready; its class says which
        return f"unavailable ({type(exc).__name__})"
    return "ok"


def _redis() -> str:
    try:
        client = redis.Redis.from_url(
            settings.REDIS_URL, socket_connect_timeout=REDIS_TIMEOUT_S, socket_timeout=REDIS_TIMEOUT_S
        )
        client.ping()
        client.close()
    except redis.RedisError as exc:
        return f"unavailable ({type(exc).__name__})"
    return "ok"


def readiness() -> tuple[bool, dict[str, str]]:
    checks = {"database": _database(), "redis": _redis()}
    return all(v == "ok" for v in checks.values()), checks


class HealthMiddleware:
    """Answers the two probe paths itself; every other request goes on through the stack."""

    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        if request.path == "/healthz":
            return HttpResponse("ok\n", content_type="text/plain")
        if request.path == "/readyz":
            ready, checks = readiness()
            return JsonResponse({"ready": ready, "checks": checks}, status=200 if ready else 503)
        return self.get_response(request)
