"""Sockets: the live one (``ws/live/``: authenticate, check each subscription, join groups, relay) and the
Web Console (``ws/tasks/<id>/terminal/``: authenticate, check the role, relay a shell)."""

from __future__ import annotations

import asyncio
import contextlib
import json
from concurrent.futures import ThreadPoolExecutor
from urllib.parse import parse_qs

from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncJsonWebsocketConsumer, AsyncWebsocketConsumer
from django.conf import settings
from websockets.exceptions import ConnectionClosed, InvalidHandshake

from apps.clusters.executors.base import ExecutorError
from apps.clusters.executors.terminal import clamp_size
from apps.queues.models import TaskQueue
from apps.tasks import access, live
from apps.tasks.models import Task
from apps.vdc.api.permissions import visible_vdcs
from apps.vdc.models import Project
from apps.vdc.services import can_view

# Subscriptions pages may send, e.g. {"subscribe": "task", "id": 12}.
KINDS = ("task", "project", "queue", "user")
USAGE = 'Expected {"subscribe": "task|project|queue|user", "id": N}.'


class LiveConsumer(AsyncJsonWebsocketConsumer):
    """Pushes task state and queue counts to pages; a subscription the user may not see is refused."""

    async def connect(self) -> None:
        self.user = self.scope.get("user")
        if self.user is None or not self.user.is_authenticated:
            await self.close(code=4401)
            return
        self.groups_joined: set[str] = set()
        await self.accept()

    async def disconnect(self, code) -> None:
        for group in getattr(self, "groups_joined", ()):
            await self.channel_layer.group_discard(group, self.channel_name)

    async def receive_json(self, content, **kwargs) -> None:
        kind = content.get("subscribe") if isinstance(content, dict) else None
        raw_id = content.get("id") if isinstance(content, dict) else None
        if kind not in KINDS or not isinstance(raw_id, int) or isinstance(raw_id, bool):
            await self.send_json({"type": "error", "error": USAGE})
            return
        group, snapshot = await self._authorise(kind, raw_id)
        if group is None:
            await self.send_json({"type": "refused", "subscribe": kind, "id": raw_id})
            return
        await self.channel_layer.group_add(group, self.channel_name)
        self.groups_joined.add(group)
        await self.send_json({"type": "subscribed", "subscribe": kind, "id": raw_id})
        if snapshot is not None:
            # The state as of now, so a page that reconnects after a drop catches up.
            await self.send_json(snapshot)

    @database_sync_to_async
    def _authorise(self, kind: str, pk: int) -> tuple[str | None, dict | None]:
        """The group to join and the current state to send, or (None, None) when the user may not see it."""
        if kind == "user":
            return (live.user_group(pk), None) if pk == self.user.pk else (None, None)
        if kind == "queue":
            # The API's rule: a queue's counts are for users with a project in its VDC (and platform admins).
            if not TaskQueue.objects.filter(pk=pk, vdc__in=visible_vdcs(self.user).values("pk")).exists():
                return None, None
            return live.queue_group(pk), {"type": "queue", "id": pk, **live.queue_counts([pk])[pk]}
        if kind == "project":
            project = Project.objects.filter(pk=pk).first()
            if project is None or not can_view(self.user, project):
                return None, None
            return live.project_group(pk), None
        task = Task.objects.select_related("project", "cluster").filter(pk=pk).first()
        if task is None or not can_view(self.user, task.project):
            return None, None
        return live.task_group(pk), live.task_payload(task)

    async def live_message(self, event: dict) -> None:
        await self.send_json(event["payload"])


# Terminal I/O blocks (a PTY, a Kubernetes exec stream): it runs in these threads, never on the event loop.
_TERMINAL_THREADS = ThreadPoolExecutor(max_workers=32, thread_name_prefix="terminal")
# Input frames larger than this are refused: a paste, not a file transfer.
_MAX_INPUT_BYTES = 64 * 1024


class TerminalConsumer(AsyncWebsocketConsumer):
    """The Web Console: relays a shell in one instance of a running task (``?instance=N``) to the page.

    Every refusal is an accepted socket closed at once with a 44xx code and the reason, so the page can
    say why. Client frames are JSON: ``{"input": "..."}`` or ``{"resize": [rows, cols]}``; the shell's
    output comes as binary frames.
    """

    # No groups, so no channel layer: a terminal does not depend on Redis, nor load it with a receive loop.
    channel_layer_alias = None
    terminal = None
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
            self.terminal = await self._in_thread(
                target.executor.open_terminal, target.external_id, target.instance, rows, cols
            )
        except access.Refused as refused:
            await self._refuse(refused.code, str(refused))
            return
        except ExecutorError as exc:
            await self._refuse(access.CLOSE_BACKEND, f"The backend could not open a terminal: {exc}")
            return
        await database_sync_to_async(access.record_terminal_opened)(task_id, user, instance)
        self.last_activity = asyncio.get_running_loop().time()
        self.pump = asyncio.create_task(self._relay_output(self.terminal))

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
        if self.terminal is not None:
            self.pump.cancel()
            await self._in_thread(self.terminal.close)


class ConnectSocketConsumer(AsyncWebsocketConsumer):
    """Connect's WebSocket half: relays a socket of the page to the same path on the task's port.

    Served under ``ws/tasks/<id>/connect/<port>/<path>`` and under the HTTP proxy's own prefix
    (``tasks/<id>/connect/<port>/<path>``), where a proxied page's scripts open their sockets. Same rules as
    the HTTP proxy; a refusal closes the handshake with 4000 + the HTTP status (4401, 4403, 4404, 4409, 4502).
    """

    channel_layer_alias = None
    upstream = None
    pump: asyncio.Task | None = None

    async def connect(self) -> None:
        kwargs = self.scope["url_route"]["kwargs"]
        task_id, port = int(kwargs["task_id"]), int(kwargs["port"])
        try:
            target = await database_sync_to_async(access.connect_target)(self.scope.get("user"), task_id, port)
            endpoint = await TerminalConsumer._in_thread(target.executor.port_endpoint, target.external_id, 0, port)
            self.upstream = await access.open_upstream_socket(endpoint, kwargs.get("path", ""), self.scope)
        except access.Refused as refused:
            await self.close(code=4000 + refused.code)
            return
        except (ExecutorError, OSError, TimeoutError, InvalidHandshake):
            await self.close(code=access.CLOSE_BACKEND)
            return
        await self.accept(subprotocol=self.upstream.subprotocol)
        self.pump = asyncio.create_task(self._relay())

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
        if self.pump is not None:
            self.pump.cancel()
        if self.upstream is not None:
            await self.upstream.close()
