"""The Web Console: a real shell in a running local task through the terminal socket, as the
job's unprivileged identity inside its sandbox; viewers, outsiders, anonymous clients and ended tasks are refused.
"""

from __future__ import annotations

import asyncio
import json
import os

import pytest
from channels.db import database_sync_to_async
from channels.testing import WebsocketCommunicator
from django.conf import settings

from apps.tasks.services import stop_task, submit_task
from hcsportal.asgi import application
from tests.control.drive import run_until_running, wait_command_started, wait_status
from tests.portal.test_live import session_cookie

pytestmark = [pytest.mark.asyncio, pytest.mark.django_db(transaction=True)]


@pytest.fixture(autouse=True)
def local_jobs_dir(settings, tmp_path):
    settings.HCS_LOCAL_EXECUTOR_DIR = tmp_path / "local-jobs"


def start_running_task(world, command: str = "echo job-started; sleep 120"):
    """A dev environment of the member's on the local cluster, once its command runs in the sandbox (a console
    opened before that is refused: the sandbox is not up yet)."""
    task = submit_task(
        world.member,
        project=world.project,
        queue="high",
        name="shell",
        kind="dev_env",
        command=command,
        gpu_spec="1(A100)",
    )
    return wait_command_started(run_until_running(task), "job-started")


def finish(task, user):
    stop_task(task, user)
    return wait_status(task, {"stopped", "completed", "failed"})


async def open_terminal(user, task_id: int, query: str = "instance=0"):
    headers = [(b"origin", b"http://localhost"), (b"host", b"localhost")]
    if user is not None:
        headers.append((b"cookie", await database_sync_to_async(session_cookie)(user)))
    communicator = WebsocketCommunicator(application, f"/ws/tasks/{task_id}/terminal/?{query}", headers=headers)
    connected, _ = await communicator.connect(timeout=20)
    return communicator, connected


async def read_until(communicator, needle: str, timeout: float = 15) -> str:
    """The shell's output until ``needle`` shows up in it."""
    seen = ""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while needle not in seen:
        left = deadline - loop.time()
        if left <= 0:
            raise AssertionError(f"{needle!r} never came; the terminal showed: {seen!r}")
        try:
            message = await communicator.receive_output(timeout=left)
        except TimeoutError:
            raise AssertionError(f"{needle!r} never came; the terminal showed: {seen!r}")
        if message["type"] == "websocket.close":
            raise AssertionError(f"the terminal closed before {needle!r} came: {seen!r}")
        seen += (message.get("bytes") or b"").decode(errors="replace") or message.get("text") or ""
    return seen


async def refusal(communicator) -> tuple[dict, int]:
    """The refusal message and the close code that follows it."""
    message = json.loads((await communicator.receive_output(timeout=10))["text"])
    closed = await communicator.receive_output(timeout=10)
    assert closed["type"] == "websocket.close"
    return message, closed["code"]


async def type_line(communicator, line: str) -> None:
    await communicator.send_to(text_data=json.dumps({"input": line + "\r"}))


async def test_a_member_gets_a_shell_in_the_running_job_and_its_opening_is_on_the_timeline(live_world):
    task = await database_sync_to_async(start_running_task)(live_world)
    communicator, connected = await open_terminal(live_world.member, task.pk)
    assert connected
    await type_line(communicator, "echo hcs-$((40+2))")
    await read_until(communicator, "hcs-42")

    await communicator.disconnect()
    events = await database_sync_to_async(lambda: list(task.events.filter(data__access="terminal")))()
    assert len(events) == 1
    assert events[0].actor_id == live_world.member.pk and "max" in events[0].message
    await database_sync_to_async(finish)(task, live_world.member)


