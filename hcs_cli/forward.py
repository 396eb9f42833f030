"""``hcs port-forward``: a task's Connect app on ``http://127.0.0.1:<local port>/``, for curl, scripts and browsers.

Connect serves each task port on an origin of its own, ``<task>-<port>.<apps domain>``, which accepts only its app
cookie. The CLI gets that cookie as the task page's Connect link does: the API issues a one-time ticket for the
token's user (``POST /api/v1/tasks/<id>/connect-ticket/``, the same rule: owners and members, a declared port, a
running task), and the CLI redeems it at the origin's exchange. It then relays every local request to the origin
with the cookie (and a new one when the portal ends the visit), and WebSocket upgrades byte for byte.

Where the apps domain has no address (a portal reached by IP, a test server), the CLI connects to the portal's
own address and names the app host in the ``Host`` header: the same server answers both.
"""

from __future__ import annotations

import contextlib
import http.client
import http.server
import re
import socket
import socketserver
import ssl
import sys
import threading
from dataclasses import dataclass
from http.cookies import SimpleCookie
from urllib.parse import urlsplit

from hcs_cli.client import USER_AGENT, ApiError, Client, ConnectionFailed

TIMEOUT_S = 300
# Headers of one hop, never relayed (RFC 9110 section 7.6.1), and those the relay sets itself.
_HOP = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "proxy-connection",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
    }
)
_COOKIE_NAMES = ("hcs-app", "__Host-hcs-app")
_CHUNK = 65536


@dataclass
class Target:
    """Where the app is: its origin (scheme and host, as the browser would name it) and the address to dial."""

    scheme: str
    host_header: str
    address: tuple[str, int]
    server_name: str

    @property
    def origin(self) -> str:
        return f"{self.scheme}://{self.host_header}"

    def connection(self) -> http.client.HTTPConnection:
        if self.scheme == "https":
            return _HTTPSTo(*self.address, self.server_name)
        return http.client.HTTPConnection(*self.address, timeout=TIMEOUT_S)

    def raw_socket(self) -> socket.socket:
        sock = socket.create_connection(self.address, timeout=TIMEOUT_S)
        if self.scheme == "https":
            sock = ssl.create_default_context().wrap_socket(sock, server_hostname=self.server_name)
        return sock


class _HTTPSTo(http.client.HTTPConnection):
    """HTTPS to an address, with the certificate checked for (and SNI asking for) the app host's name."""

    default_port = 443

    def __init__(self, host: str, port: int, server_name: str):
        super().__init__(host, port, timeout=TIMEOUT_S)
        self.server_name = server_name

    def connect(self) -> None:
        super().connect()
        self.sock = ssl.create_default_context().wrap_socket(self.sock, server_hostname=self.server_name)


def _default_port(scheme: str) -> int:
    return 443 if scheme == "https" else 80


def locate(origin: str, portal_url: str) -> Target:
    """How to reach ``origin``: at its own name when it resolves, else at the portal's address with its Host."""
    app = urlsplit(origin)
    name, port = app.hostname or "", app.port or _default_port(app.scheme)
    try:
        socket.getaddrinfo(name, port, type=socket.SOCK_STREAM)
        return Target(app.scheme, app.netloc, (name, port), name)
    except OSError:
        portal = urlsplit(portal_url)
        address = (portal.hostname or "", portal.port or _default_port(portal.scheme))
        return Target(app.scheme, app.netloc, address, name)


class Visit:
    """The app cookie of one task port, fetched with a ticket the API issues for the token's user."""

    def __init__(self, api: Client, task_id: int, port: int):
        self.api, self.task_id, self.port = api, task_id, port
        self.lock = threading.Lock()
        self.cookie = ""
        ticket = self._ticket()
        self.target = locate(ticket["origin"], api.base_url)
        self.renew(ticket)

    def _ticket(self) -> dict:
        return self.api.post(f"tasks/{self.task_id}/connect-ticket/", json={"port": self.port})

    def renew(self, ticket: dict | None = None) -> None:
        """A fresh app cookie (the API's refusal, as ApiError, when the token's user may no longer connect)."""
        with self.lock:
            ticket = ticket or self._ticket()
            exchange = urlsplit(ticket["url"])
            conn = self.target.connection()
            try:
                conn.request(
                    "GET",
                    f"{exchange.path}?{exchange.query}",
                    headers={"Host": self.target.host_header, "User-Agent": USER_AGENT},
                )
                response = conn.getresponse()
                body = response.read()
            except (OSError, http.client.HTTPException) as exc:
                raise ConnectionFailed(f"Cannot reach {self.target.origin}: {exc}") from None
            finally:
                conn.close()
            jar = SimpleCookie()
            for header in response.headers.get_all("Set-Cookie") or []:
                jar.load(header)
            found = next((f"{name}={jar[name].value}" for name in _COOKIE_NAMES if name in jar), "")
            if response.status != 302 or not found:
                text = body.decode("utf-8", "replace")
                raise ConnectionFailed(
                    f"{self.target.origin} did not take the Connect ticket (HTTP {response.status}): {_page_text(text)}"
                )
            self.cookie = found


def _page_text(html: str) -> str:
    """The message of one of Connect's error pages, without its markup."""
    text = re.sub(r"<(script|style)\b.*?</\1>", " ", html, flags=re.S | re.I)
    text = re.sub(r"<[^>]+>", " ", text)
    return " ".join(text.split())[:300]


