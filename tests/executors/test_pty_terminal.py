"""The pseudo-terminal every console runs on, without Django or a job."""

from __future__ import annotations

import signal
import time

from apps.clusters.executors.terminal import PtyTerminal


def test_a_console_gets_every_signal_at_its_default_whatever_the_portal_ignores():
    # A portal started in the background ignores SIGINT and SIGQUIT; a console's Ctrl-C must still stop its command.
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN), signal.signal(signal.SIGQUIT, signal.SIG_IGN)
    try:
        terminal = PtyTerminal(["/bin/sh", "-c", "grep SigIgn /proc/self/status"])
    finally:
        signal.signal(signal.SIGINT, previous[0])
        signal.signal(signal.SIGQUIT, previous[1])
    output, deadline = b"", time.monotonic() + 10
    try:
        while b"\n" not in output.partition(b"SigIgn:")[2] and time.monotonic() < deadline:
            output += terminal.read(0.2) or b""
    finally:
        terminal.close()
    ignored = int(output.partition(b"SigIgn:")[2].split()[0], 16)
    assert ignored & (1 << (signal.SIGINT - 1)) == 0
    assert ignored & (1 << (signal.SIGQUIT - 1)) == 0
