"""Requests whose database connection drops: retried once while that is safe, else 503 with Retry-After; never 500.

A connection can die while it waits in the pool or under a request (the server restarted, a proxy or an admin
ended the backend). Nothing notices until a request uses it (docs/deploy.md, "Database faults"):

* a view that fails with ``OperationalError`` or ``InterfaceError`` before the request sent the database anything
  but reads runs once more on a fresh connection: nothing it did can have been stored. First :func:`recover` drops
  the broken connection and every other broken one waiting in the pool (a restarted server breaks them all), so
  the second run, and the requests after it, get working ones. (psycopg_pool's own check on every checkout was
  measured and rejected: after each broken connection it sleeps 1 s, 2 s, 4 s ... before trying the next one);
* otherwise, or when the second try fails too, the answer is 503 with ``Retry-After``. A request that had sent a
  write cannot know whether it was stored, and must not run twice; its client asks again.

:func:`server_error` (``handler500``) answers 503 the same way for such a failure outside a view (a middleware
saving the session, say).
"""

from __future__ import annotations

import contextlib
import logging
import sys

from asgiref.sync import iscoroutinefunction
from django.conf import settings
from django.db import DatabaseError, InterfaceError, OperationalError, connection
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.views import defaults

log = logging.getLogger(__name__)

RETRY_AFTER_S = 2
FAULTS = (OperationalError, InterfaceError)
# Statements that store nothing: a request that sent only these may run again.
READS = ("SELECT", "SAVEPOINT", "RELEASE", "ROLLBACK", "SET", "SHOW")


class _Writes:
    """An execute wrapper that notes whether a statement other than a read was sent."""

    def __init__(self):
        self.sent = False

    def __call__(self, execute, sql, params, many, context):
        if not sql.lstrip().upper().startswith(READS):
            self.sent = True
        return execute(sql, params, many, context)


def unavailable(request: HttpRequest, exc: Exception) -> HttpResponse:
    """503 with ``Retry-After``: JSON for the API, plain text for pages."""
    message = f"The database connection was lost ({type(exc).__name__}); try again in {RETRY_AFTER_S} s."
    if request.path.startswith("/api/"):
        response = JsonResponse({"detail": message}, status=503)
    else:
        response = HttpResponse(message, status=503, content_type="text/plain")
    response["Retry-After"] = str(RETRY_AFTER_S)
    return response


def recover() -> None:
    """After a database fault: give the broken connection back (the pool drops it), and have the pool test the ones
    it holds, dropping and replacing the broken ones, so the next query gets a working connection."""
    with contextlib.suppress(DatabaseError):  # Django forgets the connection whatever closing it says
        connection.close()
    pool = getattr(connection, "pool", None)  # PostgreSQL with HCS_DB_POOL_SIZE; SQLite has none
    if pool is not None:
        pool.check()


class DatabaseFaultMiddleware:
    """Retries a view once after a lost connection while it had only read; else answers 503 (module docstring)."""

    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        _keep_body(request)
        writes = request.hcs_db_writes = _Writes()
        with connection.execute_wrapper(writes):
            return self.get_response(request)

    def process_exception(self, request: HttpRequest, exception: Exception) -> HttpResponse | None:
        if not isinstance(exception, FAULTS):
            return None
        recover()
        where = f"{request.method} {request.path}"
        if not _may_run_again(request):
            log.warning("%s: database fault after a write (or not repeatable), answered 503: %s", where, exception)
            return unavailable(request, exception)
        log.warning("%s: database fault before any write, run again: %s", where, exception)
        match = request.resolver_match
        try:
            response = match.func(request, *match.args, **match.kwargs)
            # Django renders a deferred response after the view, but not one a middleware returns for an exception.
            return response.render() if callable(getattr(response, "render", None)) else response
        except FAULTS as again:
            recover()
            log.warning("%s: database fault again, answered 503: %s", where, again)
            return unavailable(request, again)


def _may_run_again(request: HttpRequest) -> bool:
    """Only reads were sent, the view is a plain function, and it can read the body again."""
    writes = getattr(request, "hcs_db_writes", None)
    match = request.resolver_match
    if writes is None or writes.sent or match is None or iscoroutinefunction(match.func):
        return False
    return not int(request.META.get("CONTENT_LENGTH") or 0) or hasattr(request, "_body")


def _keep_body(request: HttpRequest) -> None:
    """Read a small, non-multipart body now, so a second run of the view can parse it again."""
    size = int(request.META.get("CONTENT_LENGTH") or 0)
    multipart = request.content_type.startswith("multipart/")
    if size and not multipart and size <= (settings.DATA_UPLOAD_MAX_MEMORY_SIZE or size):
        _ = request.body  # Django keeps it; the parsers of a second run read it from there


def server_error(request: HttpRequest, *args, **kwargs) -> HttpResponse:
    """``handler500``: a lost database connection anywhere in the stack is 503 with ``Retry-After``, not 500."""
    exc = sys.exception()
    if isinstance(exc, FAULTS):
        return unavailable(request, exc)
    return defaults.server_error(request, *args, **kwargs)
