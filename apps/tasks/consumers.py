"""Sockets: the live one (``ws/live/``: authenticate, check each subscription, join groups, relay), the
Web Console (``ws/tasks/<id>/terminal/``: authenticate, check the role, relay a shell) and Connect's (on an app
host: authenticate by the app cookie, relay to the task's port).

Each asks ``apps.vdc.policy`` again every ``HCS_ACCESS_RECHECK_S`` while it is open, and closes (the live and
console sockets with a ``revoked`` message saying why) once the user lost what opened it: a membership, a role,
a permission, an active account.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import secrets
import time
from concurrent.futures import ThreadPoolExecutor
from urllib.parse import parse_qs

from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncJsonWebsocketConsumer, AsyncWebsocketConsumer
from django.conf import settings
from django.db import DatabaseError
from websockets.exceptions import ConnectionClosed, InvalidHandshake

from apps.clusters.executors.base import ExecutorError
from apps.clusters.executors.terminal import clamp_size
from apps.queues.models import TaskQueue
from apps.tasks import access, connect, live, request_rate, services
from apps.tasks.models import Task
from apps.vdc import policy
from apps.vdc.models import Project

log = logging.getLogger(__name__)

# Subscriptions pages may send, e.g. {"subscribe": "task", "id": 12}.
KINDS = ("task", "project", "queue", "user")
USAGE = 'Expected {"subscribe": "task|project|queue|user", "id": N}.'
# Close code of a socket whose user lost the right to what it was opened for (the page shows the reason).
CLOSE_REVOKED = 4403


class Rechecked:
    """A socket that asks the policy again every ``HCS_ACCESS_RECHECK_S`` while open, and closes once
    :meth:`access_lost` says why it may not stay open."""

    recheck: asyncio.Task | None = None

    def start_rechecks(self) -> None:
        self.recheck = asyncio.create_task(self._recheck_loop())

    def stop_rechecks(self) -> None:
        if self.recheck is not None:
            self.recheck.cancel()

    async def _recheck_loop(self) -> None:
        while True:
            await asyncio.sleep(settings.HCS_ACCESS_RECHECK_S)
            try:
                reason = await database_sync_to_async(self.access_lost)()
            except DatabaseError:
                log.exception(
                    "could not recheck the access of a socket; trying again in %s s", settings.HCS_ACCESS_RECHECK_S
                )
                continue
            if reason:
                await self.revoke(reason)
                return

    def access_lost(self) -> str | None:
        """Why the socket must close now (read from the database); None while it may stay open."""
        raise NotImplementedError

    async def revoke(self, reason: str) -> None:
        """Say why, and close with ``CLOSE_REVOKED``."""
        await self.send(text_data=json.dumps({"type": "revoked", "message": reason}))
        await self.close(code=CLOSE_REVOKED, reason=reason[:120])


class LiveConsumer(Rechecked, AsyncJsonWebsocketConsumer):
    """Pushes task state and queue counts to pages; a subscription the user may not see is refused, and one the
    user stops being allowed to see closes the socket (the page reconnects with what it may still see)."""

    async def connect(self) -> None:
        self.user = self.scope.get("user")
        if self.user is None or not self.user.is_authenticated:
            await self.close(code=4401)
            return
        self.groups_joined: set[str] = set()
        # Per group joined, what it needs again at each recheck: (kind, the project or VDC it belongs to).
        self.needs: dict[str, tuple[str, int]] = {}
        await self.accept()
        self.start_rechecks()

    async def disconnect(self, code) -> None:
        self.stop_rechecks()
        for group in getattr(self, "groups_joined", ()):
            await self.channel_layer.group_discard(group, self.channel_name)

    async def receive_json(self, content, **kwargs) -> None:
        kind = content.get("subscribe") if isinstance(content, dict) else None
        raw_id = content.get("id") if isinstance(content, dict) else None
        if kind not in KINDS or not isinstance(raw_id, int) or isinstance(raw_id, bool):
            await self.send_json({"type": "error", "error": USAGE})
            return
        group, snapshot, need = await self._authorise(kind, raw_id)
        if group is None:
            await self.send_json({"type": "refused", "subscribe": kind, "id": raw_id})
            return
        await self.channel_layer.group_add(group, self.channel_name)
        self.groups_joined.add(group)
        self.needs[group] = need
        await self.send_json({"type": "subscribed", "subscribe": kind, "id": raw_id})
        if snapshot is not None:
            # The state as of now, so a page that reconnects after a drop catches up.
            await self.send_json(snapshot)

    @database_sync_to_async
    def _authorise(self, kind: str, pk: int) -> tuple[str | None, dict | None, tuple[str, int] | None]:
        """The group to join, the current state to send and what the group needs at each recheck (see
        :meth:`access_lost`); (None, None, None) when the user may not see it."""
        refused = None, None, None
        if kind == "user":
            return (live.user_group(pk), None, ("user", pk)) if pk == self.user.pk else refused
        if kind == "queue":
            # The API's rule: a queue's counts are for users with a project in its VDC (and staff who see VDCs).
            vdc_id = TaskQueue.objects.filter(pk=pk).values_list("vdc_id", flat=True).first()
            if vdc_id is None or not policy.visible_vdcs(self.user).filter(pk=vdc_id).exists():
                return refused
            return live.queue_group(pk), {"type": "queue", "id": pk, **live.queue_counts([pk])[pk]}, ("vdc", vdc_id)
        if kind == "project":
            project = Project.objects.filter(pk=pk).first()
            if project is None or not policy.can_view(self.user, project):
                return refused
            return live.project_group(pk), None, ("project", pk)
        task = Task.objects.select_related("project", "cluster").filter(pk=pk).first()
        if task is None or not policy.can_view(self.user, task.project, policy.VIEW_TASK):
            return refused
        return live.task_group(pk), live.task_payload(task), ("task", task.project_id)

    def access_lost(self) -> str | None:
        """Asks again, for every group joined, what :meth:`_authorise` asked (a few queries whatever their
        number): the user must still be active and still see each group's project or VDC."""
        user = policy.fresh_user(self.user.pk)
        if user is None:
            return "Your account is no longer active."
        needed = set(self.needs.values())
        projects = {pk for kind, pk in needed if kind in ("task", "project")}
        vdcs = {pk for kind, pk in needed if kind == "vdc"}
        seen: set[tuple[str, int]] = {("user", user.pk)}
        if projects:
            member_of = set(
                policy.member_project_ids(user).filter(project_id__in=projects).values_list("project_id", flat=True)
            )
            for kind, perm in (("project", policy.VIEW_PROJECT), ("task", policy.VIEW_TASK)):
                allowed = projects if policy.has_platform_perm(user, perm) else member_of
                seen |= {(kind, pk) for pk in allowed}
        if vdcs:
            seen |= {("vdc", pk) for pk in policy.visible_vdcs(user).filter(pk__in=vdcs).values_list("pk", flat=True)}
        lost = needed - seen
        if lost:
            kind, pk = min(lost)
            what = {"task": "tasks of project", "project": "project", "vdc": "queues of VDC", "user": "user"}[kind]
            return f"You may no longer see the {what} #{pk} this page follows."
        return None

    async def live_message(self, event: dict) -> None:
        await self.send_json(event["payload"])


