"""A shell on a pseudo-terminal of this host: the Web Console of local jobs and of Slurm's ``srun --pty``.

The portal keeps the master side; the program on the slave side runs in its own session, started
with a fixed, trusted environment (never the portal's). Whatever runs the shell inside the job
(``nsenter`` into the local sandbox, ``srun --pty`` into a Slurm allocation) is the program's business.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import select
import signal
import struct
import subprocess
import termios
import threading
from collections.abc import Sequence

from .base import ExecutorError, Terminal
from .sandbox import DEFAULT_SIGNALS, TRUSTED_ENV

# Terminal sizes are bounded: a client cannot ask the kernel (or a remote shell) for a huge window.
MAX_ROWS, MAX_COLS = 500, 1000
_READ_CHUNK = 65536
# How long a hung-up shell gets to end before its session is killed.
_HANGUP_GRACE_S = 2.0


def clamp_size(rows: int, cols: int) -> tuple[int, int]:
    """A terminal size within 1..MAX_ROWS x 1..MAX_COLS."""
    return max(1, min(int(rows), MAX_ROWS)), max(1, min(int(cols), MAX_COLS))


def set_window_size(fd: int, rows: int, cols: int) -> None:
    """Tell the terminal its size; the kernel sends SIGWINCH to the foreground program."""
    rows, cols = clamp_size(rows, cols)
    fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))


class PtyTerminal(Terminal):
    """``argv`` on a new pseudo-terminal, in a session of its own; the portal reads and writes the master side."""

    def __init__(self, argv: Sequence[str], rows: int = 24, cols: int = 80, env: dict[str, str] | None = None):
        master, slave = os.openpty()
        try:
            set_window_size(slave, rows, cols)
            self.process = subprocess.Popen(
                [*DEFAULT_SIGNALS, *argv],
                stdin=slave,
                stdout=slave,
                stderr=slave,
                env=env if env is not None else TRUSTED_ENV,
                cwd="/",
                start_new_session=True,
                close_fds=True,
            )
        except OSError as exc:
            os.close(master)
            raise ExecutorError(f"cannot start a terminal: {exc}", retryable=False)
        finally:
            os.close(slave)
        self.master = master
        self._closed = False
        self._lock = threading.Lock()

    def read(self, timeout: float) -> bytes | None:
        if self._closed:
            return b""
        try:
            ready, _, _ = select.select([self.master], [], [], timeout)
            if not ready:
                return None
            return os.read(self.master, _READ_CHUNK)
        except (OSError, ValueError):  # EIO: every program on the slave side has gone
            return b""

    def write(self, data: bytes) -> None:
        view = memoryview(data)
        while view and not self._closed:
            try:
                written = os.write(self.master, view)
            except BlockingIOError:
                select.select([], [self.master], [], 1.0)
                continue
            except OSError:
                return  # the shell ended; read() says so
            view = view[written:]

    def resize(self, rows: int, cols: int) -> None:
        if not self._closed:
            set_window_size(self.master, rows, cols)

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
        # Closing the master hangs up the shell's session; the launcher's own session is then ended too.
        os.close(self.master)
        try:
            self.process.wait(_HANGUP_GRACE_S)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()
