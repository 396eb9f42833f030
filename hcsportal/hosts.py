"""Routing by host: the portal's names and the app hosts of Connect (``<task>-<port>.<HCS_APPS_DOMAIN>``) are two
sites in one server, and neither reaches the other's code (docs/security.md).

HTTP: :class:`AppsHostMiddleware`, first in the stack, hands every request for a name under the apps domain to
Connect's app side behind Django's SecurityMiddleware alone (HTTPS redirect, HSTS), so no portal view, session,
CSRF token or login ever serves it. WebSocket: :class:`HostRouter` sends sockets for the apps domain to Connect's
consumer and refuses, on the portal, any socket a page of the apps domain opens.
"""

from __future__ import annotations

from asgiref.sync import markcoroutinefunction
from channels.security.websocket import WebsocketDenier
from django.core.exceptions import DisallowedHost
from django.http import HttpRequest
from django.http.response import HttpResponseBase
from django.middleware.security import SecurityMiddleware

from apps.tasks import access_views, connect


class AppsHostMiddleware:
    """Requests for the apps domain go to Connect's app side; every other request goes on to the portal."""

    sync_capable = False
    async_capable = True

    def __init__(self, get_response):
        self.get_response = get_response
        self.apps = SecurityMiddleware(access_views.app_request)
        markcoroutinefunction(self)

    async def __call__(self, request: HttpRequest) -> HttpResponseBase:
        try:
            host = request.get_host()
        except DisallowedHost:
            # Not a name of ours: the portal's stack answers (a probe by address, or a 400).
            return await self.get_response(request)
        if connect.under_apps_domain(host):
            return await self.apps(request)
        return await self.get_response(request)


def _header(scope: dict, name: bytes) -> str:
    return dict(scope.get("headers") or ()).get(name, b"").decode("latin-1")


class HostRouter:
    """WebSocket routing by the Host header: the apps domain to ``apps``, every other host to ``portal`` unless the
    page that opens the socket is on the apps domain (its Origin), which is refused before the portal sees it."""

    def __init__(self, portal, apps):
        self.portal = portal
        self.apps = apps

    async def __call__(self, scope, receive, send):
        if connect.under_apps_domain(_header(scope, b"host")):
            return await self.apps(scope, receive, send)
        origin = _header(scope, b"origin").partition("://")[2]
        if connect.under_apps_domain(origin):
            return await WebsocketDenier()(scope, receive, send)
        return await self.portal(scope, receive, send)
