"""The remote-GPU client: call the functions a worker task of your project serves.

from hcs_remote import RemoteGPU
with RemoteGPU("10.0.0.7:9000") as gpu:      # key from HCS_REMOTE_GPU_KEY, project from HCS_PROJECT
    y = gpu.call("matmul", a, b)             # or gpu.matmul(a, b)
"""

from __future__ import annotations

import contextlib
import os
import re
import socket
import sys

from . import shm, wire
from .wire import Channel, RemoteError

ADDRESS_VARIABLE = "REMOTE_GPU_ADDRESS"  # a task variable (HCS_* names are the platform's)
CLOSE_WAIT = 2.0  # seconds close() waits for the worker to hang up after the goodbye
LOCAL_NAME = re.compile(r"hcs-remote-gpu-[0-9a-f]{32}")  # the unix socket names a worker offers


def parse_address(address: str) -> tuple[str, int]:
    """``host:port`` (``[v6]:port`` for IPv6) as a pair; ValueError saying what was expected."""
    host, sep, port = address.strip().rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"expected a worker address as host:port, got {address!r}")
    return host.strip("[]"), int(port)


class RemoteGPU:
    """A connection to one remote-GPU worker, authenticated with the project key; not thread-safe."""

    def __init__(
        self,
        address: str | None = None,
        *,
        key: str | None = None,
        project: str | None = None,
        timeout: float = 300.0,
        connect_timeout: float = 10.0,
        as_numpy: bool | None = None,
        max_result: int = 1 << 30,
        shared_memory: bool = True,
    ):
        address = address or os.environ.get(ADDRESS_VARIABLE, "")
        if not address:
            raise RemoteError("connection", f"no worker address: pass host:port or set {ADDRESS_VARIABLE}")
        raw_key = key if key is not None else os.environ.get("HCS_REMOTE_GPU_KEY", "")
        if not raw_key:
            raise RemoteError(
                "auth",
                "no HCS_REMOTE_GPU_KEY: the portal gives it to every task of a project; "
                "outside a task, pass key= (from a task of the worker's project)",
            )
        try:
            self._key = wire.parse_key(raw_key)
        except ValueError as exc:
            raise RemoteError("auth", str(exc))
        try:
            self.address = parse_address(address)
        except ValueError as exc:
            raise RemoteError("connection", str(exc))
        self.project = project if project is not None else os.environ.get("HCS_PROJECT", "")
        self.timeout = timeout
        self.as_numpy = as_numpy
        self._next_id = 0
        self._closed_because = ""
        try:
            sock = socket.create_connection(self.address, timeout=connect_timeout)
        except OSError as exc:
            raise RemoteError("connection", f"cannot reach the worker at {address}: {exc}")
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._channel = Channel(sock, "client", max_body=max_result)
        # "tcp", or "shared memory" once the connection moved to the worker's unix socket (same host).
        self.transport = "tcp"
        try:
            offer = self._handshake(connect_timeout)
        except BaseException:
            sock.close()
            raise
        if shared_memory and shm.AVAILABLE and isinstance(offer, dict):
            self._move_to_shared_memory(offer, max_result, connect_timeout)

    def _move_to_shared_memory(self, offer: dict, max_result: int, timeout: float) -> None:
        """Reach the worker's unix socket (only possible on its host) and authenticate there with the ticket
        the TCP connection was offered; on any failure the TCP connection stays, with the same calls."""
        name, ticket = offer.get("socket"), offer.get("ticket")
        if not isinstance(name, str) or not LOCAL_NAME.fullmatch(name) or not isinstance(ticket, str):
            return
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.settimeout(timeout)
            sock.connect("\0" + name)
        except OSError:  # another host (or network namespace): the name is not there
            sock.close()
            return
        tcp, self._channel = self._channel, Channel(sock, "client", max_body=max_result, local=True)
        try:
            self._handshake(timeout, ticket)
        except (RemoteError, OSError):
            self._channel.release()
            sock.close()
            self._channel, self._closed_because = tcp, ""
            return
        tcp.sock.close()
        self.transport = "shared memory"

    def _handshake(self, timeout: float, ticket: str | None = None) -> dict | None:
        """Authenticate both ways on the current channel; the worker's shared-memory offer, if it made one."""
        nonce = wire.new_nonce()
        self._channel.send({"op": "hello", "version": wire.PROTOCOL_VERSION, "nonce": nonce, "project": self.project})
        challenge = self._expect("challenge", timeout)
        worker_nonce = str(challenge.get("nonce", ""))
        expected = wire.proof(self._key, "worker", nonce, worker_nonce)
        if not wire.same_proof(challenge.get("proof"), expected):
            raise RemoteError(
                "auth",
                f"the worker at {self.address[0]}:{self.address[1]} could not prove it holds "
                "this project's key: wrong address, or a worker of another project",
            )
        self.worker_project = str(challenge.get("project", ""))
        auth = {"op": "auth", "proof": wire.proof(self._key, "client", nonce, worker_nonce)}
        self._channel.send({**auth, "ticket": ticket} if ticket else auth)
        self._channel.secure(wire.session_key(self._key, nonce, worker_nonce))
        ready = self._expect("ready", timeout)
        self.functions: dict[str, str] = {f["name"]: f.get("doc", "") for f in ready.get("functions", [])}
        self.max_payload = int(ready.get("max_payload", wire.DEFAULT_MAX_PAYLOAD))
        return ready.get("local")

    def _expect(self, op: str, timeout: float, call_id=None) -> dict:
        header, _ = self._receive(timeout)
        return self._checked(header, op, call_id)

    def _receive(self, timeout: float) -> tuple[dict, memoryview]:
        try:
            return self._channel.receive(timeout, timeout)
        except TimeoutError:
            # A late answer would be taken for the next call's: the connection cannot be used again.
            self._broken(f"no answer from the worker within {timeout:g} s")
            raise RemoteError("timeout", self._closed_because)
        except OSError as exc:
            self._broken(f"the connection to the worker broke: {exc}")
            raise RemoteError("connection", self._closed_because)
        except RemoteError as exc:
            self._broken(str(exc))
            raise

    def _broken(self, reason: str) -> None:
        self._closed_because = reason
        self._channel.sock.close()

    @staticmethod
    def _checked(header: dict, op: str, call_id=None) -> dict:
        if header.get("op") == "error":
            raise RemoteError(str(header.get("kind", "protocol")), str(header.get("error", "unknown error")))
        if header.get("op") != op or (call_id is not None and header.get("id") != call_id):
            raise RemoteError("protocol", f"expected {op} from the worker, got {header.get('op')!r}")
        return header

    def call(self, function: str, *args, **kwargs):
        """Call ``function`` on the worker with arrays and JSON values; its result, arrays as numpy arrays when
        numpy is installed (plain :class:`~hcs_remote.wire.Tensor` otherwise). RemoteError when refused or
        failed."""
        if self._closed_because:
            raise RemoteError("connection", f"the connection is closed ({self._closed_because}): open a new one")
        try:
            structure, tensors = wire.encode({"args": list(args), "kwargs": kwargs})
        except ValueError as exc:
            raise RemoteError("bad_request", str(exc))
        size = sum(t.data.nbytes for t in tensors)
        if size > self.max_payload:
            raise RemoteError(
                "too_large",
                f"the arguments' arrays are {size} bytes; the worker accepts at most {self.max_payload} per call",
            )
        self._next_id += 1
        call_id = self._next_id
        try:
            self._channel.send({"op": "call", "id": call_id, "fn": function, **structure}, tensors)
        except OSError as exc:
            self._broken(f"the connection to the worker broke: {exc}")
            raise RemoteError("connection", self._closed_because)
        header, body = self._receive(self.timeout)
        self._checked(header, "result", call_id)
        try:
            return wire.decode(header.get("value"), wire.split_body(header.get("tensors", []), body), self.as_numpy)
        except ValueError as exc:
            raise RemoteError("protocol", f"the worker's answer is malformed: {exc}")

    def __getattr__(self, name: str):
        if name.startswith("_") or name not in self.__dict__.get("functions", {}):
            raise AttributeError(name)
        return lambda *args, **kwargs: self.call(name, *args, **kwargs)

    def close(self) -> None:
        """Say goodbye and close the connection (arrays already received stay valid). Returns once the worker
        hung up (within 2 s): its place among the worker's callers is free then."""
        with contextlib.suppress(OSError, RemoteError):
            self._channel.send({"op": "bye"})
            self._channel.sock.settimeout(CLOSE_WAIT)
            while self._channel.sock.recv(4096):
                pass
        self._channel.sock.close()
        self._channel.release()

    def __enter__(self) -> RemoteGPU:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def main(argv: list[str] | None = None) -> int:
    """``python -m hcs_remote [host:port]``: check from a task that a worker answers and what it serves."""
    import argparse  # only the command line needs it

    parser = argparse.ArgumentParser(prog="python -m hcs_remote", description=main.__doc__)
    parser.add_argument("address", nargs="?", help=f"the worker's host:port (default: ${ADDRESS_VARIABLE})")
    args = parser.parse_args(argv)
    try:
        with RemoteGPU(args.address, timeout=30) as gpu:
            print(f"worker {gpu.address[0]}:{gpu.address[1]} of project {gpu.worker_project or '?'} serves:")
            for name, doc in sorted(gpu.functions.items()):
                print(f"  {name}" + (f": {doc}" if doc else ""))
    except RemoteError as exc:
        print(f"refused ({exc.kind}): {exc}", file=sys.stderr)
        return 1
    return 0
