"""Pages into running work: the Web Console (a browser terminal on ``ws/tasks/<id>/terminal/``) and Connect
(``/tasks/<id>/connect/<port>/<path>`` hands the visitor over to the port's own origin, where an authenticated
reverse proxy serves it: apps/tasks/connect.py)."""

from __future__ import annotations

import asyncio
import secrets
import time
from dataclasses import dataclass
from html import escape
from http.cookies import SimpleCookie
from urllib.parse import urlencode

import httpx
from asgiref.sync import sync_to_async
from csp.constants import UNSAFE_INLINE
from csp.decorators import csp_update
from django.conf import settings
from django.contrib.auth import get_user_model
from django.contrib.auth.decorators import login_required
from django.contrib.auth.views import redirect_to_login
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect, JsonResponse, StreamingHttpResponse
from django.http.response import HttpResponseBase
from django.shortcuts import get_object_or_404, render
from django.urls import reverse
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_GET, require_POST, require_safe

from apps.clusters.executors.base import ExecutorError
from apps.tasks import access, connect, request_rate
from apps.tasks import services as task_services
from apps.tasks.models import Task
from apps.vdc import policy


def _instance(request: HttpRequest, task: Task) -> int:
    try:
        instance = int(request.GET.get("instance", "0"))
    except ValueError:
        return 0
    return instance if 0 <= instance < max(task.instances, 1) else 0


@login_required
@require_GET
# xterm.js sizes its character grid with <style> elements it writes at run time; scripts stay 'self' only.
@csp_update({"style-src": [UNSAFE_INLINE]})
def task_terminal(request: HttpRequest, pk: int) -> HttpResponse:
    """The terminal page of one instance; the socket decides (and says) whether a shell opens."""
    tasks = policy.scope_to_projects(Task.objects.select_related("project", "cluster"), request.user)
    task = get_object_or_404(tasks, pk=pk)
    instance = _instance(request, task)
    console = policy.console_access(request.user, task.project)
    return render(
        request,
        "portal/task_terminal.html",
        {
            "task": task,
            "instance": instance,
            "may_open": console is not None,
            "visitor": console == policy.VISITOR_CONSOLE,
            "refusal": "" if console else access.console_refusal(request.user, task.project),
            "socket_path": f"/ws/tasks/{task.pk}/terminal/?instance={instance}",
            "nav": "compute-tasks",
        },
    )


# --- Connect, portal side: the hand-over to the app's own origin, and the service test box ----------------------


_TITLES = {401: "Open it from the portal", 403: "Not allowed", 404: "Not found", 405: "Not here", 409: "Not running"}
# Connect's own answers in the portal's colours. App hosts serve no portal stylesheet (every path there is the
# app's), so the page carries its style; the app host's policy sets no style-src.
_PAGE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><meta name="viewport" content="width=device-width, initial-scale=1">
<title>{title} · HCS Portal</title>
<style>
body {{ margin: 0; background: #f5f6f8; color: #1d2330; font: 15px/1.45 system-ui, -apple-system, "Segoe UI", Roboto,
  "Noto Sans", sans-serif; }}
