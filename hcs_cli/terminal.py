"""``hcs exec``: the Web Console's socket (``ws/tasks/<id>/terminal/``) from a terminal, with the CLI's API token.

The socket's protocol: the client sends JSON frames, ``{"input": "..."}`` and ``{"resize": [rows, cols]}``; the
shell's output comes as binary frames; a text frame ``{"type": "refused" | "revoked" | "exit", "message": ...}``
says why the socket closes. The socket carries no exit status: ``hcs exec TASK -- COMMAND`` types the command
into the shell between two markers that print a random nonce (the second with the command's status, ``$?``) and
ends the shell, and prints what came between the markers.
"""

from __future__ import annotations

import codecs
import contextlib
import json
import os
import re
import secrets
import select
import shlex
import signal
import sys
import termios
import threading
import tty
from urllib.parse import urlencode, urlsplit

from websockets.exceptions import ConnectionClosed, InvalidHandshake, InvalidStatus
from websockets.sync.client import connect

from hcs_cli.client import USER_AGENT, ConnectionFailed

# Close codes of the console socket (apps/tasks/access.py) and what the CLI makes of them.
CLOSE_UNAUTHENTICATED = 4401
# The record separator (0x1e) frames a marker: typed into the shell, it is the four characters ``\036``, so the
# echo of the typed line never looks like a marker.
_MARK = "\x1e"
_READ_CHUNK = 4096


class Refused(Exception):
    """The portal refused the console (or ended it): the message it gave."""


def socket_url(base_url: str, task_id: int, instance: int, rows: int, cols: int) -> str:
    """The console socket's URL on the portal ``base_url`` (``ws`` for ``http``, ``wss`` for ``https``)."""
    parts = urlsplit(base_url)
    scheme = "wss" if parts.scheme == "https" else "ws"
    query = urlencode({"instance": instance, "rows": rows, "cols": cols})
    return f"{scheme}://{parts.netloc}{parts.path.rstrip('/')}/ws/tasks/{task_id}/terminal/?{query}"


def open_console(base_url: str, token: str, task_id: int, instance: int, rows: int = 24, cols: int = 80):
    """The console socket, authenticated by the API token (no Origin: not a browser); ConnectionFailed when the
    portal cannot be reached or refuses the handshake itself."""
    try:
        return connect(
            socket_url(base_url, task_id, instance, rows, cols),
            additional_headers={"Authorization": f"Token {token}"},
            user_agent_header=USER_AGENT,
            compression=None,
            open_timeout=30,
            max_size=None,
            proxy=None,
        )
    except InvalidStatus as exc:
        raise ConnectionFailed(
            f"{base_url} refused the console's socket (HTTP {exc.response.status_code}): is this the portal's address?"
        ) from None
    except (OSError, InvalidHandshake, TimeoutError) as exc:
        raise ConnectionFailed(f"Cannot reach {base_url}: {exc}") from None


def _notice(message: str | bytes) -> dict | None:
    """A text frame of the portal's (``refused``, ``revoked``, ``exit``), or None."""
    if isinstance(message, bytes):
        return None
    try:
        notice = json.loads(message)
    except ValueError:
        return None
    return notice if isinstance(notice, dict) else None


def _closing(ws, notice: dict | None) -> str:
    """Why the console ended, as the portal said it."""
    code = notice.get("code") if notice else None
    if notice and notice.get("message") and code != CLOSE_UNAUTHENTICATED:
        return str(notice["message"])
    if (code or ws.close_code) == CLOSE_UNAUTHENTICATED:
        return "The portal did not accept the token: run `hcs login` again."
    return f"The console closed (code {code})." if code not in (None, 1000) else "The shell ended."