def _outgoing_headers(headers, target: Target, cookie: str) -> list[tuple[str, str]]:
    """The local request's headers for the app host: its Host, the app cookie (and none of the client's of that
    name), Origin and Referer of the local listener as the app's own."""
    out = []
    cookies = [cookie]
    local = headers.get("Host", "")
    for name, value in headers.items():
        lower = name.lower()
        if lower in _HOP or lower in ("host", "content-length"):
            continue
        if lower == "cookie":
            cookies += [c.strip() for c in value.split(";") if c.strip().split("=", 1)[0] not in _COOKIE_NAMES]
            continue
        if lower in ("origin", "referer") and local:
            value = value.replace(f"http://{local}", target.origin, 1)
        out.append((name, value))
    out += [("Host", target.host_header), ("Cookie", "; ".join(cookies))]
    return out


class Forwarder(socketserver.ThreadingMixIn, http.server.HTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    visit: Visit


class Handler(http.server.BaseHTTPRequestHandler):
    """One local request, relayed to the app host (HTTP/1.0 to the client: one request per connection, the body
    streamed until it ends)."""

    server: Forwarder
    server_version = "hcs-port-forward"

    def log_message(self, format: str, *args) -> None:
        sys.stderr.write(f"hcs: {self.command} {self.path} -> {args[1] if len(args) > 1 else ''}\n")

    def _relay(self) -> None:
        visit = self.server.visit
        if self.headers.get("Upgrade", "").lower() == "websocket":
            return self._tunnel(visit)
        if "chunked" in self.headers.get("Transfer-Encoding", "").lower():
            self.send_error(411, "hcs port-forward relays request bodies with a Content-Length only")
            return
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else None
        for attempt in (1, 2):
            conn = visit.target.connection()
            try:
                conn.putrequest(self.command, self.path, skip_host=True, skip_accept_encoding=True)
                for name, value in _outgoing_headers(self.headers, visit.target, visit.cookie):
                    conn.putheader(name, value)
                if body is not None:
                    conn.putheader("Content-Length", str(len(body)))
                conn.endheaders(body)
                response = conn.getresponse()
            except (OSError, http.client.HTTPException) as exc:
                conn.close()
                self.send_error(502, f"Cannot reach {visit.target.origin}: {exc}")
                return
            if response.status == 401 and attempt == 1:
                # The visit ended (the app cookie expired): a new ticket, once.
                response.read()
                conn.close()
                try:
                    visit.renew()
                except ApiError as exc:
                    self.send_error(403, " ".join(exc.lines()))
                    return
                except ConnectionFailed as exc:
                    self.send_error(502, str(exc))
                    return
                continue
            break
        self.send_response_only(response.status, response.reason)
        local = f"http://{self.headers.get('Host') or '127.0.0.1'}"
        for name, value in response.getheaders():
            lower = name.lower()
            if lower in _HOP or lower == "content-length" and response.chunked:
                continue
            if lower == "location" and value.startswith(visit.target.origin):
                value = local + value[len(visit.target.origin) :]
            self.send_header(name, value)
        self.send_header("Connection", "close")
        self.end_headers()
        try:
            while chunk := response.read1(_CHUNK):
                self.wfile.write(chunk)
                self.wfile.flush()
        except OSError:
            pass
        finally:
            conn.close()

    def _tunnel(self, visit: Visit) -> None:
        """A WebSocket upgrade: the handshake with the app host's Host, Origin and cookie, then bytes both ways."""
        try:
            upstream = visit.target.raw_socket()
        except OSError as exc:
            self.send_error(502, f"Cannot reach {visit.target.origin}: {exc}")
            return
        lines = [f"{self.command} {self.path} HTTP/1.1"]
        for name, value in _outgoing_headers(self.headers, visit.target, visit.cookie):
            if name.lower() != "origin":
                lines.append(f"{name}: {value}")
        lines += ["Origin: " + visit.target.origin, "Connection: Upgrade", "Upgrade: websocket"]
        upstream.sendall(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1"))
        client = self.connection
        upstream.settimeout(None)
        client.settimeout(None)

        def pump(source: socket.socket, sink: socket.socket) -> None:
            try:
                while data := source.recv(_CHUNK):
                    sink.sendall(data)
            except OSError:
                pass
            finally:
                for sock in (source, sink):
                    with contextlib.suppress(OSError):
                        sock.shutdown(socket.SHUT_RDWR)

        back = threading.Thread(target=pump, args=(upstream, client), daemon=True)
        back.start()
        pump(client, upstream)
        back.join()
        upstream.close()
        self.close_connection = True

    do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = do_HEAD = do_OPTIONS = _relay


def serve(visit: Visit, local_port: int, announce) -> None:
    """Listen on 127.0.0.1:``local_port`` (0: any free port) until interrupted; ``announce`` gets the address."""
    try:
        server = Forwarder(("127.0.0.1", local_port), Handler)
    except OSError as exc:
        raise ConnectionFailed(f"Cannot listen on 127.0.0.1:{local_port}: {exc}") from None
    server.visit = visit
    announce(f"http://127.0.0.1:{server.server_address[1]}")
    try:
        server.serve_forever(poll_interval=0.5)
    finally:
        server.server_close()
