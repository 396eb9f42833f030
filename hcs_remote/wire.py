"""The remote-GPU wire format: authenticated frames of a JSON header and raw array bytes, nothing that can
carry code.

A frame is ``HCSR`` + header length (uint32) + body length (uint64), big-endian, then the header (UTF-8
JSON object), the body (the bytes of the frame's arrays, back to back), and after the handshake a 32-byte
HMAC-SHA256 of the frame under the connection's session key, bound to the frame's direction and sequence
number. Arrays are declared in the header (``{"dtype": "float32", "shape": [2, 3]}``, little-endian,
C order); values travel as JSON with ``{"$tensor": i}`` standing for the i-th array. Decoding checks every
declaration against the bytes before anything is built. See docs/remote-gpu.md.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import hmac
import json
import math
import os
import secrets
import socket
import struct
import sys
from array import array
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass

from . import shm

MAGIC = b"HCSR"
PROTOCOL_VERSION = 1
PREFIX = struct.Struct(">4sIQ")
MAC_SIZE = 32
MAX_HEADER_BYTES = 1 << 20  # JSON arguments are small; arrays go in the body
HANDSHAKE_HEADER_BYTES = 4096  # what a peer may send before it authenticated (and no arrays at all)
MAX_NDIM = 32
MAX_TENSORS = 1024
DEFAULT_MAX_PAYLOAD = 256 << 20
SMALL_FRAME = 64 << 10  # frames with at most this many array bytes are sent in one write
READ_AHEAD = 64 << 10  # bytes a small read asks for at once
IOV_MAX = 512  # buffers one sendmsg takes (Linux allows 1,024)
MAX_PENDING_FDS = 4  # descriptors a local peer may pass ahead of the frames that claim them
FD_SPACE = socket.CMSG_SPACE(MAX_PENDING_FDS * 4) if hasattr(socket, "CMSG_SPACE") else 0

# dtype name -> (bytes per element, memoryview/array format code). Plain numbers only: no object, string or
# structured dtypes, so a decoded value is always inert data.
DTYPES: dict[str, tuple[int, str]] = {
    "bool": (1, "?"),
    "int8": (1, "b"),
    "uint8": (1, "B"),
    "int16": (2, "h"),
    "uint16": (2, "H"),
    "int32": (4, "i"),
    "uint32": (4, "I"),
    "int64": (8, "q"),
    "uint64": (8, "Q"),
    "float16": (2, "e"),
    "float32": (4, "f"),
    "float64": (8, "d"),
}
# array.array type codes whose size is fixed on every supported platform.
_ARRAY_CODES = {
    "b": "int8",
    "B": "uint8",
    "h": "int16",
    "H": "uint16",
    "i": "int32",
    "I": "uint32",
    "q": "int64",
    "Q": "uint64",
    "f": "float32",
    "d": "float64",
}

if sys.byteorder != "little":  # pragma: no cover - every platform the portal runs GPUs on is little-endian
    raise ImportError("hcs_remote needs a little-endian host: arrays travel little-endian without conversion")


class RemoteError(Exception):
    """A refused or failed remote call; ``kind`` says which (auth, unknown_function, bad_request, too_large,
    timeout, function_error, busy, protocol, connection)."""

    def __init__(self, kind: str, message: str):
        super().__init__(message)
        self.kind = kind


@dataclass(frozen=True)
class Tensor:
    """A plain array: dtype name, shape and its bytes (little-endian, C order). Used where numpy is absent."""

    dtype: str
    shape: tuple[int, ...]
    data: memoryview

    @classmethod
    def from_values(cls, values: Iterable, dtype: str = "float64", shape: Iterable[int] | None = None) -> Tensor:
        """A tensor of ``dtype`` from a flat sequence of numbers, 1-D unless ``shape`` says otherwise."""
        if dtype not in DTYPES:
            raise ValueError(f"unknown dtype {dtype!r}: expected one of {', '.join(DTYPES)}")
        flat = list(values)
        try:
            data = struct.pack(f"<{len(flat)}{DTYPES[dtype][1]}", *flat)
        except struct.error as exc:
            raise ValueError(f"values that are no {dtype}: {exc}")
        return cls.checked(dtype, tuple(shape) if shape is not None else (len(flat),), memoryview(data))

    @classmethod
    def checked(cls, dtype: str, shape: tuple[int, ...], data: memoryview) -> Tensor:
        """A tensor whose declaration is checked against its bytes; ValueError saying what was expected."""
        expected = check_declaration({"dtype": dtype, "shape": list(shape)})
        if data.nbytes != expected:
            raise ValueError(f"a {dtype} array of shape {list(shape)} needs {expected} bytes, got {data.nbytes}")
        return cls(dtype, tuple(shape), data)

    @property
    def size(self) -> int:
        return math.prod(self.shape)

    def flat(self) -> list:
        """The elements as one flat Python list, in C order."""
        code = DTYPES[self.dtype][1]
        if code == "e":  # memoryview cannot cast to half floats; struct can read them
            return list(struct.unpack(f"<{self.size}e", self.data))
        return self.data.cast("B").cast(code).tolist()

    def tolist(self) -> list:
        """The elements as nested Python lists, in C order (a number for a 0-d tensor)."""
        flat = self.flat()
        return _nest(flat, self.shape) if self.shape else flat[0]


def _nest(flat: list, shape: tuple[int, ...]) -> list:
    if len(shape) <= 1:
        return flat
    step = math.prod(shape[1:])
    return [_nest(flat[i * step : (i + 1) * step], shape[1:]) for i in range(shape[0])]


def check_declaration(declared: object) -> int:
    """The byte size a declared array needs; ValueError when its dtype or shape is not a plain array's."""
    if not isinstance(declared, dict) or set(declared) != {"dtype", "shape"}:
        raise ValueError('expected an array declaration {"dtype": ..., "shape": [...]}')
    dtype, shape = declared["dtype"], declared["shape"]
    if not isinstance(dtype, str) or dtype not in DTYPES:
        raise ValueError(f"unsupported dtype {dtype!r}: expected one of {', '.join(DTYPES)}")
    if not isinstance(shape, list) or len(shape) > MAX_NDIM:
        raise ValueError(f"expected a shape as a list of at most {MAX_NDIM} sizes, got {shape!r}")
    if not all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape):
        raise ValueError(f"expected a shape of non-negative integers, got {shape!r}")
    return math.prod(shape) * DTYPES[dtype][0]


