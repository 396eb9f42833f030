"""Pages into running work: the Web Console (a browser terminal on ``ws/tasks/<id>/terminal/``) and Connect
(``/tasks/<id>/connect/<port>/<path>``, an authenticated reverse proxy to a port of the task)."""

from __future__ import annotations

import asyncio
import time
from http.cookies import SimpleCookie
from urllib.parse import quote

import httpx
from asgiref.sync import sync_to_async
from csp.constants import UNSAFE_INLINE
from csp.decorators import csp_update
from django.conf import settings
from django.contrib.auth.decorators import login_required
from django.contrib.auth.views import redirect_to_login
from django.http import HttpRequest, HttpResponse, StreamingHttpResponse
from django.http.response import HttpResponseBase
from django.shortcuts import get_object_or_404, render
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_GET

from apps.clusters.executors.base import ExecutorError
from apps.tasks import access, request_rate
from apps.tasks.models import Task
from apps.vdc.services import can_act


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
    task = get_object_or_404(Task.objects.visible_to(request.user).select_related("project", "cluster"), pk=pk)
    instance = _instance(request, task)
    return render(
        request,
        "portal/task_terminal.html",
        {
            "task": task,
            "instance": instance,
            "may_open": can_act(request.user, task.project),
            "socket_path": f"/ws/tasks/{task.pk}/terminal/?instance={instance}",
            "nav": "compute-tasks",
        },
    )


# --- Connect: an authenticated reverse proxy to a port of the task's first instance ---------------------------

# Headers that belong to one hop (RFC 9110 §7.6.1) or that the proxy sets itself.
_HOP_BY_HOP = frozenset({
    "connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "te", "trailer", "transfer-encoding",
    "upgrade", "host", "content-length",
})  # fmt: skip
_CONNECT_TIMEOUT = httpx.Timeout(30.0, read=300.0)


def connect_prefix(task_id: int, port: int) -> str:
    """The path under which a task's port is proxied; the service sees the rest of the path."""
    return f"/tasks/{task_id}/connect/{port}/"


def _upstream_headers(request: HttpRequest, prefix: str) -> dict[str, str]:
    """The browser's headers minus hop-by-hop ones and minus the portal's credentials (its session and CSRF
    cookies, an API token): the job never sees what would let it act as the user on the portal."""
    headers = {
        name: value
        for name, value in request.headers.items()
        if name.lower() not in _HOP_BY_HOP and name.lower() not in ("cookie", "authorization")
    }
    cookie = access.upstream_cookies(request.COOKIES)
    if cookie:
        headers["Cookie"] = cookie
    headers.update({"X-Forwarded-Host": request.get_host(), "X-Forwarded-Proto": request.scheme,
                    "X-Forwarded-Prefix": prefix.rstrip("/")})  # fmt: skip
    return headers


def _copy_response_headers(upstream: httpx.Response, response: HttpResponseBase, prefix: str, origin: str) -> None:
    """The service's headers for the browser: redirects kept under the prefix, cookies scoped to it and never
    named like the portal's own."""
    portal_cookies = {settings.SESSION_COOKIE_NAME, settings.CSRF_COOKIE_NAME}
    for name, value in upstream.headers.multi_items():
        lower = name.lower()
        if lower in _HOP_BY_HOP and lower != "content-length":
            continue
        if lower == "location":
            value = value.removeprefix(origin)
            if value.startswith("/") and not value.startswith(prefix):
                value = prefix + value.lstrip("/")
        if lower == "set-cookie":
            cookie = SimpleCookie()
            cookie.load(value)
            for morsel in cookie.values():
                if morsel.key not in portal_cookies:
                    morsel["path"] = prefix
                    response.cookies[morsel.key] = morsel
            continue
        response.headers[name] = value


async def _relay(upstream: httpx.Response, client: httpx.AsyncClient, task_id: int, started: float):
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
            await asyncio.to_thread(request_rate.busy, task_id, started, ended)


@csrf_exempt  # the service's own XSRF checks apply; the portal's session cookie is SameSite=Lax
async def task_connect(request: HttpRequest, pk: str, port: str, path: str) -> HttpResponseBase:
    """Proxy a request to ``port`` of the task, as the logged-in project owner or member.

    Only the task's declared ports are reachable; refusals are plain-text answers with the HTTP status.
    Each request is counted, and timed until its response is relayed to the end (the autoscaler's request rate
    and concurrency); a service the portal scales itself gets its requests spread over its replicas by that
    count, others go to instance 0.
    """
    user = await request.auser()
    if not user.is_authenticated:
        return redirect_to_login(request.get_full_path())
    task_id, port_number = int(pk), int(port)
    try:
        target = await sync_to_async(access.connect_target)(user, task_id, port_number)
        counted = await asyncio.to_thread(request_rate.count, task_id)
        instance = (counted or 1) % target.replicas
        endpoint = await asyncio.to_thread(target.executor.port_endpoint, target.external_id, instance, port_number)
    except access.Refused as refused:
        return HttpResponse(str(refused), status=refused.code, content_type="text/plain; charset=utf-8")
    except ExecutorError as exc:
        return HttpResponse(f"The task's port {port_number} cannot be reached: {exc}", status=502,
                            content_type="text/plain; charset=utf-8")  # fmt: skip

    prefix = connect_prefix(task_id, port_number)
    origin = f"http://{endpoint.host}:{endpoint.port}"
    query = request.META.get("QUERY_STRING", "")
    url = f"{origin}/{quote(path, safe=access.PATH_SAFE)}" + (f"?{query}" if query else "")
    transport = httpx.AsyncHTTPTransport(uds=endpoint.uds) if endpoint.uds else None
    client = httpx.AsyncClient(transport=transport, timeout=_CONNECT_TIMEOUT, follow_redirects=False)
    outgoing = client.build_request(request.method, url, headers=_upstream_headers(request, prefix),
                                    content=request.body)  # fmt: skip
    started = time.time()
    try:
        upstream = await client.send(outgoing, stream=True)
    except httpx.HTTPError as exc:
        await client.aclose()
        return HttpResponse(f"Nothing answers on port {port_number} of the task: {exc or type(exc).__name__}",
                            status=502, content_type="text/plain; charset=utf-8")  # fmt: skip
    response = StreamingHttpResponse(_relay(upstream, client, task_id, started), status=upstream.status_code)
    del response["Content-Type"]
    _copy_response_headers(upstream, response, prefix, origin)
    # The service brings its own pages and scripts; the portal's policy would break them (docs/console.md).
    response._csp_exempt = True
    return response