async def test_the_shell_is_the_jobs_unprivileged_user_in_its_sandbox_and_cannot_read_the_portals_secrets(
    live_world,
):
    task = await database_sync_to_async(start_running_task)(live_world)
    communicator, _ = await open_terminal(live_world.owner, task.pk)
    secrets = [settings.BASE_DIR / "hcsportal" / "settings.py", settings.VAR_DIR / "secret_key"]
    secrets = [path for path in secrets if path.exists()]
    assert secrets, "nothing of the portal's on disk to try"
    for n, path in enumerate(secrets):
        await type_line(communicator, f'echo "read{n}=$(cat {path} >/dev/null 2>&1 && echo LEAK || echo refused)"')
        await read_until(communicator, f"read{n}=refused")
    await type_line(communicator, 'echo "who=$(id -un) at=$(pwd) env=${DATABASE_URL:-none}${SECRET_KEY:-none}"')
    shown = await read_until(communicator, "nonenone")
    expected_user = settings.HCS_LOCAL_JOB_USER if os.geteuid() == 0 else None
    if expected_user:
        assert f"who={expected_user} " in shown
    assert f"at={settings.HCS_LOCAL_EXECUTOR_DIR}" in shown  # the job's own working directory
    # The job's processes are the only ones it sees: its command, not the portal's.
    await type_line(communicator, 'echo "procs=$(ls /proc | grep -c "^[0-9]")" "job=$(pgrep -cx sleep)"')
    shown = await read_until(communicator, "job=1")
    procs = int(shown.split("procs=")[-1].split()[0])
    assert procs < 20, shown
    await communicator.disconnect()
    await database_sync_to_async(finish)(task, live_world.member)


@pytest.mark.parametrize(("role", "code"), [("viewer", 4403), ("outsider", 4404), ("anonymous", 4401)])
async def test_viewers_outsiders_and_anonymous_clients_are_refused(live_world, role, code):
    task = await database_sync_to_async(start_running_task)(live_world)
    user = None if role == "anonymous" else live_world.user(role)
    communicator, _ = await open_terminal(user, task.pk)
    message, closed_with = await refusal(communicator)
    assert message["type"] == "refused" and message["code"] == code and closed_with == code
    events = await database_sync_to_async(lambda: task.events.filter(data__access="terminal").count())()
    assert events == 0
    await database_sync_to_async(finish)(task, live_world.member)


async def test_a_stopped_task_refuses_a_terminal(live_world):
    task = await database_sync_to_async(start_running_task)(live_world)
    await database_sync_to_async(finish)(task, live_world.member)
    communicator, _ = await open_terminal(live_world.member, task.pk)
    message, code = await refusal(communicator)
    assert code == 4409 and "not running" in message["message"]


async def test_an_instance_the_task_does_not_have_is_refused(live_world):
    task = await database_sync_to_async(start_running_task)(live_world)
    communicator, _ = await open_terminal(live_world.member, task.pk, "instance=3")
    _, code = await refusal(communicator)
    assert code == 4400
    await database_sync_to_async(finish)(task, live_world.member)


async def test_the_shell_ending_closes_the_socket(live_world):
    task = await database_sync_to_async(start_running_task)(live_world)
    communicator, _ = await open_terminal(live_world.member, task.pk)
    await type_line(communicator, "exit")
    while True:
        message = await communicator.receive_output(timeout=15)
        if message.get("text"):
            assert json.loads(message["text"])["type"] == "exit"
        if message["type"] == "websocket.close":
            break
    await database_sync_to_async(finish)(task, live_world.member)


async def test_an_idle_terminal_is_closed_after_the_idle_timeout(live_world, settings):
    settings.HCS_TERMINAL_IDLE_TIMEOUT_S = 1
    task = await database_sync_to_async(start_running_task)(live_world)
    communicator, _ = await open_terminal(live_world.member, task.pk)
    while True:
        message = await communicator.receive_output(timeout=15)
        if message.get("text"):
            assert "without input or output" in json.loads(message["text"])["message"]
        if message["type"] == "websocket.close":
            break
    await database_sync_to_async(finish)(task, live_world.member)