# --- values <-> header + body ----------------------------------------------------------------------------------


@functools.cache  # a failed import searches the whole path again each time: once per process is enough
def _numpy():
    try:
        import numpy  # optional: plain Tensors work without it
    except ImportError:
        return None
    return numpy


def _as_tensor(value) -> Tensor | None:
    """``value`` as a Tensor when it is an array (Tensor, numpy array, array.array); None for other values."""
    if isinstance(value, Tensor):
        return value
    if isinstance(value, array):
        if value.typecode not in _ARRAY_CODES:
            raise ValueError(f"array.array of type {value.typecode!r} has no fixed-size dtype")
        return Tensor(_ARRAY_CODES[value.typecode], (len(value),), memoryview(value).cast("B"))
    np = _numpy()
    if np is not None and isinstance(value, np.ndarray | np.generic):
        value = np.asarray(value)
        name = value.dtype.name
        if name not in DTYPES:
            kinds = ", ".join(DTYPES)
            raise ValueError(f"numpy dtype {value.dtype} cannot be sent: only plain numeric arrays ({kinds})")
        if value.dtype.byteorder == ">":
            value = value.astype(value.dtype.newbyteorder("<"))
        if not value.flags.c_contiguous:  # (np.ascontiguousarray would turn a 0-d array into a 1-d one)
            value = value.copy(order="C")
        return Tensor(name, tuple(int(d) for d in value.shape), memoryview(value.reshape(-1).view(np.uint8)))
    return None


