"""API tokens on WebSocket handshakes: the portal's sockets for clients that are not browsers (``hcs exec``).

A handshake that carries ``Authorization: Token <key>`` and no ``Origin`` header is authenticated by that token
alone (the user of an active account's API token, as the REST API's token authentication has it; anyone else is
anonymous), and its cookies are dropped, so no portal session ever rides on it. Every other handshake takes the
browsers' way: the origin check (hcsportal/origins.py), then the session cookie. Browsers always send an
``Origin`` on a WebSocket handshake and cannot set an ``Authorization`` header on one, so a page of another site
can neither skip the origin check nor present a token (docs/security.md).
"""

from __future__ import annotations

from channels.db import database_sync_to_async
from django.contrib.auth.models import AnonymousUser
from rest_framework.authtoken.models import Token


def _headers(scope: dict, name: bytes) -> list[bytes]:
    return [value for key, value in scope.get("headers", ()) if key.lower() == name]


def presented_token(scope: dict) -> str | None:
    """The key of a token handshake (``Authorization: Token <key>`` and no ``Origin``); None for any other."""
    if _headers(scope, b"origin"):
        return None
    authorization = _headers(scope, b"authorization")
    if len(authorization) != 1:
        return None
    scheme, _, key = authorization[0].decode("latin-1").strip().partition(" ")
    if scheme.lower() != "token" or not key.strip():
        return None
    return key.strip()


@database_sync_to_async
def token_user(key: str):
    """The active user whose API token ``key`` is; AnonymousUser for an unknown key or an inactive account."""
    token = Token.objects.select_related("user").filter(key=key).first()
    if token is None or not token.user.is_active:
        return AnonymousUser()
    return token.user


class TokenHandshakes:
    """ASGI middleware: token handshakes go to ``application`` with the token's user in the scope and no cookies;
    all others go to ``browsers`` (the origin check and the session)."""

    def __init__(self, application, browsers):
        self.application = application
        self.browsers = browsers

    async def __call__(self, scope, receive, send):
        key = presented_token(scope) if scope["type"] == "websocket" else None
        if key is None:
            return await self.browsers(scope, receive, send)
        headers = [(name, value) for name, value in scope.get("headers", ()) if name.lower() != b"cookie"]
        scope = {**scope, "headers": headers, "cookies": {}, "user": await token_user(key)}
        return await self.application(scope, receive, send)
