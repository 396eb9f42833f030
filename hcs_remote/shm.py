"""Memory that arrays arrive in, reused instead of allocated per frame: a caller and a worker on one host share
segments, and every channel keeps buffers for the arrays it receives.

A *segment* is an anonymous memfd (no name in any filesystem) that its writer creates, sizes and seals against
shrinking and growing, maps, and passes once over the authenticated unix connection (SCM_RIGHTS); the reader
maps it too. The writer copies a frame's arrays into a free segment of its own and names it in the frame's
header; the reader's arrays are views of the segment, *lent* until every view of them is gone, and the next
frame the reader sends says which segments came back. The writer writes only segments that came back, so what
a reader holds never changes under it. See docs/remote-gpu.md (Same host: shared memory).
"""

from __future__ import annotations

import contextlib
import ctypes
import mmap
import os
import socket
import stat
import threading
import weakref
from collections import deque

try:
    import fcntl
except ImportError:  # pragma: no cover - not on Windows
    fcntl = None

# Whether this host can share memory with a peer: memfd with seals and descriptors over unix sockets (Linux).
AVAILABLE = (
    fcntl is not None
    and hasattr(os, "memfd_create")
    and hasattr(fcntl, "F_ADD_SEALS")
    and hasattr(socket, "AF_UNIX")
    and hasattr(socket, "SCM_RIGHTS")
)
SEALS = (fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_SEAL) if AVAILABLE else 0
SEGMENT_NAME = "hcs-remote-gpu"  # shown as memfd:hcs-remote-gpu in /proc/<pid>/maps; the file has no path
GRAIN = 1 << 20  # segment sizes are rounded up to this
KEEP_FREE = 1  # idle segments (or receive buffers) a connection keeps for reuse; more are unmapped
# Bytes of an end's own segments its peer may hold at once. A peer keeping every result would otherwise make
# this end keep (and be charged for) all of their memory; beyond it, arrays travel in the stream, into the
# peer's own memory, as over TCP.
MAX_LENT = 512 << 20
MAX_PEER_SEGMENTS = 64  # segments of the peer's one end maps at once