def encode(value) -> tuple[object, list[Tensor]]:
    """Split ``value`` (arrays, JSON values, lists/tuples/dicts of them) into a JSON structure and its arrays."""
    tensors: list[Tensor] = []
    return _encoded(value, tensors), tensors


# The walks are module functions, not nested ones: a nested function calling itself is a reference cycle, which
# would keep the arrays it saw (and the shared memory under them) alive until the garbage collector runs.
def _encoded(item, tensors: list[Tensor]):
    tensor = _as_tensor(item)
    if tensor is not None:
        tensors.append(tensor)
        return {"$tensor": len(tensors) - 1}
    if item is None or isinstance(item, bool | int | float | str):
        return item
    if isinstance(item, list | tuple):
        return [_encoded(x, tensors) for x in item]
    if isinstance(item, dict):
        if not all(isinstance(k, str) for k in item) or "$tensor" in item:
            raise ValueError("expected dicts with string keys other than '$tensor'")
        return {k: _encoded(v, tensors) for k, v in item.items()}
    raise ValueError(
        f"cannot send a {type(item).__name__}: expected arrays, numbers, strings, booleans, None, "
        "or lists and dicts of them"
    )


def decode(structure: object, tensors: list[Tensor], as_numpy: bool | None = None):
    """Rebuild a value from its JSON structure, arrays as numpy arrays (when numpy is there) or Tensors."""
    np = _numpy() if as_numpy is not False else None
    if as_numpy and np is None:
        raise RemoteError("protocol", "numpy is not installed: pass as_numpy=False for plain Tensors")
    built: list = [None] * len(tensors)
    return _decoded(structure, tensors, built, np)


def _decoded(item, tensors: list[Tensor], built: list, np):
    if isinstance(item, list):
        return [_decoded(x, tensors, built, np) for x in item]
    if not isinstance(item, dict):
        return item
    if "$tensor" not in item:
        return {k: _decoded(v, tensors, built, np) for k, v in item.items()}
    index = item["$tensor"]
    if set(item) != {"$tensor"} or type(index) is not int or not 0 <= index < len(tensors):
        raise ValueError(f"a tensor reference names array {index!r}; the frame has {len(tensors)}")
    if built[index] is None:  # an array referenced twice is one array
        t = tensors[index]
        built[index] = np.frombuffer(t.data, dtype=np.dtype(t.dtype)).reshape(t.shape) if np else t
    return built[index]


def split_body(declared: object, body: memoryview) -> list[Tensor]:
    """The arrays a header declares, cut from ``body``; ValueError unless they account for every byte."""
    if not isinstance(declared, list) or len(declared) > MAX_TENSORS:
        raise ValueError(f"expected 'tensors' as a list of at most {MAX_TENSORS} declarations")
    sizes = [check_declaration(d) for d in declared]
    if sum(sizes) != body.nbytes:
        raise ValueError(f"the declared arrays need {sum(sizes)} bytes, the frame carries {body.nbytes}")
    tensors, offset = [], 0
    for d, size in zip(declared, sizes, strict=True):
        tensors.append(Tensor(d["dtype"], tuple(d["shape"]), body[offset : offset + size]))
        offset += size
    return tensors


# --- framing and authentication --------------------------------------------------------------------------------


def _label(*parts: str) -> bytes:
    return "|".join(("hcs-remote-gpu/v1", *parts)).encode()


def proof(key: bytes, role: str, client_nonce: str, worker_nonce: str) -> str:
    """What ``role`` (client or worker) shows to prove it holds the project key, bound to both nonces."""
    return hmac.new(key, _label(role, client_nonce, worker_nonce), hashlib.sha256).hexdigest()


