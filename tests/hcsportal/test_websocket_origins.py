"""The WebSocket origin check compares scheme, host and port: only the portal's own origin (as the socket's request
names it, its Host one of ALLOWED_HOSTS) and CSRF_TRUSTED_ORIGINS open a socket (hcsportal/origins.py); a client
that is not a browser sends no Origin and an API token instead (hcsportal/socket_tokens.py)."""

from __future__ import annotations

import pytest
from channels.db import database_sync_to_async
from channels.testing import WebsocketCommunicator
from rest_framework.authtoken.models import Token

from hcsportal.asgi import application
from tests.portal.test_live import session_cookie

pytestmark = [pytest.mark.asyncio, pytest.mark.django_db(transaction=True)]

PORTAL = b"127.0.0.1:8000"


async def opens(user, origin: bytes | None, host: bytes = PORTAL, scheme: str = "ws", extra=()) -> bool:
    """Whether the live socket opens for ``user`` with this Origin and Host (and ``extra`` headers)."""
    headers = [(b"host", host), (b"cookie", await database_sync_to_async(session_cookie)(user)), *extra]
    if origin is not None:
        headers.append((b"origin", origin))
    communicator = WebsocketCommunicator(application, "/ws/live/", headers=headers)
    communicator.scope["scheme"] = scheme
    connected, _ = await communicator.connect()
    await communicator.disconnect()
    return connected


async def test_the_portals_exact_origin_opens_a_socket(world):
    assert await opens(world.member, b"http://127.0.0.1:8000")
    assert await opens(world.member, b"https://127.0.0.1:8000", scheme="wss")
    assert await opens(world.member, b"http://localhost", host=b"localhost")


@pytest.mark.parametrize(
    "origin",
    [
        b"http://127.0.0.1:9999",
        b"http://localhost:1234",
        b"localhost:1234",
        b"https://127.0.0.1",
        b"http://[::1]:7777",
        b"[::1]:7777",
        b"http://127.0.0.1",
        b"https://127.0.0.1:8000",
        b"http://localhost:8000",
        b"http://127.0.0.1:8000.evil.example",
        b"null",
        b"",
    ],
)
async def test_another_scheme_host_or_port_is_refused(world, origin):
    assert not await opens(world.member, origin)


async def test_a_socket_without_origin_is_refused(world):
    assert not await opens(world.member, None)


async def test_a_host_outside_allowed_hosts_is_refused_even_with_a_matching_origin(world):
    """A page of a rebinding domain names itself both in Host and in Origin; ALLOWED_HOSTS keeps it out."""
    assert not await opens(world.member, b"http://rebind.example:8000", host=b"rebind.example:8000")


async def test_csrf_trusted_origins_open_a_socket_exactly_or_by_subdomain(world, settings):
    settings.CSRF_TRUSTED_ORIGINS = ["https://portal.example.org", "https://*.apps.example.org"]
    assert await opens(world.member, b"https://portal.example.org")
    assert await opens(world.member, b"https://ide.apps.example.org")
    assert not await opens(world.member, b"http://portal.example.org")
    assert not await opens(world.member, b"https://portal.example.org:8443")


async def test_the_forwarded_scheme_counts_only_where_the_proxy_header_is_trusted(world, settings):
    settings.ALLOWED_HOSTS = [*settings.ALLOWED_HOSTS, "portal.local"]
    forwarded = [(b"x-forwarded-proto", b"https")]
    assert not await opens(world.member, b"https://portal.local", host=b"portal.local", extra=forwarded)
    settings.SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
    assert await opens(world.member, b"https://portal.local", host=b"portal.local", extra=forwarded)


# --- API tokens: clients that are not browsers (hcs exec) send no Origin and an Authorization header ---------


async def token_socket(headers: list) -> tuple[WebsocketCommunicator, bool]:
    communicator = WebsocketCommunicator(application, "/ws/live/", headers=[(b"host", PORTAL), *headers])
    connected, _ = await communicator.connect()
    return communicator, connected


async def test_a_token_without_origin_opens_a_socket_as_the_tokens_user_and_cookies_count_for_nothing(world):
    token = await database_sync_to_async(lambda: Token.objects.create(user=world.viewer).key)()
    member_cookie = await database_sync_to_async(session_cookie)(world.member)
    communicator, connected = await token_socket(
        [(b"authorization", f"Token {token}".encode()), (b"cookie", member_cookie)]
    )
    assert connected
    await communicator.send_json_to({"subscribe": "user", "id": world.viewer.pk})
    assert (await communicator.receive_json_from())["type"] == "subscribed"
    await communicator.send_json_to({"subscribe": "user", "id": world.member.pk})
    assert (await communicator.receive_json_from())["type"] == "refused"
    await communicator.disconnect()


async def test_a_wrong_token_or_a_deactivated_account_is_anonymous_even_with_a_session_cookie(world):
    member_cookie = await database_sync_to_async(session_cookie)(world.member)
    forged = (b"authorization", b"Token " + b"0" * 40)
    _communicator, connected = await token_socket([forged, (b"cookie", member_cookie)])
    assert not connected
    token = await database_sync_to_async(lambda: Token.objects.create(user=world.member).key)()
    world.member.is_active = False
    await database_sync_to_async(world.member.save)()
    _communicator, connected = await token_socket([(b"authorization", f"Token {token}".encode())])
    assert not connected


@pytest.mark.parametrize("origin", [b"http://evil.example", b"http://127.0.0.1:8000", b"", b"null"])
async def test_a_handshake_with_an_origin_takes_the_browsers_way_whatever_token_it_carries(world, origin):
    """A browser always sends an Origin: such a handshake is checked by its origin and its session, and a token
    (which a page could not set anyway) counts for nothing."""
    token = await database_sync_to_async(lambda: Token.objects.create(user=world.member).key)()
    _communicator, connected = await token_socket([(b"authorization", f"Token {token}".encode()), (b"origin", origin)])
    assert not connected
    # The portal's own origin with a valid session opens, as before, and the token does not change whose it is.
    assert await opens(world.member, b"http://127.0.0.1:8000", extra=[(b"authorization", b"Token " + b"0" * 40)])
