"""The WebSocket origin check: a handshake is let through only from the portal's own pages.

Browsers send any site's pages' sockets to the portal with the portal's cookies, so the origin is what tells
the portal's own pages from another site's (or another port's, or plain HTTP's). The allowed origins are, as
for Django's CSRF check of forms: the portal's own origin as the socket's request names it (the scheme it came
in by, ``https`` when secure, and its ``Host`` header, port included, which must be one of ``ALLOWED_HOSTS``),
and each of ``CSRF_TRUSTED_ORIGINS`` (``https://*.example.org`` also allows its subdomains). Scheme, host and
port must all match; anything else, or no origin at all, is refused before the socket opens (docs/security.md).
"""

from __future__ import annotations

from urllib.parse import urlsplit

from channels.security.websocket import WebsocketDenier
from django.conf import settings
from django.http.request import split_domain_port, validate_host
from django.utils.http import is_same_domain


def _header(scope: dict, name: bytes) -> str | None:
    for key, value in scope.get("headers", ()):
        if key.lower() == name:
            return value.decode("latin1")
    return None


def _secure(scope: dict) -> bool:
    """Whether the socket came in over TLS: ``wss``, or the proxy header Django trusts for HTTP requests."""
    if scope.get("scheme") == "wss":
        return True
    proxy = getattr(settings, "SECURE_PROXY_SSL_HEADER", None)
    if proxy:
        header, secure_value = proxy
        value = _header(scope, header.removeprefix("HTTP_").replace("_", "-").lower().encode())
        return value is not None and value.split(",", 1)[0].strip() == secure_value
    return False


def own_origin(scope: dict) -> str | None:
    """The portal's origin as this socket's request names it; None when its Host is missing or not allowed."""
    host = (_header(scope, b"host") or "").lower()
    domain, _port = split_domain_port(host)
    allowed = settings.ALLOWED_HOSTS
    if settings.DEBUG and not allowed:
        allowed = [".localhost", "127.0.0.1", "[::1]"]  # as Django does for HTTP requests
    if not domain or not validate_host(domain, allowed):
        return None
    return f"{'https' if _secure(scope) else 'http'}://{host}"


def origin_allowed(scope: dict) -> bool:
    """Whether the handshake's Origin is the portal's own or a trusted one (scheme, host and port)."""
    origin = _header(scope, b"origin")
    if not origin:
        return False
    origin = origin.lower()
    if origin == own_origin(scope) or origin in (o.lower() for o in settings.CSRF_TRUSTED_ORIGINS):
        return True
    parts = urlsplit(origin)
    for trusted in settings.CSRF_TRUSTED_ORIGINS:
        if "*" in trusted:
            pattern = urlsplit(trusted.lower())
            if pattern.scheme == parts.scheme and is_same_domain(parts.netloc, pattern.netloc.lstrip("*")):
                return True
    return False


class OriginValidator:
    """ASGI middleware: WebSocket handshakes from an origin :func:`origin_allowed` refuses are denied."""

    def __init__(self, application):
        self.application = application

    async def __call__(self, scope, receive, send):
        if scope["type"] == "websocket" and not origin_allowed(scope):
            return await WebsocketDenier()(scope, receive, send)
        return await self.application(scope, receive, send)