def same_proof(given: object, expected: str) -> bool:
    """Whether a proof received (any JSON value) is the expected one, compared in constant time."""
    return isinstance(given, str) and hmac.compare_digest(given.encode(), expected.encode())


def session_key(key: bytes, client_nonce: str, worker_nonce: str) -> bytes:
    """The key that authenticates every frame of one connection after the handshake."""
    return hmac.new(key, _label("session", client_nonce, worker_nonce), hashlib.sha256).digest()


def new_nonce() -> str:
    return secrets.token_hex(16)


def parse_key(text: str) -> bytes:
    """The project key from its hex form (HCS_REMOTE_GPU_KEY); ValueError when it is not one."""
    try:
        key = bytes.fromhex(text.strip())
    except ValueError:
        raise ValueError("expected HCS_REMOTE_GPU_KEY as hexadecimal digits")
    if len(key) < 16:
        raise ValueError("expected HCS_REMOTE_GPU_KEY of at least 16 bytes")
    return key


@dataclass
class Staged:
    """A frame's arrays ready to go: their declarations, and their bytes either as chunks of the arrays' own
    memory or copied into a shared segment (``segment``, with ``fd`` to pass when the peer lacks it)."""

    declarations: list[dict]
    chunks: list[memoryview]
    segment: dict | None = None
    fd: int | None = None


