"""The remote-GPU worker: a small server, run inside a GPU task, that calls the functions a module exposes
for clients of the same project.

    python -m hcs_remote.worker --module mymodels        # listens on $HCS_PORT, key from HCS_REMOTE_GPU_KEY

Only functions decorated with :func:`hcs_remote.expose` in that module can be called; arguments and results
are plain arrays and JSON values (:mod:`hcs_remote.wire`). A failing function answers its exception's type
and message; the traceback goes to the worker's own log (the task's log), never to the caller.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import importlib
import logging
import os
import secrets
import socket
import socketserver
import struct
import sys
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field

from . import shm, wire
from .registry import exposed_functions
from .wire import Channel, RemoteError

log = logging.getLogger("hcs_remote.worker")

MAX_ERROR_CHARS = 2000
LOCAL_PREFIX = "hcs-remote-gpu-"  # abstract unix socket names the worker offers: this and 32 random hex digits


@dataclass
class WorkerConfig:
    """What a worker serves and its limits."""

    functions: dict[str, Callable]
    key: bytes
    project: str = ""
    max_payload: int = wire.DEFAULT_MAX_PAYLOAD  # bytes of arrays in one request
    call_timeout: float = 300.0  # seconds a call may run before the caller gets a timeout answer
    idle_timeout: float = 600.0  # seconds a connection may wait between requests
    io_timeout: float = 60.0  # seconds a frame may take to arrive once it began
    auth_timeout: float = 5.0  # seconds from accepting a connection to the end of its handshake
    max_connections: int = 16  # authenticated callers at once
    max_unauthenticated: int = 64  # connections waiting to authenticate; a newer one closes the oldest
    concurrency: int = 1  # calls running at once (a GPU is usually best fed one call at a time)
    _slots: threading.BoundedSemaphore = field(init=False, repr=False)
    _pool: concurrent.futures.ThreadPoolExecutor = field(init=False, repr=False)

    def __post_init__(self):
        self._slots = threading.BoundedSemaphore(self.max_connections)
        self._pool = concurrent.futures.ThreadPoolExecutor(self.concurrency, thread_name_prefix="hcs-remote-call")

    def catalogue(self) -> list[dict]:
        return [{"name": n, "doc": (f.__doc__ or "").strip().split("\n")[0]} for n, f in sorted(self.functions.items())]


def _error(kind: str, message: str, call_id=None) -> dict:
    return {"op": "error", "id": call_id, "kind": kind, "error": message[:MAX_ERROR_CHARS]}


def _shut(sock: socket.socket) -> None:
    """End a connection another thread is reading: its read returns at once and its handler ends."""
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_RDWR)


class Strangers:
    """Connections that have not authenticated yet, oldest first.

    Each is shut at its handshake deadline (``timeout`` after it was accepted), however it trickles bytes; when
    ``limit`` already wait, a new one shuts the oldest. So connections that never send the key hold neither a
    caller's place nor the worker for long, and a flood of them delays a real caller by its own handshake only.
    """

    def __init__(self, limit: int, timeout: float):
        self.limit, self.timeout = limit, timeout
        self._waiting: OrderedDict[socket.socket, tuple[float, str]] = OrderedDict()
        self._changed = threading.Condition()
        threading.Thread(target=self._reap, name="hcs-remote-deadlines", daemon=True).start()

    def arrive(self, sock: socket.socket, peer: str) -> None:
        """A connection was accepted: its deadline starts now."""
        with self._changed:
            while len(self._waiting) >= self.limit:
                oldest, (_, who) = self._waiting.popitem(last=False)
                log.warning("%d connections waiting to authenticate: closed the oldest, from %s", self.limit, who)
                _shut(oldest)
            self._waiting[sock] = (time.monotonic() + self.timeout, peer)
            self._changed.notify()

    def leave(self, sock: socket.socket) -> bool:
        """The connection is done with its handshake; False when its deadline or the cap closed it already."""
        with self._changed:
            return self._waiting.pop(sock, None) is not None

    def _reap(self) -> None:
        with self._changed:
            while True:
                now = time.monotonic()
                while self._waiting and next(iter(self._waiting.values()))[0] <= now:
                    sock, (_, who) = self._waiting.popitem(last=False)
                    log.warning("client %s did not authenticate within %g s: closed", who, self.timeout)
                    _shut(sock)
                first = next(iter(self._waiting.values()), None)
                self._changed.wait(None if first is None else first[0] - now)


class Tickets:
    """Offers to move an authenticated socket connection onto the worker's unix socket (same host only).

    The socket connection's ready frame carries a one-time ticket; a local connection that authenticates with
    the project key and presents it takes over the socket connection's place among the callers, and the socket
    connection is closed. A ticket dies with its connection, and no local connection gets in without one.
    """

    def __init__(self):
        self._open: dict[str, socket.socket] = {}
        self._lock = threading.Lock()

    def issue(self, sock: socket.socket) -> str:
        ticket = secrets.token_hex(16)
        with self._lock:
            self._open[ticket] = sock
        return ticket

    def take(self, ticket: object) -> socket.socket | None:
        """The socket connection ``ticket`` was issued on, once; None for an unknown or spent ticket."""
        with self._lock:
            return self._open.pop(ticket, None) if isinstance(ticket, str) else None

    def withdraw(self, ticket: str) -> bool:
        """The socket connection is ending: False when a local connection took its place already."""
        with self._lock:
            return self._open.pop(ticket, None) is not None


class _Handler(socketserver.BaseRequestHandler):
    """One client connection: the handshake, then calls until the client leaves or breaks the protocol."""

    server: WorkerServer

    def handle(self) -> None:
        config, local = self.server.config, self.server.is_local
        sock: socket.socket = self.request
        if local:
            pid = struct.unpack("3i", sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12))[0]
            peer = f"process {pid} (same host)"
        else:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            peer = "{}:{}".format(*self.client_address[:2]) if isinstance(self.client_address, tuple) else "?"
        channel = Channel(sock, "worker", max_body=config.max_payload, local=local)
        self.server.strangers.arrive(sock, peer)
        admitted, ticket = False, None
        try:
            session, presented = self._handshake(channel)
            if not self.server.strangers.leave(sock):
                return  # its deadline passed meanwhile: the connection is shut already
            channel.secure(session)
            if local:
                moved_from = self.server.tickets.take(presented)
                if moved_from is None:
                    raise RemoteError(
                        "auth", "a shared-memory connection needs the ticket its socket connection was offered, once"
                    )
                _shut(moved_from)  # this connection takes its place among the callers
            elif not config._slots.acquire(blocking=False):
                self._refuse(channel, "busy", f"the worker serves at most {config.max_connections} connections at once")
                return
            admitted = True
            log.info("client %s authenticated%s", peer, " (shared memory)" if local else "")
            ready = {"op": "ready", "functions": config.catalogue(), "max_payload": config.max_payload}
            if self.server.offer:
                ticket = self.server.tickets.issue(sock)
                ready["local"] = {"socket": self.server.offer, "ticket": ticket}
            channel.send(ready)
            while self._serve_one(channel):
                pass
        except RemoteError as exc:
            log.warning("client %s: %s", peer, exc)
            self._refuse(channel, exc.kind, str(exc))
        except (OSError, TimeoutError) as exc:
            log.info("client %s left: %s", peer, exc)
        except Exception as exc:  # a fault of the worker itself: the log gets the traceback, the caller a sentence
            log.exception("client %s: the worker failed", peer)
            self._refuse(channel, "protocol", f"the worker failed to handle the request ({type(exc).__name__})")
        finally:
            self.server.strangers.leave(sock)
            channel.release()
            if ticket is not None and not self.server.tickets.withdraw(ticket):
                admitted = False  # its place went to the local connection that took the ticket
            if admitted:
                config._slots.release()

    @staticmethod
    def _refuse(channel: Channel, kind: str, message: str) -> None:
        """Answer an error and drop the connection: after a broken frame the stream cannot be trusted."""
        with contextlib.suppress(OSError):
            channel.send(_error(kind, message))

    def _handshake(self, channel: Channel) -> tuple[bytes, object]:
        """The mutual challenge-response; the session key once the caller proved it holds the project key, and
        the ticket it presented (moving onto the unix socket)."""
        config = self.server.config
        hello, _ = channel.receive(config.auth_timeout, config.auth_timeout)
        if hello.get("op") != "hello":
            raise RemoteError("auth", "authenticate first: expected a hello with the client's nonce")
        if hello.get("version") != wire.PROTOCOL_VERSION:
            raise RemoteError(
                "protocol", f"protocol version {hello.get('version')!r}: this worker speaks {wire.PROTOCOL_VERSION}"
            )
        client_nonce = hello.get("nonce")
        if not isinstance(client_nonce, str) or not 16 <= len(client_nonce) <= 128:
            raise RemoteError("protocol", "expected a nonce of 16 to 128 characters in the hello")
        claimed = hello.get("project")
        if config.project and claimed and claimed != config.project:
            raise RemoteError(
                "auth",
                f"this worker serves project {config.project!r}, not {claimed!r}: only tasks "
                f"of {config.project!r} may call it",
            )
        worker_nonce = wire.new_nonce()
        channel.send(
            {
                "op": "challenge",
                "nonce": worker_nonce,
                "project": config.project,
                "proof": wire.proof(config.key, "worker", client_nonce, worker_nonce),
            }
        )
        answer, _ = channel.receive(config.auth_timeout, config.auth_timeout)
        expected = wire.proof(config.key, "client", client_nonce, worker_nonce)
        if answer.get("op") != "auth" or not wire.same_proof(answer.get("proof"), expected):
            who = f"project {config.project!r}" if config.project else "this worker's project"
            raise RemoteError(
                "auth",
                f"authentication failed: the caller's key is not the key of {who}; only "
                "tasks of that project may call this worker",
            )
        return wire.session_key(config.key, client_nonce, worker_nonce), answer.get("ticket")

    def _serve_one(self, channel: Channel) -> bool:
        config = self.server.config
        try:
            header, body = channel.receive(config.idle_timeout, config.io_timeout)
        except RemoteError as exc:
            if exc.kind == "connection":
                return False
            raise
        if header.get("op") == "bye":
            return False
        reply, out = self._answer(header, body)
        # The arguments' arrays are gone now (unless the function kept them): staging the result first lets the
        # reply tell a local caller its shared segment came back.
        del header, body
        staged = channel.stage(out)
        del out
        channel.send(reply, staged)
        return True

    def _answer(self, header: dict, body: memoryview) -> tuple[dict, list]:
        """The reply to one request, and the arrays of its result."""
        config = self.server.config
        call_id = header.get("id")
        if header.get("op") != "call":
            return _error("protocol", f"unknown request {header.get('op')!r}: expected call", call_id), []
        name = header.get("fn")
        function = config.functions.get(name) if isinstance(name, str) else None
        if function is None:
            served = ", ".join(sorted(config.functions))
            return _error("unknown_function", f"unknown function {name!r}: this worker serves {served}", call_id), []
        try:
            tensors = wire.split_body(header.get("tensors", []), body)
            args = wire.decode(header.get("args", []), tensors)
            kwargs = wire.decode(header.get("kwargs", {}), tensors)
            if not isinstance(args, list) or not isinstance(kwargs, dict):
                raise ValueError("expected 'args' as a list and 'kwargs' as an object")
        except (ValueError, TypeError, RemoteError) as exc:
            return _error("bad_request", f"malformed call of {name}: {exc}", call_id), []
        started = threading.Event()

        def run():
            started.set()
            return function(*args, **kwargs)

        future = config._pool.submit(run)
        # The time limit counts from when the call starts: a call waiting behind a slow one gets "busy" instead.
        if not started.wait(config.call_timeout) and future.cancel():
            message = f"busy: {name} waited {config.call_timeout:g} s for earlier calls that are still running"
            return _error("busy", message, call_id), []
        try:
            result = future.result(timeout=config.call_timeout)
        except concurrent.futures.TimeoutError:
            return _error("timeout", f"{name} did not finish within {config.call_timeout:g} s", call_id), []
        except Exception as exc:
            log.exception("%s failed", name)
            return _error("function_error", f"{name} failed: {type(exc).__name__}: {exc}", call_id), []
        try:
            structure, out = wire.encode(result)
        except ValueError as exc:
            return _error("function_error", f"{name} returned what cannot be sent: {exc}", call_id), []
        return {"op": "result", "id": call_id, "value": structure}, out


class WorkerServer(socketserver.ThreadingTCPServer):
    """A threaded TCP server for one :class:`WorkerConfig`; each connection gets its own thread.

    With ``shared_memory`` (and a host that can share it), the worker also listens on an abstract unix socket
    of a random name, which it offers to authenticated callers: one on the same host (in the same network
    namespace) can reach it and move there, where arrays travel through shared memory. Others cannot reach
    the name, and stay on TCP."""

    daemon_threads = True
    allow_reuse_address = True
    # The accept queue: a burst of connections must not make a caller's connect wait for a SYN retry.
    request_queue_size = 128
    is_local = False

    def __init__(self, address: tuple[str, int], config: WorkerConfig, shared_memory: bool = True):
        self.config = config
        self.strangers = Strangers(config.max_unauthenticated, config.auth_timeout)
        self.tickets = Tickets()
        self.offer = ""
        self.local: LocalServer | None = None
        super().__init__(address, _Handler)
        if shared_memory and shm.AVAILABLE:
            name = f"{LOCAL_PREFIX}{secrets.token_hex(16)}"
            try:
                self.local = LocalServer(name, self)
            except OSError as exc:
                log.warning("no shared memory for callers on this host: cannot listen on a unix socket (%s)", exc)
            else:
                self.offer = name
                threading.Thread(target=self.local.serve_forever, name="hcs-remote-local", daemon=True).start()

    def server_close(self) -> None:
        if self.local is not None:
            self.local.shutdown()
            self.local.server_close()
        super().server_close()


class LocalServer(socketserver.ThreadingUnixStreamServer):
    """The worker's abstract unix socket: callers that moved from their TCP connection, with their ticket."""

    daemon_threads = True
    request_queue_size = 128
    is_local = True
    offer = ""

    def __init__(self, name: str, tcp: WorkerServer):
        self.config, self.strangers, self.tickets = tcp.config, tcp.strangers, tcp.tickets
        super().__init__("\0" + name, _Handler)  # abstract: no file, gone with the process


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``python -m hcs_remote.worker``."""
    parser = argparse.ArgumentParser(prog="python -m hcs_remote.worker", description=__doc__.split("\n\n")[0])
    parser.add_argument("--module", required=True, help="module whose @expose functions are served")
    parser.add_argument("--host", default="0.0.0.0", help="address to listen on (default: all)")
    parser.add_argument("--port", type=int, default=None, help="port to listen on (default: $HCS_PORT)")
    parser.add_argument("--max-payload-mib", type=float, default=wire.DEFAULT_MAX_PAYLOAD / (1 << 20))
    parser.add_argument("--call-timeout", type=float, default=300.0, help="seconds a call may run")
    parser.add_argument("--concurrency", type=int, default=1, help="calls running at once")
    parser.add_argument("--max-connections", type=int, default=16, help="authenticated callers at once")
    parser.add_argument(
        "--auth-timeout", type=float, default=5.0, help="seconds a connection has to authenticate before it is closed"
    )
    parser.add_argument(
        "--max-unauthenticated",
        type=int,
        default=64,
        help="connections waiting to authenticate; a newer one closes the oldest",
    )
    parser.add_argument(
        "--no-shared-memory",
        action="store_true",
        help="keep callers on this host on TCP instead of offering them shared memory",
    )
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")

    port = args.port if args.port is not None else os.environ.get("HCS_PORT")
    if port is None or not str(port).isdigit():
        parser.error("no port: pass --port or run as a task with a port (HCS_PORT)")
    raw_key = os.environ.get("HCS_REMOTE_GPU_KEY", "")
    if not raw_key:
        parser.error("HCS_REMOTE_GPU_KEY is not set: run the worker as a portal task, which gets its project's key")
    try:
        key = wire.parse_key(raw_key)
    except ValueError as exc:
        parser.error(str(exc))
    limits = (
        args.max_payload_mib,
        args.call_timeout,
        args.concurrency,
        args.max_connections,
        args.auth_timeout,
        args.max_unauthenticated,
    )
    if any(limit <= 0 for limit in limits):
        parser.error("expected positive limits")
    sys.path.insert(0, os.getcwd())  # `--module mymod` finds mymod.py in the job's working directory
    try:
        module = importlib.import_module(args.module)
        functions = exposed_functions(module)
    except (ImportError, ValueError) as exc:
        parser.error(f"cannot load {args.module}: {exc}")
    if not functions:
        parser.error(f"{args.module} exposes no functions: decorate them with @hcs_remote.expose")
    config = WorkerConfig(
        functions=functions,
        key=key,
        project=os.environ.get("HCS_PROJECT", ""),
        max_payload=int(args.max_payload_mib * (1 << 20)),
        call_timeout=args.call_timeout,
        concurrency=args.concurrency,
        max_connections=args.max_connections,
        auth_timeout=args.auth_timeout,
        max_unauthenticated=args.max_unauthenticated,
    )
    with WorkerServer((args.host, int(port)), config, shared_memory=not args.no_shared_memory) as server:
        host, bound = server.server_address[:2]
        # One line tests and people read: where the worker listens and what it serves.
        print(f"hcs_remote worker listening on {host}:{bound}, serving {', '.join(sorted(functions))}", flush=True)
        if server.offer:
            log.info("callers on this host move to shared memory (unix socket @%s)", server.offer)
        with contextlib.suppress(KeyboardInterrupt):
            server.serve_forever()
    return 0


if __name__ == "__main__":
    sys.exit(main())