def run_command(ws, argv: list[str], out) -> int:
    """Run ``argv`` in the console's shell; its output goes to ``out`` (bytes, CRLF as LF); its exit status."""
    nonce = secrets.token_hex(8)
    line = (
        f"printf '\\036{nonce}\\036\\n'; {{ {shlex.join(argv)} ; }} </dev/null; "
        f"printf '\\036{nonce} %d\\036\\n' $?; exit\n"
    )
    with contextlib.suppress(ConnectionClosed):  # a refusal closes the socket at once: it is read below
        ws.send(json.dumps({"input": line}))
    begin = f"{_MARK}{nonce}{_MARK}".encode()
    end = re.compile(rb"\x1e" + nonce.encode() + rb" (\d+)\x1e")
    buffer, started, notice = b"", False, None
    with contextlib.suppress(ConnectionClosed):
        for message in ws:
            if not isinstance(message, bytes):
                notice = _notice(message) or notice
                continue
            buffer += message
            if not started:
                at = buffer.find(begin)
                if at < 0:
                    continue
                started, buffer = True, buffer[at + len(begin) :].removeprefix(b"\r\n")
            found = end.search(buffer)
            if found:
                out.write(buffer[: found.start()].replace(b"\r\n", b"\n"))
                out.flush()
                return int(found[1])
            # Keep back what could be the start of the end marker (or a CR whose LF has not come yet).
            cut = buffer.rfind(b"\x1e")
            keep = max(len(buffer) - 1, 0) if cut < 0 else cut
            out.write(buffer[:keep].replace(b"\r\n", b"\n"))
            out.flush()
            buffer = buffer[keep:]
    if notice and notice.get("type") in ("refused", "revoked") or not started:
        raise Refused(_closing(ws, notice))
    raise Refused(f"{_closing(ws, notice)} The command's exit status is unknown.")


def window_size(fd: int) -> tuple[int, int]:
    """The rows and columns of the terminal ``fd`` is (its own, not ``LINES`` / ``COLUMNS``); 24 x 80 otherwise."""
    try:
        size = os.get_terminal_size(fd)
    except OSError:
        return 24, 80
    return size.lines or 24, size.columns or 80


def _send_input(ws, fd: int, stop: threading.Event) -> None:
    """Standard input to the shell until it ends or ``stop``. A terminal in raw mode never ends (Ctrl-D goes to the
    shell as it is); the end of a pipe or file is an ``exit`` typed after its last line, since a Ctrl-D sent while
    the shell runs a command (its terminal back in line mode) would be lost."""
    decoder = codecs.getincrementaldecoder("utf-8")("replace")
    last = "\n"
    try:
        while not stop.is_set():
            ready, _, _ = select.select([fd], [], [], 0.2)
            if not ready:
                continue
            data = os.read(fd, _READ_CHUNK)
            text = decoder.decode(data, final=not data)
            if text:
                ws.send(json.dumps({"input": text}))
                last = text[-1]
            if not data:
                ws.send(json.dumps({"input": ("" if last == "\n" else "\n") + "exit\n"}))
                return
    except (ConnectionClosed, OSError):
        return


def interactive(ws, stdin_fd: int, out) -> None:
    """Relay the shell to this terminal until it ends: raw mode while it runs (so Ctrl-C, Ctrl-D and the arrows go
    to the shell), the window's size sent now and on each change; the terminal is restored however it ends."""
    is_tty = os.isatty(stdin_fd)
    saved = termios.tcgetattr(stdin_fd) if is_tty else None
    stop = threading.Event()
    previous = {}

    def resize(*_args) -> None:
        rows, cols = window_size(stdin_fd)
        with contextlib.suppress(ConnectionClosed):
            ws.send(json.dumps({"resize": [rows, cols]}))

    def end(signum, _frame) -> None:
        raise SystemExit(128 + signum)

    notice = None
    try:
        for signum in (signal.SIGTERM, signal.SIGHUP):
            previous[signum] = signal.signal(signum, end)
        if is_tty:
            previous[signal.SIGWINCH] = signal.signal(signal.SIGWINCH, resize)
            tty.setraw(stdin_fd)
            resize()
        threading.Thread(target=_send_input, args=(ws, stdin_fd, stop), daemon=True).start()
        with contextlib.suppress(ConnectionClosed):
            for message in ws:
                if isinstance(message, bytes):
                    out.write(message)
                    out.flush()
                else:
                    notice = _notice(message) or notice
    finally:
        stop.set()
        if saved is not None:
            termios.tcsetattr(stdin_fd, termios.TCSADRAIN, saved)
        for signum, handler in previous.items():
            signal.signal(signum, handler)
        ws.close()
    if notice and notice.get("type") in ("refused", "revoked"):
        raise Refused(_closing(ws, notice))
    message = _closing(ws, notice)
    if message != "The shell ended.":
        print(f"\r\nhcs: {message}", file=sys.stderr)