header {{ background: #1b2440; color: #fff; padding: .6rem 1.25rem; font-weight: 700; }}
main {{ max-width: 640px; margin: 1.5rem auto; padding: 1.2rem 1.25rem; background: #fff; border: 1px solid #e3e6eb;
  border-radius: 8px; }}
h1 {{ font-size: 1.3rem; margin: 0 0 .6rem; }}
a {{ color: #3755d6; }}
.muted {{ color: #667085; font-size: .9rem; }}
</style></head>
<body><header>HCS Portal · Connect</header>
<main data-connect-error="{status}"><h1>{title}</h1><p>{message}</p>{back}</main></body></html>
"""


def _page(status: int, message: str, back: str = "") -> HttpResponse:
    """Connect's refusals and failures as an HTML page with the status, what happened and a link back to the
    task's page in the portal (when known)."""
    title = _TITLES.get(status, "The app does not answer" if status >= 500 else "Connect")
    link = (
        f'<p><a href="{escape(back, quote=True)}" data-back>Back to the task\'s page</a></p>'
        if back
        else '<p class="muted">Open the app again from its task\'s page in the portal.</p>'
    )
    text = escape(message, quote=False)
    body = _PAGE.format(status=status, title=escape(title, quote=False), message=text, back=link)
    response = HttpResponse(body, status=status, content_type="text/html; charset=utf-8")
    response["Cache-Control"] = "no-store"
    return response


def _task_page(request: HttpRequest, task_id: int) -> str:
    return request.build_absolute_uri(reverse("portal:task-monitoring", args=[task_id]))


@never_cache
@require_safe
def task_connect(request: HttpRequest, pk: str, port: str, path: str) -> HttpResponse:
    """Send a project owner or member to ``port`` of the task, on the port's own origin, with a one-time ticket.

    The portal serves nothing of the task here. Refusals are HTML pages with the HTTP status and a link back to the
    task's page: 404 for a task the user cannot see (linked to the dashboard), 403 for viewers and undeclared
    ports, 409 when the task is not running.
    """
    if not request.user.is_authenticated:
        return redirect_to_login(request.get_full_path())
    task_id, port_number = int(pk), int(port)
    try:
        access.check_connect(request.user, task_id, port_number)
    except access.Refused as refused:
        back = request.build_absolute_uri("/") if refused.code == 404 else _task_page(request, task_id)
        return _page(refused.code, str(refused), back)
    back = _task_page(request, task_id)
    query = request.META.get("QUERY_STRING", "")
    ticket = connect.issue_ticket(request.user, task_id, port_number, path, query, back=back)
    origin = connect.app_origin(request, task_id, port_number)
    response = HttpResponseRedirect(f"{origin}{connect.EXCHANGE_PATH}?{urlencode({'ticket': ticket})}")
    response["Referrer-Policy"] = "no-referrer"
    return response


_TEST_BODY_LIMIT = 64 * 1024
_TEST_TIMEOUT = httpx.Timeout(10.0, read=120.0)


@login_required
@require_POST
async def service_test(request: HttpRequest, pk: int) -> JsonResponse:
    """The test request box of an inference service: the portal sends one request to the service's port and
    answers its status, time and body (the first 64 KiB, as text) in JSON, for the page to show as text.

    Same rules as Connect; a refusal is ``{"detail": ...}`` with the HTTP status.
    """
    method, path = request.POST.get("method", ""), request.POST.get("path", "")
    if method not in ("GET", "POST"):
        return JsonResponse({"detail": f"Expected method GET or POST, got {method!r}."}, status=400)
    user = await request.auser()
    port = await Task.objects.filter(pk=pk).values_list("port", flat=True).afirst()
    try:
        target = await sync_to_async(access.connect_target)(user, pk, port or 0)
        endpoint = await asyncio.to_thread(target.executor.port_endpoint, target.external_id, 0, target.port)
    except access.Refused as refused:
        return JsonResponse({"detail": str(refused)}, status=refused.code)
    except ExecutorError as exc:
        return JsonResponse({"detail": f"The task's port {port} cannot be reached: {exc}"}, status=502)
    url = f"http://{endpoint.host}:{endpoint.port}" + connect.local_path(path)
    body = request.POST.get("body", "").encode() if method == "POST" else None
    transport = access.upstream_transport(endpoint)
    started = time.monotonic()
    try:
        async with httpx.AsyncClient(
            transport=transport, verify=access.upstream_tls(), timeout=_TEST_TIMEOUT
        ) as client:
            answer = await client.request(
                method, url, content=body, headers={"Content-Type": "application/json"} if body is not None else {}
            )
    except httpx.HTTPError as exc:
        return JsonResponse(
            {"detail": f"Nothing answers on port {port} of the task: {exc or type(exc).__name__}"}, status=502
        )
    elapsed_ms = round(1000 * (time.monotonic() - started))
    text = answer.content[:_TEST_BODY_LIMIT].decode(answer.encoding or "utf-8", errors="replace")
    return JsonResponse(
        {"status": answer.status_code, "reason": answer.reason_phrase, "elapsed_ms": elapsed_ms, "body": text}
    )


# --- Connect, app side: what an app host answers ---------------------------------------------------------------

# Headers that belong to one hop (RFC 9110 §7.6.1) or that the proxy sets itself.
_HOP_BY_HOP = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
        "host",
        "content-length",
    }
)
# Set by the app host itself (connect.APP_HEADERS and its policy); the service's own are replaced.
_REPLACED = frozenset(name.lower() for name in connect.APP_HEADERS)
_CONNECT_TIMEOUT = httpx.Timeout(30.0, read=300.0)
_SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})


def _with_app_headers(response: HttpResponseBase) -> HttpResponseBase:
    """The app host's headers on any of its answers; a policy of the service's own is kept beside its own."""
    for name, value in connect.APP_HEADERS.items():
        response[name] = value
    own = response.get("Content-Security-Policy")
    response["Content-Security-Policy"] = f"{own}, {connect.APP_POLICY}" if own else connect.APP_POLICY
    return response


def _upstream_headers(request: HttpRequest) -> dict[str, str]:
    """The browser's headers minus hop-by-hop ones, an ``Authorization`` header and the app host's and portal's
    cookies: the job never gets what would let it act as the visitor."""
    headers = {
        name: value
        for name, value in request.headers.items()
        if name.lower() not in _HOP_BY_HOP and name.lower() not in ("cookie", "authorization")
    }
    cookie = access.upstream_cookies(request.COOKIES, connect.reserved_cookies())
    if cookie:
        headers["Cookie"] = cookie
    headers.update({"X-Forwarded-Host": request.get_host(), "X-Forwarded-Proto": request.scheme})
    return headers


def _copy_response_headers(upstream: httpx.Response, response: HttpResponseBase, request_url: str, origin: str):
    """The service's headers for the browser. A redirect stays on the app's own origin (``Location`` elsewhere
    raises ValueError), cookies are this host's only (no ``Domain``), and none is named like a reserved one;
    a field the service repeats is joined into one."""
    reserved = connect.reserved_cookies()
    for name, value in upstream.headers.multi_items():
        lower = name.lower()
        if (lower in _HOP_BY_HOP and lower != "content-length") or lower in _REPLACED:
            continue
        if lower == "location":
            local = connect.local_location(value, request_url, origin)
            if local is None:
                raise ValueError(value)
            value = local
        if lower == "set-cookie":
            cookie = SimpleCookie()
            cookie.load(value)
            for morsel in cookie.values():
                if morsel.key not in reserved:
                    morsel["domain"] = ""
                    response.cookies[morsel.key] = morsel
            continue
        # Repeated fields are one list (RFC 9110 §5.3): two policies of the service's both apply.
        response.headers[name] = f"{response.headers[name]}, {value}" if name in response.headers else value


async def _relay(upstream: httpx.Response, client: httpx.AsyncClient, task_id: int, started: float, request_id: str):
    """The service's body as it comes, still encoded as the service sent it. When it ends (relayed or cut off),
    the request's time from ``started`` goes into the service's concurrency (:func:`request_rate.busy`)."""
    try:
        async for chunk in upstream.aiter_raw():
            yield chunk
    finally:
        ended = time.time()
        try:
            await upstream.aclose()
            await client.aclose()
        finally:
            await asyncio.to_thread(request_rate.busy, task_id, started, ended, request_id)


# How often a held request looks again whether its service has a replica that answers.
ACTIVATOR_POLL_S = 0.25


@dataclass
class _Hold:
    """A request Connect's proxy holds for a service scaled to zero (the activator): since when, until when, and
    whether this request is the one that woke it (that one's wait is the service's cold start)."""

    since: float
    until: float
    woke: bool = False

    def left(self) -> float:
        return self.until - time.time()


async def _serving_target(
    user, task_id: int, port: int, hold: _Hold | None = None
) -> tuple[access.ConnectTarget, _Hold | None]:
    """The request's target, as :func:`access.connect_target` checks it. A service that scales to zero and has no
    serving replica is woken if asleep, and the request is held until the service runs (at most
    ``HCS_ACTIVATOR_TIMEOUT_S``; then Refused 504). Every other refusal is raised as it is."""
    while True:
        try:
            return await sync_to_async(access.connect_target)(user, task_id, port), hold
        except access.Waking as waking:
            if hold is None:
                now = time.time()
                hold = _Hold(now, now + settings.HCS_ACTIVATOR_TIMEOUT_S)
            if waking.asleep:
                hold.woke = await sync_to_async(task_services.wake)(task_id) or hold.woke
            if hold.left() <= 0:
                raise access.Refused(
                    504,
                    f"The service was scaled to zero and no replica answered within "
                    f"{settings.HCS_ACTIVATOR_TIMEOUT_S} s; it keeps starting: try again in a moment.",
                ) from waking
            await asyncio.sleep(ACTIVATOR_POLL_S)


async def _hold_if_gone(task_id: int) -> _Hold | None:
    """A request that found a running service's replica gone: if the service scaled to zero meanwhile (it slept
    between the request's check and its connection), the request is held like one that found it asleep."""
    if not await sync_to_async(access.waking)(task_id):
        return None
    now = time.time()
    return _Hold(now, now + settings.HCS_ACTIVATOR_TIMEOUT_S)


async def _ended_early(task_id: int, counted: int | None, request_id: str) -> None:
    """A counted request that got no answer from the service is no longer in flight."""
    if counted is not None:
        now = time.time()
        await asyncio.to_thread(request_rate.busy, task_id, now, now, request_id)


async def app_request(request: HttpRequest) -> HttpResponseBase:
    """Every request for an app host (``<task>-<port>.<HCS_APPS_DOMAIN>``): the ticket exchange, else the task's
    port through the proxy. Answers carry the app host's headers (:data:`connect.APP_HEADERS`)."""
    app = connect.app_of_host(request.get_host())
    if app is None:
        response = _page(404, f"No app here: apps are served at <task>-<port>.{connect.apps_domain()}.")
    elif request.path == connect.EXCHANGE_PATH:
        response = await _exchange(request, *app)
    else:
        response = await _proxy(request, *app)
    return _with_app_headers(response)


async def _exchange(request: HttpRequest, task_id: int, port: int) -> HttpResponse:
    """Redeem a Connect ticket for the app cookie of this host, then go on to the ticket's path here."""
    if request.method != "GET":
        return _page(405, "Expected GET: this address takes the portal's Connect link.")
    back = ""
    try:
        user_id, path, back = await sync_to_async(connect.redeem_ticket)(request.GET.get("ticket", ""), task_id, port)
        user = await get_user_model().objects.filter(pk=user_id, is_active=True).afirst()
        await sync_to_async(access.check_connect)(user, task_id, port)
    except access.Refused as refused:
        return _page(refused.code, str(refused), back)
    await sync_to_async(access.record_connect_opened)(task_id, user, port)
    response = HttpResponseRedirect(path)
    secure = request.is_secure()
    response.set_cookie(
        connect.cookie_name(secure),
        connect.app_cookie(user, task_id, port, back),
        max_age=connect.COOKIE_MAX_AGE_S,
        secure=secure,
        httponly=True,
        samesite="Lax",
    )
    response["Referrer-Policy"] = "no-referrer"
    response["Cache-Control"] = "no-store"
    return response


def _unanswered(exc: httpx.HTTPError, method: str) -> bool:
    """Whether a failed upstream request may go to another replica: nothing reached the service (no connection),
    or the connection broke before any answer and the method is safe to send twice (a job's forwarder accepts the
    connection, then closes it when nothing listens inside the job). A timeout waiting for the answer is no such
    case: the service is slow, and another replica would get the same request on top of its own."""
    if isinstance(exc, httpx.ConnectError | httpx.ConnectTimeout):
        return True
    return method in _SAFE_METHODS and isinstance(exc, httpx.NetworkError | httpx.RemoteProtocolError)


async def _proxy(request: HttpRequest, task_id: int, port: int) -> HttpResponseBase:
    """Proxy a request to ``port`` of the task, as the visitor the app cookie names.

    Only a project owner or member (checked on every request) gets through; a cross-origin request that may
    change something is refused, whatever cookie it carries. Each request is counted, and timed until its response
    is relayed to the end (the autoscaler's request rate and concurrency; the last activity and requests in flight
    of scale to zero); a service the portal scales itself gets its requests spread over its replicas by that count,
    others go to instance 0. A replica that cannot be reached yet (in the placement from the resize on, before its
    program listens) passes the request on to the next one (:func:`_unanswered` says when that is safe). The
    activator: a request for a service that scales to zero and has no serving replica wakes it and is held until a
    replica answers (:func:`_serving_target`); the wait of the request that woke it is the service's cold start,
    kept on the task.
    """
    own_origin = f"{request.scheme}://{request.get_host()}"
    sent_from = request.headers.get("Origin")
    if request.method not in _SAFE_METHODS and sent_from is not None and sent_from != own_origin:
        return _page(403, f"A page of {sent_from} cannot send {request.method} requests to this app.")
    cookie = request.COOKIES.get(connect.cookie_name(request.is_secure()))
    user = await sync_to_async(connect.app_cookie_user)(cookie, task_id, port)
    if user is None:
        return _page(
            401, "Open this app from its task's page in the portal (Connect): the visit has ended or never began here."
        )
    request_id = secrets.token_hex(8)
    counted = None
    hold = None
    target = None
    passed = 0  # replicas of the service passed over for this request (they could not be reached)
    while True:
        try:
            target, hold = await _serving_target(user, task_id, port, hold)
            if counted is None:
                counted = await asyncio.to_thread(request_rate.count, task_id, None, request_id)
            instance = ((counted or 1) + passed) % target.replicas
            endpoint = await asyncio.to_thread(target.executor.port_endpoint, target.external_id, instance, port)
        except access.Refused as refused:
            await _ended_early(task_id, counted, request_id)
            return _page(refused.code, str(refused), connect.app_cookie_back(cookie, task_id, port))
        except ExecutorError as exc:
            hold = hold or await _hold_if_gone(task_id)
            if hold is not None and hold.left() > 0:
                await asyncio.sleep(ACTIVATOR_POLL_S)  # a woken service's job is still being set up
                continue
            if target is not None and passed + 1 < target.replicas:
                passed += 1  # a replica whose job is not up yet: the next one serves the request
                continue
            await _ended_early(task_id, counted, request_id)
            return _page(
                502, f"The task's port {port} cannot be reached: {exc}", connect.app_cookie_back(cookie, task_id, port)
            )

        upstream_origin = f"http://{endpoint.host}:{endpoint.port}"
        query = request.META.get("QUERY_STRING", "")
        url = upstream_origin + connect.local_path(request.path, query)
        client = httpx.AsyncClient(
            transport=access.upstream_transport(endpoint),
            verify=access.upstream_tls(),
            timeout=_CONNECT_TIMEOUT,
            follow_redirects=False,
        )
        outgoing = client.build_request(request.method, url, headers=_upstream_headers(request), content=request.body)
        started = time.time()
        try:
            upstream = await client.send(outgoing, stream=True)
        except httpx.HTTPError as exc:
            await client.aclose()
            connect_failed = isinstance(exc, httpx.ConnectError | httpx.ConnectTimeout)
            if connect_failed and hold is None:
                hold = await _hold_if_gone(task_id)
            if connect_failed and hold is not None and hold.left() > 0:
                # A held request waits for the woken replica's program to listen: nothing was sent yet.
                await asyncio.sleep(ACTIVATOR_POLL_S)
                continue
            if passed + 1 < target.replicas and _unanswered(exc, request.method):
                passed += 1  # a replica whose program does not listen yet (just started): the next one serves
                continue
            await _ended_early(task_id, counted, request_id)
            message = (
                f"Nothing answers on port {port} of the task: {exc or type(exc).__name__}. A program that is still "
                "starting answers in a moment; the task's page offers Connect once its IDE answers."
            )
            return _page(502, message, connect.app_cookie_back(cookie, task_id, port))
        break
    if hold is not None and hold.woke:
        await sync_to_async(task_services.record_cold_start)(task_id, time.time() - hold.since)
    response = StreamingHttpResponse(
        _relay(upstream, client, task_id, started, request_id), status=upstream.status_code
    )
    del response["Content-Type"]
    try:
        _copy_response_headers(upstream, response, request.build_absolute_uri(), upstream_origin)
    except ValueError as refused_location:
        await upstream.aclose()
        await client.aclose()
        return _page(
            502,
            f"The service redirected to {refused_location}, outside this app's own address; Connect "
            "keeps redirects on the app's origin.",
        )
    return response
