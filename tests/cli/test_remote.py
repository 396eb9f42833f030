"""`hcs exec` and `hcs port-forward` against a live server and real local tasks: the Web Console's socket and
Connect's app origin, with the CLI's API token and the pages' role rules."""

from __future__ import annotations

import fcntl
import os
import pty
import select
import struct
import subprocess
import termios
import time

import pytest
import requests
from rest_framework.authtoken.models import Token
from websockets.sync.client import connect

from apps.tasks.services import stop_task
from tests.cli.conftest import HCS
from tests.cli.test_hcs import log_in
from tests.control.drive import wait_status
from tests.portal.test_connect import PORT, WS_ECHO, start_service
from tests.portal.test_terminal import start_running_task

pytestmark = pytest.mark.django_db(transaction=True)


def finish(task, user) -> None:
    stop_task(task, user)
    wait_status(task, {"stopped", "completed", "failed"})


def test_exec_runs_a_command_in_the_tasks_shell_and_refuses_viewers_and_outsiders(run_hcs, live_world):
    world = live_world
    task = start_running_task(world)
    try:
        log_in(run_hcs)
        result = run_hcs("exec", str(task.pk), "--", "echo", "hi")
        assert result.returncode == 0, result.stderr
        assert result.stdout == "hi\n"
        # Arguments are passed as a list, and the command's exit status comes back.
        result = run_hcs("exec", str(task.pk), "--", "sh", "-c", "printf 'a b\\nc\\n'; exit 3")
        assert (result.returncode, result.stdout) == (3, "a b\nc\n"), result.stderr
        opened = task.events.filter(data__access="terminal").count()
        assert opened == 2

        viewer = run_hcs(
            "exec", str(task.pk), "--", "id", env={"HCS_TOKEN": Token.objects.create(user=world.viewer).key}
        )
        assert viewer.returncode == 1 and viewer.stdout == ""
        assert viewer.stderr == "hcs: Project viewers cannot open a terminal: it runs commands as the job.\n"
        outsider = run_hcs(
            "exec", str(task.pk), "--", "id", env={"HCS_TOKEN": Token.objects.create(user=world.outsider).key}
        )
        assert outsider.returncode == 1 and outsider.stderr == "hcs: No such task.\n"
        forged = run_hcs("exec", str(task.pk), "--", "id", env={"HCS_TOKEN": "0" * 40})
        assert forged.returncode == 1
        assert forged.stderr == "hcs: The portal did not accept the token: run `hcs login` again.\n"
        assert task.events.filter(data__access="terminal").count() == opened
    finally:
        finish(task, world.owner)


def test_exec_with_a_shell_on_standard_input(run_hcs, live_world):
    """Without a command and without a terminal: what standard input says goes to the shell, its end ends it."""
    task = start_running_task(live_world)
    try:
        log_in(run_hcs)
        result = run_hcs("exec", str(task.pk), stdin="echo from-$((6 * 7))\n")
        assert result.returncode == 0, result.stderr
        assert "from-42" in result.stdout
    finally:
        finish(task, live_world.owner)


def read_until(fd: int, needle: bytes, timeout: float = 20) -> bytes:
    seen, deadline = b"", time.monotonic() + timeout
    while needle not in seen:
        assert time.monotonic() < deadline, f"{needle!r} never came: {seen!r}"
        if select.select([fd], [], [], 0.2)[0]:
            try:
                seen += os.read(fd, 4096)
            except OSError:
                break
    return seen


def test_exec_at_a_terminal_is_an_interactive_shell_of_the_terminals_size(run_hcs, live_world):
    """`hcs exec` on a real terminal: raw mode while the shell runs (Ctrl-C reaches the shell, not `hcs`), the
    window's size sent, `exit` ends it with status 0 and the terminal's modes are restored."""
    task = start_running_task(live_world)
    main, child = pty.openpty()
    try:
        fcntl.ioctl(child, termios.TIOCSWINSZ, struct.pack("HHHH", 33, 101, 0, 0))
        before = termios.tcgetattr(child)
        log_in(run_hcs)
        process = subprocess.Popen(
            [str(HCS), "exec", str(task.pk)], stdin=child, stdout=child, stderr=child, env=run_hcs.env
        )
        read_until(main, b"$ ")  # the shell's prompt: hcs has the terminal in raw mode by now
        os.write(main, b"stty size; echo size-$((1 + 1))\r")
        assert b"33 101" in read_until(main, b"size-2")
        # The sleep says when it runs (the shell has made it the terminal's foreground job by then): a Ctrl-C
        # sent before that would reach the shell, not the sleep.
        os.write(main, b"sh -c 'echo asleep-$((2 + 2)); exec sleep 30'\r")
        read_until(main, b"asleep-4")
        os.write(main, b"\x03echo still-$((6 * 7))\r")  # Ctrl-C stops the sleep inside, not hcs
        read_until(main, b"still-42")
        os.write(main, b"exit\r")
        assert process.wait(20) == 0
        assert termios.tcgetattr(child) == before
    finally:
        os.close(main)
        os.close(child)
        finish(task, live_world.owner)