# Terminal I/O blocks (a PTY, a Kubernetes exec stream): it runs in these threads, never on the event loop.
_TERMINAL_THREADS = ThreadPoolExecutor(max_workers=32, thread_name_prefix="terminal")
# Input frames larger than this are refused: a paste, not a file transfer.
_MAX_INPUT_BYTES = 64 * 1024


class TerminalConsumer(Rechecked, AsyncWebsocketConsumer):
    """The Web Console: relays a shell in one instance of a running task (``?instance=N``) to the page.

    Every refusal is an accepted socket closed at once with a 44xx code and the reason, so the page can
    say why. Client frames are JSON: ``{"input": "..."}`` or ``{"resize": [rows, cols]}``; the shell's
    output comes as binary frames. A user who leaves the project (or loses the role, the permission or their
    account) while the shell is open has it hung up within ``HCS_ACCESS_RECHECK_S``.
    """

    # No groups, so no channel layer: a terminal does not depend on Redis, nor load it with a receive loop.
    channel_layer_alias = None
    terminal = None
    target: access.TerminalTarget | None = None
    pump: asyncio.Task | None = None

    async def connect(self) -> None:
        await self.accept()
        user = self.scope.get("user")
        task_id = int(self.scope["url_route"]["kwargs"]["task_id"])
        query = parse_qs(self.scope.get("query_string", b"").decode())
        try:
            instance = int((query.get("instance") or ["0"])[0])
            rows, cols = clamp_size(*(int((query.get(k) or [d])[0]) for k, d in (("rows", "24"), ("cols", "80"))))
        except ValueError:
            await self._refuse(access.CLOSE_BAD_REQUEST, "instance, rows and cols must be numbers")
            return
        try:
            target = await database_sync_to_async(access.terminal_target)(user, task_id, instance)
            self.terminal = await self._in_thread(target.open, rows, cols)
        except access.Refused as refused:
            await self._refuse(refused.code, str(refused))
            return
        except ExecutorError as exc:
            await self._refuse(access.CLOSE_BACKEND, f"The backend could not open a terminal: {exc}")
            return
        self.target = target
        await database_sync_to_async(access.record_terminal_opened)(task_id, user, instance, target.visitor)
        self.last_activity = asyncio.get_running_loop().time()
        self.pump = asyncio.create_task(self._relay_output(self.terminal))
        self.start_rechecks()

    def access_lost(self) -> str | None:
        return access.terminal_access_lost(self.scope["user"].pk, self.target)

    async def revoke(self, reason: str) -> None:
        """Hang up the shell at once, whatever the page does next, then say why and close."""
        terminal, self.terminal = self.terminal, None
        self.pump.cancel()
        await self._in_thread(terminal.close)
        await super().revoke(reason)

    async def _refuse(self, code: int, message: str) -> None:
        await self.send(text_data=json.dumps({"type": "refused", "code": code, "message": message}))
        await self.close(code=code, reason=message[:120])

    @staticmethod
    async def _in_thread(fn, *args):
        return await asyncio.get_running_loop().run_in_executor(_TERMINAL_THREADS, fn, *args)

    async def _relay_output(self, terminal) -> None:
        """Shell output to the page until the shell ends or the session idles out; then say so and close."""
        loop = asyncio.get_running_loop()
        limit = settings.HCS_TERMINAL_IDLE_TIMEOUT_S
        message = "The shell ended."
        while True:
            data = await self._in_thread(terminal.read, 0.5)
            if data is None:
                if loop.time() - self.last_activity > limit:
                    message = f"Closed after {limit // 60} min without input or output."
                    break
                continue
            if not data:
                break
            self.last_activity = loop.time()
            await self.send(bytes_data=data)
        await self.send(text_data=json.dumps({"type": "exit", "message": message}))
        await self.close(code=1000)

    async def receive(self, text_data=None, bytes_data=None) -> None:
        if self.terminal is None:
            return
        try:
            message = json.loads(text_data or bytes_data or b"")
        except ValueError:
            message = None
        self.last_activity = asyncio.get_running_loop().time()
        if isinstance(message, dict) and isinstance(message.get("input"), str):
            data = message["input"].encode()
            if len(data) <= _MAX_INPUT_BYTES:
                await self._in_thread(self.terminal.write, data)
        elif isinstance(message, dict) and isinstance(message.get("resize"), list) and len(message["resize"]) == 2:
            try:
                rows, cols = (int(n) for n in message["resize"])
            except (TypeError, ValueError):
                return
            await self._in_thread(self.terminal.resize, rows, cols)

    async def disconnect(self, code) -> None:
        self.stop_rechecks()
        if self.terminal is not None:
            self.pump.cancel()
            await self._in_thread(self.terminal.close)


