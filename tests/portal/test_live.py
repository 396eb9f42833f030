"""The live socket: authenticated and origin-checked; subscriptions checked against project roles; pushes."""

import pytest
from channels.db import database_sync_to_async
from channels.testing import WebsocketCommunicator
from django.conf import settings
from django.contrib.auth import BACKEND_SESSION_KEY, HASH_SESSION_KEY, SESSION_KEY
from django.contrib.sessions.backends.db import SessionStore

from apps.tasks.consumers import LiveConsumer
from apps.tasks.services import stop_task, submit_task
from hcsportal.asgi import application
from tests.factories import (
    ClusterFactory,
    MembershipFactory,
    ProjectFactory,
    ProjectQuotaFactory,
    TaskQueueFactory,
    UserFactory,
    VDCFactory,
)

pytestmark = [pytest.mark.asyncio, pytest.mark.django_db(transaction=True)]


def submit(world, project=None, user=None):
    return submit_task(
        user or world.member,
        project=project or world.project,
        queue="high",
        name="job",
        kind="training",
        gpu_spec="1(A100)",
        command="sleep 1",
    )


def session_cookie(user) -> bytes:
    session = SessionStore()
    session[SESSION_KEY] = str(user.pk)
    session[BACKEND_SESSION_KEY] = "django.contrib.auth.backends.ModelBackend"
    session[HASH_SESSION_KEY] = user.get_session_auth_hash()
    session.save()
    return f"{settings.SESSION_COOKIE_NAME}={session.session_key}".encode()


async def connect_as(user, origin=b"http://localhost"):
    headers = [(b"origin", origin), (b"host", b"localhost")]
    if user is not None:
        headers.append((b"cookie", await database_sync_to_async(session_cookie)(user)))
    communicator = WebsocketCommunicator(application, "/ws/live/", headers=headers)
    connected, _ = await communicator.connect()
    return communicator, connected


async def test_anonymous_connection_is_closed(live_world):
    communicator, connected = await connect_as(None)
    assert not connected
    await communicator.disconnect()


async def test_foreign_origin_is_refused(live_world):
    communicator, connected = await connect_as(live_world.member, origin=b"http://evil.example")
    assert not connected
    await communicator.disconnect()


async def test_member_subscribes_and_gets_the_current_state(live_world):
    task = await database_sync_to_async(submit)(live_world)
    communicator, connected = await connect_as(live_world.member)
    assert connected
    await communicator.send_json_to({"subscribe": "task", "id": task.pk})
    assert await communicator.receive_json_from() == {"type": "subscribed", "subscribe": "task", "id": task.pk}
    snapshot = await communicator.receive_json_from()
    assert snapshot["type"] == "task" and snapshot["status"] == "queued" and snapshot["id"] == task.pk
    await communicator.disconnect()


@pytest.mark.parametrize("kind", ["task", "project", "user"])
async def test_outsider_cannot_join_another_projects_groups(live_world, kind):
    task = await database_sync_to_async(submit)(live_world)
    target = {"task": task.pk, "project": live_world.project.pk, "user": live_world.member.pk}[kind]
    communicator, connected = await connect_as(live_world.outsider)
    assert connected
    await communicator.send_json_to({"subscribe": kind, "id": target})
    assert await communicator.receive_json_from() == {"type": "refused", "subscribe": kind, "id": target}
    await database_sync_to_async(stop_task)(task, live_world.member)
    assert await communicator.receive_nothing(timeout=0.5)
    await communicator.disconnect()


async def test_malformed_subscription_gets_an_error(live_world):
    communicator, _ = await connect_as(live_world.member)
    await communicator.send_json_to({"subscribe": "everything"})
    assert (await communicator.receive_json_from())["type"] == "error"
    await communicator.disconnect()