def _rounded(size: int) -> int:
    return -(-size // GRAIN) * GRAIN


class Lender:
    """Lends views of mappings and learns when every view of a loan is gone (a finalizer on the loan's owner)."""

    def __init__(self):
        self._returned: deque[int] = deque()  # finalizers run in whatever thread drops the last view
        self.lent: set[int] = set()

    def lend(self, ident: int, mapping: mmap.mmap, size: int) -> memoryview:
        """``size`` bytes of ``mapping`` as a view that keeps ``ident`` lent while it or any view of it lives."""
        owner = (ctypes.c_char * len(mapping)).from_buffer(mapping)  # whole mappings: few distinct ctypes types
        self.lent.add(ident)
        weakref.finalize(owner, self._returned.append, ident)
        return memoryview(owner).cast("B")[:size]

    def returned(self) -> list[int]:
        """The loans that came back since the last call."""
        done = []
        while self._returned:
            ident = self._returned.popleft()
            self.lent.discard(ident)
            done.append(ident)
        return done


def _unmap(mapping: mmap.mmap) -> None:
    """Unmap now, or (while a lent view still uses it) when that view goes."""
    with contextlib.suppress(BufferError):
        mapping.close()


class ReceiveBuffers:
    """Buffers that a socket connection's arrays are received into, reused once their arrays are gone: fresh
    memory costs a page fault per 4 KiB page, which is most of what a large frame would cost otherwise."""

    def __init__(self):
        self._lender = Lender()
        self._buffers: dict[int, mmap.mmap] = {}
        self._next = 0
        self._lock = threading.Lock()

    def take(self, size: int) -> memoryview:
        """A writable view of ``size`` bytes that no earlier loan still uses."""
        with self._lock:
            self._lender.returned()
            free = [(len(m), i) for i, m in self._buffers.items() if i not in self._lender.lent and len(m) >= size]
            if free:
                ident = min(free)[1]
            else:
                self._next += 1
                ident = self._next
                self._buffers[ident] = mmap.mmap(-1, _rounded(size))
            idle = [i for i in self._buffers if i not in self._lender.lent and i != ident]
            for extra in idle[: max(0, len(idle) - KEEP_FREE)]:
                _unmap(self._buffers.pop(extra))
            return self._lender.lend(ident, self._buffers[ident], size)

    def close(self) -> None:
        with self._lock:
            for mapping in self._buffers.values():
                _unmap(mapping)
            self._buffers.clear()


class Segments:
    """The shared segments of one local connection: those this end writes (its own) and those it reads (the
    peer's). Not thread-safe: a channel's sends and receives each run in one thread at a time."""

    def __init__(self, max_size: int):
        self.max_size = _rounded(max_size) if max_size else 0  # a peer's segment larger than this is refused
        self._own: dict[int, mmap.mmap] = {}
        self._own_lent: set[int] = set()
        self._dropped: list[int] = []  # own segments unmapped: the peer may unmap them too
        self._next = 0
        self._peer: dict[int, mmap.mmap] = {}
        self._lender = Lender()

    # --- writing ---------------------------------------------------------------------------------------------

    def place(self, chunks: list[memoryview], size: int) -> tuple[int, int | None] | None:
        """Copy ``chunks`` (``size`` bytes) into a free segment of this end: its id, and a descriptor to pass
        along when the peer does not have the segment yet (the caller closes it once sent); None when the peer
        holds :data:`MAX_LENT` bytes of this end's segments already."""
        free = [(len(m), i) for i, m in self._own.items() if i not in self._own_lent and len(m) >= size]
        lent = sum(len(self._own[i]) for i in self._own_lent)
        if lent + (min(free)[0] if free else _rounded(size)) > MAX_LENT:
            return None
        fd = None
        if free:
            ident = min(free)[1]
        else:
            fd = os.memfd_create(SEGMENT_NAME, os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
            try:
                os.ftruncate(fd, _rounded(size))
                fcntl.fcntl(fd, fcntl.F_ADD_SEALS, SEALS)  # the peer maps it: it must never shrink under the peer
                mapping = mmap.mmap(fd, _rounded(size))
            except BaseException:
                os.close(fd)
                raise
            self._next += 1
            ident = self._next
            self._own[ident] = mapping
        view, offset = memoryview(self._own[ident]), 0
        for chunk in chunks:
            view[offset : offset + chunk.nbytes] = chunk
            offset += chunk.nbytes
        view.release()
        self._own_lent.add(ident)
        return ident, fd

    def came_back(self, idents: object) -> None:
        """The peer is done with these segments of this end: they may be written again."""
        if not isinstance(idents, list) or not all(type(i) is int for i in idents):
            raise ValueError("expected 'returned' as a list of segment numbers")
        self._own_lent.difference_update(idents)
        idle = [i for i in self._own if i not in self._own_lent]
        for extra in idle[: max(0, len(idle) - KEEP_FREE)]:
            _unmap(self._own.pop(extra))
            self._dropped.append(extra)

    def notices(self) -> dict:
        """What the next frame tells the peer: its segments this end is done with, and this end's it may unmap."""
        notes = {}
        if returned := self._lender.returned():
            notes["returned"] = returned
        if self._dropped:
            notes["dropped"], self._dropped = self._dropped, []
        return notes

    # --- reading ---------------------------------------------------------------------------------------------

    def add(self, ident: object, fd: int) -> None:
        """Map the peer's new segment ``ident`` from ``fd`` (closed here), once it is shown to be a segment
        that cannot shrink; ValueError otherwise."""
        try:
            if type(ident) is not int or ident in self._peer:
                raise ValueError(f"segment {ident!r} is no new segment number")
            if len(self._peer) >= MAX_PEER_SEGMENTS:
                raise ValueError(f"the peer shares more than {MAX_PEER_SEGMENTS} segments")
            info = os.fstat(fd)
            if not stat.S_ISREG(info.st_mode):
                raise ValueError("the descriptor passed is no memory segment")
            try:
                seals = fcntl.fcntl(fd, fcntl.F_GET_SEALS)
            except OSError:
                raise ValueError("the descriptor passed is no sealable memory segment (memfd)")
            if seals & SEALS != SEALS:
                raise ValueError("the segment passed can still shrink or grow: it must be sealed against both")
            if not 0 < info.st_size <= self.max_size:
                raise ValueError(f"a segment of {info.st_size} bytes; this end maps at most {self.max_size}")
            self._peer[ident] = mmap.mmap(fd, info.st_size)
        finally:
            os.close(fd)

    def forget(self, idents: object) -> None:
        """The peer unmapped these segments of its own: unmap them here too."""
        if not isinstance(idents, list) or not all(type(i) is int for i in idents):
            raise ValueError("expected 'dropped' as a list of segment numbers")
        for ident in idents:
            if ident in self._lender.lent:
                raise ValueError(f"segment {ident} was dropped while this end still uses it")
            if (mapping := self._peer.pop(ident, None)) is not None:
                _unmap(mapping)

    def borrow(self, ident: object, size: int) -> memoryview:
        """The first ``size`` bytes of the peer's segment ``ident``, lent until every view of them is gone."""
        mapping = self._peer.get(ident) if type(ident) is int else None
        if mapping is None:
            raise ValueError(f"the frame names segment {ident!r}, which the peer never passed")
        if ident in self._lender.lent:
            raise ValueError(f"the peer wrote segment {ident} while this end still uses it")
        if size > len(mapping):
            raise ValueError(f"the frame needs {size} bytes of segment {ident}, which has {len(mapping)}")
        return self._lender.lend(ident, mapping, size)

    def close(self) -> None:
        """Unmap every segment (those still lent go when their last view does)."""
        for mapping in [*self._own.values(), *self._peer.values()]:
            _unmap(mapping)
        self._own.clear()
        self._peer.clear()