class ConnectSocketConsumer(Rechecked, AsyncWebsocketConsumer):
    """Connect's WebSocket half, on an app host only (``<task>-<port>.<HCS_APPS_DOMAIN>``, any path): relays a
    socket of the app's page to the same path on the task's port.

    Same rules as the HTTP side: the page's ``Origin`` must be the app's own origin exactly, the app cookie must
    name a project owner or member (checked now), and the portal's session counts for nothing. A refusal closes
    the handshake with 4000 + the HTTP status (4401, 4403, 4404, 4409), a service that does not answer with 4502.
    """

    channel_layer_alias = None
    upstream = None
    pump: asyncio.Task | None = None
    opened_at: float | None = None

    async def connect(self) -> None:
        self.request_id = secrets.token_hex(8)
        headers = dict(self.scope.get("headers") or ())
        host = headers.get(b"host", b"").decode("latin-1")
        secure = self.scope.get("scheme") == "wss"
        app = connect.app_of_host(host)
        if app is None:
            await self.close(code=4404)
            return
        if headers.get(b"origin", b"").decode("latin-1") != f"{'https' if secure else 'http'}://{host}":
            await self.close(code=4403)
            return
        task_id, port = app
        cookies = self.scope.get("cookies") or {}
        try:
            user = await database_sync_to_async(connect.app_cookie_user)(
                cookies.get(connect.cookie_name(secure)), task_id, port
            )
            target = await database_sync_to_async(access.connect_target)(user, task_id, port)
            endpoint = await TerminalConsumer._in_thread(target.executor.port_endpoint, target.external_id, 0, port)
            self.upstream = await access.open_upstream_socket(
                endpoint, self.scope["path"], self.scope, connect.reserved_cookies()
            )
        except access.Waking as waking:
            # A socket is not held while a service scaled to zero starts: it is woken, and the page's retry finds it.
            if waking.asleep:
                await database_sync_to_async(services.wake)(task_id, "Woken by a WebSocket through Connect")
            await self.close(code=4000 + waking.code)
            return
        except access.Refused as refused:
            await self.close(code=4000 + refused.code)
            return
        except (ExecutorError, OSError, TimeoutError, InvalidHandshake):
            await self.close(code=access.CLOSE_BACKEND)
            return
        await self.accept(subprotocol=self.upstream.subprotocol)
        self.user, self.task_id, self.port = user, task_id, port
        # An open socket is a request in flight until it closes: its service does not scale to zero under it.
        self.opened_at = time.time()
        await asyncio.to_thread(request_rate.count, task_id, self.opened_at, self.request_id)
        self.pump = asyncio.create_task(self._relay())
        self.start_rechecks()

    def access_lost(self) -> str | None:
        try:
            access.connect_target(self.user, self.task_id, self.port)
        except access.Refused as refused:
            return str(refused)
        return None

    async def revoke(self, reason: str) -> None:
        """The app's own socket: no message of the portal's in it, only the close code."""
        await self.close(code=CLOSE_REVOKED, reason=reason[:120])

    async def _relay(self) -> None:
        try:
            async for message in self.upstream:
                if isinstance(message, bytes):
                    await self.send(bytes_data=message)
                else:
                    await self.send(text_data=message)
        except ConnectionClosed:
            pass
        await self.close()

    async def receive(self, text_data=None, bytes_data=None) -> None:
        if self.upstream is not None:
            with contextlib.suppress(ConnectionClosed):
                await self.upstream.send(text_data if text_data is not None else bytes_data)

    async def disconnect(self, code) -> None:
        self.stop_rechecks()
        if self.pump is not None:
            self.pump.cancel()
        if self.upstream is not None:
            await self.upstream.close()
        if self.opened_at is not None:
            await asyncio.to_thread(request_rate.busy, self.task_id, self.opened_at, time.time(), self.request_id)
            self.opened_at = None
