"""The Web Console and the live socket against the policy (apps.vdc.policy), with real shells in running local jobs:

- a console into a project one is not in needs the permission to open any console, gives a visitor's shell that
  cannot read the job's secrets, and is on the task's timeline;
- an open console or live socket closes within seconds once its user leaves the project, is demoted, loses the
  permission or is deactivated.
"""

from __future__ import annotations

import asyncio
import json

import pytest
from channels.db import database_sync_to_async
from django.contrib.auth.models import Permission

from apps.tasks.services import stop_task, submit_task
from apps.vdc.models import Membership
from apps.vdc.policy import OPEN_ANY_CONSOLE
from apps.vdc.services import create_secret
from tests.control.drive import run_until_running, wait_command_started, wait_status
from tests.factories import staff_user
from tests.portal.test_live import connect_as, submit
from tests.portal.test_terminal import open_terminal, read_until, refusal, type_line

pytestmark = [pytest.mark.asyncio, pytest.mark.django_db(transaction=True)]

SECRET = "reg-7f3a9-project-secret"
TASK_SECRET = "tok-51c2e-task-secret"
# Every open socket rechecks this often in these tests; a revoked one must be gone well within the bound below.
RECHECK_S = 1
CLOSED_WITHIN_S = 10


@pytest.fixture(autouse=True)
def quick_rechecks(settings, tmp_path):
    settings.HCS_ACCESS_RECHECK_S = RECHECK_S
    settings.HCS_LOCAL_EXECUTOR_DIR = tmp_path / "local-jobs"


def start_task_with_secrets(world):
    """A member's dev environment holding a project secret as a variable and a file, and a secret variable; returned
    once its command runs inside its sandbox (a shell can join it)."""
    create_secret(world.owner, world.project, "REGISTRY", SECRET)
    task = submit_task(
        world.member,
        project=world.project,
        queue="high",
        name="shell",
        kind="dev_env",
        gpu_spec="1(A100)",
        command="echo job-started; sleep 120",
        secret_env={"API_TOKEN": TASK_SECRET},
        secret_refs=[
            {"secret": "REGISTRY", "env": "REGISTRY_PASSWORD"},
            {"secret": "REGISTRY", "file": "/run/secrets/registry"},
        ],
    )
    return wait_command_started(run_until_running(task), "job-started")


def finish(task, user):
    stop_task(task, user)
    return wait_status(task, {"stopped", "completed", "failed"})


async def probe_secrets(communicator) -> str:
    """What a shell shows when it looks for the job's secrets everywhere the job keeps them."""
    probes = [
        "cat /run/secrets/registry",
        "cat /run/hcs-job.env",
        'echo "env=$REGISTRY_PASSWORD$API_TOKEN"',
        "cat /proc/[0-9]*/environ",
    ]
    shown = ""
    for n, probe in enumerate(probes):
        await type_line(communicator, f"{probe} 2>&1; echo probe-$((100+{n}))-done")
        shown += await read_until(communicator, f"probe-{100 + n}-done")
    return shown


async def until_closed(communicator, timeout: float = CLOSED_WITHIN_S) -> tuple[list[dict], int, float]:
    """The JSON messages before the server closed the socket, its close code and how long it took."""
    loop = asyncio.get_running_loop()
    started, messages = loop.time(), []
    while True:
        left = started + timeout - loop.time()
        if left <= 0:
            raise AssertionError(f"still open after {timeout} s; got {messages}")
        message = await communicator.receive_output(timeout=left)
        if message["type"] == "websocket.close":
            return messages, message["code"], loop.time() - started
        if message.get("text"):
            messages.append(json.loads(message["text"]))


async def test_a_member_reads_the_secrets_in_the_jobs_own_shell(live_world):
    """The probes below find what the job holds, so the visitor's test shows them hidden, not absent."""
    task = await database_sync_to_async(start_task_with_secrets)(live_world)
    communicator, connected = await open_terminal(live_world.member, task.pk)
    assert connected
    shown = await probe_secrets(communicator)
    assert SECRET in shown and TASK_SECRET in shown
    await communicator.disconnect()
    await database_sync_to_async(finish)(task, live_world.member)