class Channel:
    """One end of a connection: sends and receives frames, with their MACs once :meth:`secure` was called.

    A *local* channel runs over a unix socket to a peer on the same host: once secured, frames carrying more
    than :data:`SMALL_FRAME` bytes of arrays put them in shared segments (:mod:`hcs_remote.shm`) instead of the
    stream, and the frame names the segment."""

    def __init__(self, sock: socket.socket, role: str, max_body: int = DEFAULT_MAX_PAYLOAD, local: bool = False):
        self.sock = sock
        # Until the handshake is done the peer is unknown: it may send small headers only, so a stranger
        # cannot make this end allocate a payload's worth of memory per connection.
        self.max_body, self.max_header = 0, HANDSHAKE_HEADER_BYTES
        self._limits = max_body, MAX_HEADER_BYTES
        self._out_tag, self._in_tag = (b"C", b"W") if role == "client" else (b"W", b"C")
        self._key: bytes | None = None
        self._sent = self._received = 0
        self._buffered = bytearray()
        self.local = local
        self.segments = shm.Segments(max_body) if local else None
        self._fds: deque[int] = deque()  # descriptors the peer passed, in order, until a frame claims them
        self._buffers = shm.ReceiveBuffers()

    def secure(self, key: bytes) -> None:
        """Authenticate every later frame with ``key``; the peer proved who it is, so the full limits apply."""
        self._key = key
        self.max_body, self.max_header = self._limits

    def _mac(self, tag: bytes, seq: int, parts: Iterable[bytes | memoryview]) -> bytes:
        mac = hmac.new(self._key, tag + seq.to_bytes(8, "big"), hashlib.sha256)
        for part in parts:
            mac.update(part)
        return mac.digest()

    def stage(self, tensors: list[Tensor]) -> Staged:
        """Ready ``tensors`` to send: on a secured local channel, large ones are copied into a shared segment
        now (while the peer holds less than :data:`shm.MAX_LENT` of this end's), so the caller may drop its
        arrays (and the peer's segments they view) before the frame goes."""
        declarations = [{"dtype": t.dtype, "shape": list(t.shape)} for t in tensors]
        chunks = [t.data.cast("B") for t in tensors]
        size = sum(c.nbytes for c in chunks)
        placed = None
        if self.segments is not None and self._key is not None and size > SMALL_FRAME:
            placed = self.segments.place(chunks, size)
        if placed is None:
            return Staged(declarations, chunks)
        ident, fd = placed
        named = {"segment": ident, "size": size, **({"new": True} if fd is not None else {})}
        return Staged(declarations, [], named, fd)

    def send(self, header: dict, tensors: list[Tensor] | Staged = ()) -> None:
        """Send one frame: the header (with the arrays' declarations added) and the arrays' bytes."""
        staged = tensors if isinstance(tensors, Staged) else self.stage(list(tensors))
        try:
            self._send(header, staged)
        finally:
            if staged.fd is not None:
                os.close(staged.fd)
                staged.fd = None

    def _send(self, header: dict, staged: Staged) -> None:
        extra: dict = {"tensors": staged.declarations} if staged.declarations else {}
        if staged.segment is not None:
            extra["shm"] = staged.segment
        if self.segments is not None and self._key is not None:
            extra.update(self.segments.notices())
        header = {**header, **extra} if extra else header
        head = json.dumps(header, separators=(",", ":")).encode()
        if len(head) > MAX_HEADER_BYTES:
            raise RemoteError("too_large", f"the JSON part is {len(head)} bytes; at most {MAX_HEADER_BYTES}")
        chunks = staged.chunks
        body_size = sum(c.nbytes for c in chunks)
        prefix = PREFIX.pack(MAGIC, len(head), body_size)
        mac = [self._mac(self._out_tag, self._sent, [prefix, head, *chunks])] if self._key is not None else []
        if staged.fd is not None or body_size > SMALL_FRAME:  # arrays go out from their own memory, never copied
            self._send_parts([prefix, head, *chunks, *mac], staged.fd)
        else:  # one write: no extra packets or syscalls per piece
            self.sock.sendall(b"".join([prefix, head, *chunks, *mac]))
        if self._key is not None:
            self._sent += 1

    def _send_parts(self, parts: list, fd: int | None) -> None:
        """Send ``parts`` with as few system calls as the kernel allows, ``fd`` passed with the first byte."""
        views = [memoryview(p).cast("B") for p in parts if len(p)]
        ancillary = [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array("i", [fd]))] if fd is not None else []
        while views:
            sent = self.sock.sendmsg(views[:IOV_MAX], ancillary)
            ancillary = []
            while views and sent >= views[0].nbytes:
                sent -= views.pop(0).nbytes
            if sent:
                views[0] = views[0][sent:]

    def _recv_into(self, view: memoryview) -> int:
        if not self.local:
            n = self.sock.recv_into(view)
        else:
            n, ancillary, flags, _ = self.sock.recvmsg_into([view], FD_SPACE)
            self._keep_fds(ancillary, flags)
        if n == 0:
            raise RemoteError("connection", "the other end closed the connection")
        return n

    def _keep_fds(self, ancillary: list, flags: int) -> None:
        """Keep the descriptors a local peer passed; refuse them before the handshake or beyond a few."""
        for level, kind, data in ancillary:
            if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                self._fds.extend(array("i", data[: len(data) - len(data) % 4]))
        if self._fds and (self._key is None or len(self._fds) > MAX_PENDING_FDS or flags & socket.MSG_CTRUNC):
            self.release()
            if self._key is None:
                raise RemoteError("auth", "authenticate first: no arrays before the handshake")
            raise RemoteError("protocol", f"the peer passed more than {MAX_PENDING_FDS} descriptors at once")

    def _read_exact(self, size: int, into: memoryview | None = None, mac=None) -> memoryview:
        view = memoryview(bytearray(size)) if into is None else into
        got = 0
        while got < size:
            if self._buffered:  # what an earlier read took beyond its frame part
                n = min(len(self._buffered), size - got)
                view[got : got + n] = self._buffered[:n]
                del self._buffered[:n]
            elif size - got >= READ_AHEAD:  # large parts land in their buffer directly
                n = self._recv_into(view[got:])
            else:  # small parts: one read usually brings the prefix, header and MAC together
                chunk = bytearray(READ_AHEAD)
                self._buffered += chunk[: self._recv_into(memoryview(chunk))]
                continue
            if mac is not None:  # hashed as it lands, while it is still in the cache
                mac.update(view[got : got + n])
            got += n
        return view

    def receive(self, idle_timeout: float | None = None, io_timeout: float | None = None) -> tuple[dict, memoryview]:
        """The next frame's header and body. RemoteError (protocol, too_large, auth) for a frame that breaks
        the format, exceeds the limits or fails its MAC; the body is not read when it is too large."""
        self.sock.settimeout(idle_timeout)
        prefix = self._read_exact(PREFIX.size)
        self.sock.settimeout(io_timeout)
        magic, head_len, body_len = PREFIX.unpack(prefix)
        if magic != MAGIC:
            raise RemoteError("protocol", "not a remote-GPU frame: expected the HCSR protocol")
        if head_len > self.max_header:
            when = "" if self._key else " before authentication"
            raise RemoteError(
                "too_large", f"the JSON part is {head_len} bytes; this end accepts at most {self.max_header}{when}"
            )
        if body_len > self.max_body:
            if self._key is None:
                raise RemoteError("auth", "authenticate first: no arrays before the handshake")
            raise RemoteError("too_large", f"the arrays are {body_len} bytes; this end accepts at most {self.max_body}")
        mac = None
        if self._key is not None:
            mac = hmac.new(self._key, self._in_tag + self._received.to_bytes(8, "big"), hashlib.sha256)
            mac.update(prefix)
        head = self._read_exact(head_len, mac=mac)
        body = memoryview(b"")
        if body_len:  # large bodies land in a reused buffer: fresh memory would cost a page fault per page
            body = self._read_exact(body_len, self._buffers.take(body_len) if body_len > SMALL_FRAME else None, mac)
        if mac is not None:
            if not hmac.compare_digest(self._read_exact(MAC_SIZE), mac.digest()):
                raise RemoteError("auth", "a frame failed its authentication check (tampered or out of order)")
            self._received += 1
        try:
            header = json.loads(bytes(head))
        except (ValueError, RecursionError):
            raise RemoteError("protocol", "the frame's header is not valid JSON")
        if not isinstance(header, dict):
            raise RemoteError("protocol", "expected the frame's header to be a JSON object")
        if "shm" in header or (self.segments is not None and self._key is not None):
            body = self._shared(header, body)
        return header, body

    def _shared(self, header: dict, body: memoryview) -> memoryview:
        """Take the shared-memory notes out of a local frame's header; the body, from a segment if it names one."""
        if self.segments is None or self._key is None:
            raise RemoteError("protocol", "a frame names a shared segment on a connection that shares no memory")
        try:
            if "returned" in header:
                self.segments.came_back(header.pop("returned"))
            if "dropped" in header:
                self.segments.forget(header.pop("dropped"))
            if "shm" not in header:
                return body
            named = header.pop("shm")
            if not isinstance(named, dict) or set(named) - {"segment", "size", "new"} or body.nbytes:
                raise ValueError("expected 'shm' as {segment, size, new} and no arrays in the stream")
            size = named.get("size")
            if type(size) is not int or size < 0:
                raise ValueError(f"expected a segment's size in bytes, got {size!r}")
            if size > self.max_body:
                raise RemoteError("too_large", f"the arrays are {size} bytes; this end accepts at most {self.max_body}")
            if named.get("new"):
                if not self._fds:
                    raise ValueError("the frame announces a new segment but passed none")
                self.segments.add(named.get("segment"), self._fds.popleft())
            return self.segments.borrow(named.get("segment"), size)
        except ValueError as exc:
            raise RemoteError("protocol", f"a shared-memory frame is malformed: {exc}")

    def release(self) -> None:
        """Unmap this channel's segments and buffers and close descriptors not claimed yet (at its end)."""
        while self._fds:
            with contextlib.suppress(OSError):
                os.close(self._fds.popleft())
        if self.segments is not None:
            self.segments.close()
        self._buffers.close()
