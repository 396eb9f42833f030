"""The one live socket (``ws/live/``): authenticate, check each subscription, join groups, relay."""

from __future__ import annotations

from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncJsonWebsocketConsumer

from apps.queues.models import TaskQueue
from apps.tasks import live
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
