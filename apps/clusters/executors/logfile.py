"""Reading a job's output file for a follower: a byte offset is the cursor, so each read returns only what
was written since the last one, however long the log grows.

The local executor's ``output.log`` and Slurm's output files are only ever appended to; an offset past
the end means the file was replaced, and the read starts again from the beginning.
"""

from __future__ import annotations

import codecs
import os
from pathlib import Path

from .base import LOG_CHUNK_BYTES, LogChunk

_PREFIX = "o"


def _offset(cursor: str) -> int:
    """The byte offset in a cursor written by :func:`read_log_file`; ValueError for anything else."""
    if not cursor.startswith(_PREFIX) or not cursor[1:].isdigit():
        raise ValueError("not a byte-offset cursor")
    return int(cursor[1:])


def _whole_characters(data: bytes) -> int:
    """How many leading bytes of ``data`` are whole UTF-8 characters (a read may end inside one)."""
    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
    decoder.decode(data, final=False)
    return len(data) - len(decoder.getstate()[0])


def _tail_start(fh, end: int, tail: int) -> int:
    """The offset where the last ``tail`` lines before ``end`` begin, read backwards in blocks."""
    pos, newlines = end, 0
    while pos > 0:
        step = min(8192, pos)
        fh.seek(pos - step)
        block = fh.read(step)
        # A newline that ends the file ends the last line; it does not start one.
        if pos == end and block.endswith(b"\n"):
            block = block[:-1]
        for index in range(len(block) - 1, -1, -1):
            if block[index] == 0x0A:
                newlines += 1
                if newlines == tail:
                    return pos - step + index + 1
        pos -= step
    return 0


def read_log_file(path: Path, *, after: str | None = None, tail: int = 200) -> LogChunk:
    """``after`` None: the last ``tail`` lines; "": from the start; a cursor: what was written since.

    At most ``LOG_CHUNK_BYTES`` per read (``more`` is then true); a missing file reads as empty, with a
    cursor at its start.
    """
    start = None if after is None else (_offset(after) if after else 0)
    try:
        with path.open("rb") as fh:
            end = fh.seek(0, os.SEEK_END)
            if start is None:
                start = _tail_start(fh, end, tail) if tail > 0 else end
                # The last lines, but never more than a chunk of them: their end matters, not their start.
                start = max(start, end - LOG_CHUNK_BYTES)
            elif start > end:
                start = 0  # the file was replaced
            fh.seek(start)
            data = fh.read(min(end - start, LOG_CHUNK_BYTES))
    except FileNotFoundError:
        return LogChunk("", f"{_PREFIX}0")
    more = start + len(data) < end
    data = data[: _whole_characters(data)]  # a character cut in two comes whole with the next read
    return LogChunk(data.decode("utf-8", errors="replace"), f"{_PREFIX}{start + len(data)}", more)