def forwarding(run_hcs, task_id: int, env: dict | None = None) -> tuple[subprocess.Popen, str]:
    """`hcs port-forward` on a free local port, once it says where it listens (or has ended)."""
    process = subprocess.Popen(
        [str(HCS), "port-forward", str(task_id), str(PORT), "--local-port", "0"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**run_hcs.env, **(env or {})},
    )
    line = process.stdout.readline()
    return process, line.split()[1] if line.startswith("Forwarding ") else ""


def test_port_forward_serves_the_tasks_app_locally_and_refuses_viewers(run_hcs, live_world):
    world = live_world
    task = start_service(world)
    try:
        log_in(run_hcs)
        process, local = forwarding(run_hcs, task.pk)
        try:
            assert local.startswith("http://127.0.0.1:"), process.stderr.read() if process.poll() is not None else ""
            deadline = time.monotonic() + 30
            while True:
                page = requests.get(f"{local}/index.html", timeout=30)
                if page.status_code == 200 or time.monotonic() > deadline:
                    break
                time.sleep(0.5)  # the service inside the job may still be starting
            assert page.status_code == 200, page.text
            assert page.text == "hello from the job\n"
            posted = requests.post(f"{local}/form", data=b"x=1", timeout=30)
            assert (posted.status_code, posted.text) == (201, "got x=1")
            # A redirect of the service's stays on the local address.
            moved = requests.get(f"{local}/go", allow_redirects=False, timeout=30)
            assert moved.status_code == 302 and moved.headers["Location"] in ("/index.html", f"{local}/index.html")
            # The job never sees the app cookie.
            seen = requests.get(f"{local}/headers", timeout=30).json()
            assert "hcs-app" not in seen.get("Cookie", "")
        finally:
            process.terminate()
            process.wait(10)
        assert task.events.filter(data__access="connect").exists()

        viewer = Token.objects.create(user=world.viewer).key
        process, local = forwarding(run_hcs, task.pk, {"HCS_TOKEN": viewer})
        assert local == "" and process.wait(30) == 1
        assert process.stderr.read().strip() == (
            "hcs: Only owners and members of the project connect to its tasks' services."
        )
        process, _ = forwarding(run_hcs, task.pk, {"HCS_TOKEN": Token.objects.create(user=world.outsider).key})
        assert process.wait(30) == 1 and process.stderr.read().strip() == "hcs: No such task."
    finally:
        finish(task, world.owner)
    process, _ = forwarding(run_hcs, task.pk)
    assert process.wait(30) == 1 and process.stderr.read().strip() == "hcs: The task is stopped, not running."


def test_port_forward_relays_the_apps_websockets(run_hcs, live_world):
    task = start_service(live_world, WS_ECHO)
    try:
        log_in(run_hcs)
        process, local = forwarding(run_hcs, task.pk)
        try:
            assert local, process.stderr.read() if process.poll() is not None else ""
            address = local.replace("http://", "ws://")
            deadline = time.monotonic() + 30
            while True:
                try:
                    socket = connect(f"{address}/api/ws?x=1", origin=local, proxy=None, open_timeout=10)
                    break
                except Exception:
                    assert time.monotonic() < deadline, "the app's socket never opened through the forward"
                    time.sleep(0.5)  # the service inside the job may still be starting
            with socket:
                socket.send("hello")
                assert socket.recv(timeout=10).startswith("echo /api/ws?x=1 hello cookie=")
        finally:
            process.terminate()
            process.wait(10)
    finally:
        finish(task, live_world.owner)