@pytest.mark.parametrize("kind", ["task", "project", "user"])
async def test_member_gets_a_push_after_a_status_change(live_world, kind):
    task = await database_sync_to_async(submit)(live_world, user=live_world.owner)
    target = {"task": task.pk, "project": live_world.project.pk, "user": live_world.owner.pk}[kind]
    viewer = live_world.owner if kind == "user" else live_world.viewer
    communicator, _ = await connect_as(viewer)
    await communicator.send_json_to({"subscribe": kind, "id": target})
    assert (await communicator.receive_json_from())["type"] == "subscribed"
    if kind == "task":
        await communicator.receive_json_from()  # the current state
    await database_sync_to_async(stop_task)(task, live_world.member)
    push = await communicator.receive_json_from(timeout=5)
    assert push["type"] == "task" and push["id"] == task.pk and push["status"] == "stopped"
    assert push["summary"] == "stopped" and push["is_final"]
    await communicator.disconnect()


async def test_queue_subscribers_get_counts_only(live_world):
    communicator, _ = await connect_as(live_world.outsider)
    await communicator.send_json_to({"subscribe": "queue", "id": live_world.high.pk})
    assert (await communicator.receive_json_from())["type"] == "subscribed"
    assert await communicator.receive_json_from() == {
        "type": "queue",
        "id": live_world.high.pk,
        "waiting": 0,
        "running": 0,
        "gpu_in_use": "0.00",
    }
    await database_sync_to_async(submit)(live_world)
    push = await communicator.receive_json_from(timeout=5)
    assert push == {"type": "queue", "id": live_world.high.pk, "waiting": 1, "running": 0, "gpu_in_use": "0.00"}
    await communicator.disconnect()


async def test_consumer_alone_refuses_a_scope_without_user():
    communicator = WebsocketCommunicator(LiveConsumer.as_asgi(), "/ws/live/")
    connected, code = await communicator.connect()
    assert not connected and code == 4401
    await communicator.disconnect()


def second_vdc(world):
    """VDC 2 with a queue and a project of its own; the world's users have no project there."""
    vdc = VDCFactory(name="second")
    ClusterFactory(vdc=vdc, name="local-2", cluster_type="local")
    queue = TaskQueueFactory(vdc=vdc, name="high", priority_class="high")
    project = ProjectFactory(name="gamma")
    ProjectQuotaFactory(project=project, vdc=vdc)
    owner = UserFactory(username="greta")
    MembershipFactory(project=project, user=owner, role="owner")
    return queue, project, owner


async def test_member_cannot_get_another_vdcs_queue_counts(live_world):
    queue, project, owner = await database_sync_to_async(second_vdc)(live_world)
    communicator, connected = await connect_as(live_world.member)
    assert connected
    await communicator.send_json_to({"subscribe": "queue", "id": queue.pk})
    assert await communicator.receive_json_from() == {"type": "refused", "subscribe": "queue", "id": queue.pk}
    await database_sync_to_async(submit_task)(
        owner, project=project, queue=queue, name="theirs", kind="training", gpu_spec="", command="sleep 1"
    )
    assert await communicator.receive_nothing(timeout=1)
    # Their own VDC's queue still answers on the same socket.
    await communicator.send_json_to({"subscribe": "queue", "id": live_world.high.pk})
    assert (await communicator.receive_json_from())["type"] == "subscribed"
    await communicator.disconnect()


async def test_platform_admin_may_watch_every_vdcs_queues(live_world):
    queue, _, _ = await database_sync_to_async(second_vdc)(live_world)
    communicator, _ = await connect_as(live_world.admin)
    await communicator.send_json_to({"subscribe": "queue", "id": queue.pk})
    assert (await communicator.receive_json_from())["type"] == "subscribed"
    await communicator.disconnect()


async def test_estimated_starts_say_their_zone_and_how_far_ahead_they_are():
    # Times were UTC without a label, with no relative ETA.
    from datetime import timedelta

    from django.utils import timezone

    from apps.core.templatetags.moments import format_moment
    from apps.tasks.live import from_now, status_summary
    from apps.tasks.models import Task

    now = timezone.now()
    assert format_moment(now).endswith(" UTC")
    assert [from_now(now + timedelta(seconds=s), now) for s in (30, 180, 7500, 3 * 86400)] == [
        "any moment now",
        "in 3 min",
        "in 2 h 5 min",
        "in 3 days",
    ]
    task = Task(status="queued", queue_position=2, estimated_start=now + timedelta(minutes=12, seconds=30))
    assert status_summary(task).startswith("queued, position 2, estimated start ")
    assert status_summary(task).endswith(" UTC (in 12 min)")
