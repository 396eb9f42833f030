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
import socket
import socketserver
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass, field

from . import wire
from .registry import exposed_functions
from .wire import Channel, RemoteError

log = logging.getLogger("hcs_remote.worker")

MAX_ERROR_CHARS = 2000


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
    max_connections: int = 16
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


class _Handler(socketserver.BaseRequestHandler):
    """One client connection: the handshake, then calls until the client leaves or breaks the protocol."""

    server: WorkerServer

    def handle(self) -> None:
        config = self.server.config
        sock: socket.socket = self.request
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        channel = Channel(sock, "worker", max_body=config.max_payload)
        if not config._slots.acquire(blocking=False):
            self._refuse(channel, "busy", f"the worker serves at most {config.max_connections} connections at once")
            return
        peer = "{}:{}".format(*self.client_address[:2]) if isinstance(self.client_address, tuple) else "?"
        try:
            if self._handshake(channel):
                log.info("client %s authenticated", peer)
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
            config._slots.release()

    @staticmethod
    def _refuse(channel: Channel, kind: str, message: str) -> None:
        """Answer an error and drop the connection: after a broken frame the stream cannot be trusted."""
        with contextlib.suppress(OSError):
            channel.send(_error(kind, message))

    def _handshake(self, channel: Channel) -> bool:
        config = self.server.config
        hello, _ = channel.receive(config.io_timeout, config.io_timeout)
        if hello.get("op") != "hello":
            raise RemoteError("auth", "authenticate first: expected a hello with the client's nonce")
        if hello.get("version") != wire.PROTOCOL_VERSION:
            raise RemoteError("protocol", f"protocol version {hello.get('version')!r}: this worker speaks "
                                          f"{wire.PROTOCOL_VERSION}")  # fmt: skip
        client_nonce = hello.get("nonce")
        if not isinstance(client_nonce, str) or not 16 <= len(client_nonce) <= 128:
            raise RemoteError("protocol", "expected a nonce of 16 to 128 characters in the hello")
        claimed = hello.get("project")
        if config.project and claimed and claimed != config.project:
            raise RemoteError("auth", f"this worker serves project {config.project!r}, not {claimed!r}: only tasks "
                                      f"of {config.project!r} may call it")  # fmt: skip
        worker_nonce = wire.new_nonce()
        channel.send({"op": "challenge", "nonce": worker_nonce, "project": config.project,
                      "proof": wire.proof(config.key, "worker", client_nonce, worker_nonce)})  # fmt: skip
        answer, _ = channel.receive(config.io_timeout, config.io_timeout)
        expected = wire.proof(config.key, "client", client_nonce, worker_nonce)
        if answer.get("op") != "auth" or not wire.same_proof(answer.get("proof"), expected):
            who = f"project {config.project!r}" if config.project else "this worker's project"
            raise RemoteError("auth", f"authentication failed: the caller's key is not the key of {who}; only "
                                      "tasks of that project may call this worker")  # fmt: skip
        channel.secure(wire.session_key(config.key, client_nonce, worker_nonce))
        channel.send({"op": "ready", "functions": config.catalogue(), "max_payload": config.max_payload})
        return True

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
        call_id = header.get("id")
        if header.get("op") != "call":
            channel.send(_error("protocol", f"unknown request {header.get('op')!r}: expected call", call_id))
            return True
        name = header.get("fn")
        function = config.functions.get(name) if isinstance(name, str) else None
        if function is None:
            served = ", ".join(sorted(config.functions))
            channel.send(_error("unknown_function", f"unknown function {name!r}: this worker serves {served}", call_id))
            return True
        try:
            tensors = wire.split_body(header.get("tensors", []), body)
            args = wire.decode(header.get("args", []), tensors)
            kwargs = wire.decode(header.get("kwargs", {}), tensors)
            if not isinstance(args, list) or not isinstance(kwargs, dict):
                raise ValueError("expected 'args' as a list and 'kwargs' as an object")
        except (ValueError, TypeError, RemoteError) as exc:
            channel.send(_error("bad_request", f"malformed call of {name}: {exc}", call_id))
            return True
        started = threading.Event()

        def run():
            started.set()
            return function(*args, **kwargs)

        future = config._pool.submit(run)
        # The time limit counts from when the call starts: a call waiting behind a slow one gets "busy" instead.
        if not started.wait(config.call_timeout) and future.cancel():
            message = f"busy: {name} waited {config.call_timeout:g} s for earlier calls that are still running"
            channel.send(_error("busy", message, call_id))
            return True
        try:
            result = future.result(timeout=config.call_timeout)
        except concurrent.futures.TimeoutError:
            channel.send(_error("timeout", f"{name} did not finish within {config.call_timeout:g} s", call_id))
            return True
        except Exception as exc:
            log.exception("%s failed", name)
            channel.send(_error("function_error", f"{name} failed: {type(exc).__name__}: {exc}", call_id))
            return True
        try:
            structure, out = wire.encode(result)
        except ValueError as exc:
            channel.send(_error("function_error", f"{name} returned what cannot be sent: {exc}", call_id))
            return True
        channel.send({"op": "result", "id": call_id, "value": structure}, out)
        return True


class WorkerServer(socketserver.ThreadingTCPServer):
    """A threaded TCP server for one :class:`WorkerConfig`; each connection gets its own thread."""

    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, address: tuple[str, int], config: WorkerConfig):
        self.config = config
        super().__init__(address, _Handler)


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``python -m hcs_remote.worker``."""
    parser = argparse.ArgumentParser(prog="python -m hcs_remote.worker", description=__doc__.split("\n\n")[0])
    parser.add_argument("--module", required=True, help="module whose @expose functions are served")
    parser.add_argument("--host", default="0.0.0.0", help="address to listen on (default: all)")
    parser.add_argument("--port", type=int, default=None, help="port to listen on (default: $HCS_PORT)")
    parser.add_argument("--max-payload-mib", type=float, default=wire.DEFAULT_MAX_PAYLOAD / (1 << 20))
    parser.add_argument("--call-timeout", type=float, default=300.0, help="seconds a call may run")
    parser.add_argument("--concurrency", type=int, default=1, help="calls running at once")
    parser.add_argument("--max-connections", type=int, default=16)
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
    if args.max_payload_mib <= 0 or args.call_timeout <= 0 or args.concurrency < 1 or args.max_connections < 1:
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
        functions=functions, key=key, project=os.environ.get("HCS_PROJECT", ""),
        max_payload=int(args.max_payload_mib * (1 << 20)), call_timeout=args.call_timeout,
        concurrency=args.concurrency, max_connections=args.max_connections,
    )  # fmt: skip
    with WorkerServer((args.host, int(port)), config) as server:
        host, bound = server.server_address[:2]
        # One line tests and people read: where the worker listens and what it serves.
        print(f"hcs_remote worker listening on {host}:{bound}, serving {', '.join(sorted(functions))}", flush=True)
        with contextlib.suppress(KeyboardInterrupt):
            server.serve_forever()
    return 0


if __name__ == "__main__":
    sys.exit(main())