async def test_staff_allowed_any_console_gets_a_visitors_shell_without_the_jobs_secrets(live_world):
    task = await database_sync_to_async(start_task_with_secrets)(live_world)
    staff = await database_sync_to_async(staff_user)("ops-console", "tasks.view_task", OPEN_ANY_CONSOLE)
    communicator, connected = await open_terminal(staff, task.pk)
    assert connected
    await type_line(communicator, 'echo "who=$(id -un) jobs=$(pgrep -cx sleep)"')
    await read_until(communicator, "who=nobody jobs=1")  # beside the job, seeing its processes
    shown = await probe_secrets(communicator)
    assert SECRET not in shown and TASK_SECRET not in shown
    assert "Permission denied" in shown
    await communicator.disconnect()
    events = await database_sync_to_async(lambda: list(task.events.filter(data__access="terminal")))()
    assert [(e.actor_id, e.data["visitor"]) for e in events] == [(staff.pk, True)]
    assert "as a visitor" in events[0].message
    await database_sync_to_async(finish)(task, live_world.member)


async def test_a_superuser_outside_the_project_also_gets_only_a_visitors_shell(live_world):
    task = await database_sync_to_async(start_task_with_secrets)(live_world)
    communicator, _ = await open_terminal(live_world.admin, task.pk)
    await type_line(communicator, 'echo "who=$(id -un)"')
    await read_until(communicator, "who=nobody")
    assert SECRET not in await probe_secrets(communicator)
    await communicator.disconnect()
    await database_sync_to_async(finish)(task, live_world.member)


async def test_staff_without_the_console_permission_is_refused_and_leaves_no_entry(live_world):
    task = await database_sync_to_async(start_task_with_secrets)(live_world)
    staff = await database_sync_to_async(staff_user)("ops-viewer", "vdc.view_project", "tasks.view_task")
    communicator, _ = await open_terminal(staff, task.pk)
    message, code = await refusal(communicator)
    assert code == 4403 and "permission to open any project's console" in message["message"]
    assert await database_sync_to_async(lambda: task.events.filter(data__access="terminal").count())() == 0
    await database_sync_to_async(finish)(task, live_world.member)


def withdraw(world, how: str) -> None:
    """Take away what let the member open their console and follow the project."""
    if how == "removed":
        Membership.objects.filter(user=world.member, project=world.project).delete()
    elif how == "made viewer":
        Membership.objects.filter(user=world.member, project=world.project).update(role="viewer")
    else:
        world.member.is_active = False
        world.member.save(update_fields=["is_active"])


@pytest.mark.parametrize("how", ["removed", "made viewer", "deactivated"])
async def test_a_members_open_console_closes_within_seconds_of_losing_access(live_world, how):
    task = await database_sync_to_async(start_task_with_secrets)(live_world)
    communicator, _ = await open_terminal(live_world.member, task.pk)
    await type_line(communicator, "echo ready-$((1+1))")
    await read_until(communicator, "ready-2")
    await database_sync_to_async(withdraw)(live_world, how)
    messages, code, took = await until_closed(communicator)
    print(f"console closed {took:.2f} s after the member was {how}")
    assert code == 4403 and messages[-1]["type"] == "revoked" and messages[-1]["message"]
    await database_sync_to_async(finish)(task, live_world.owner)


async def test_a_visitors_console_closes_when_the_permission_is_withdrawn(live_world):
    task = await database_sync_to_async(start_task_with_secrets)(live_world)
    staff = await database_sync_to_async(staff_user)("ops-console", "tasks.view_task", OPEN_ANY_CONSOLE)
    communicator, _ = await open_terminal(staff, task.pk)
    await read_until(communicator, "$")
    permission = await database_sync_to_async(Permission.objects.get)(codename="open_any_console")
    await database_sync_to_async(staff.user_permissions.remove)(permission)
    messages, code, took = await until_closed(communicator)
    print(f"visitor's console closed {took:.2f} s after the permission was withdrawn")
    assert code == 4403 and messages[-1]["type"] == "revoked"
    await database_sync_to_async(finish)(task, live_world.member)


@pytest.mark.parametrize("how", ["removed", "deactivated"])
async def test_a_live_socket_closes_within_seconds_once_its_user_may_no_longer_see_what_it_follows(live_world, how):
    task = await database_sync_to_async(submit)(live_world, user=live_world.owner)
    member, _ = await connect_as(live_world.member)
    viewer, _ = await connect_as(live_world.viewer)
    for communicator in (member, viewer):
        for kind, pk in (("task", task.pk), ("project", live_world.project.pk)):
            await communicator.send_json_to({"subscribe": kind, "id": pk})
            assert (await communicator.receive_json_from())["type"] == "subscribed"
            if kind == "task":
                await communicator.receive_json_from()  # the current state
    await database_sync_to_async(withdraw)(live_world, how)
    messages, code, took = await until_closed(member)
    print(f"live socket closed {took:.2f} s after the member was {how}")
    assert code == 4403 and messages[-1]["type"] == "revoked"
    # The viewer, still in the project, keeps following it.
    assert await viewer.receive_nothing(timeout=RECHECK_S * 3)
    await viewer.disconnect()
