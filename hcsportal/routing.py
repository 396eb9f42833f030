"""WebSocket routes of the portal (live task and queue updates; the Web Console of running tasks). Connect's
sockets are on the app hosts (hcsportal/hosts.py)."""

from django.urls import path

from apps.tasks.consumers import LiveConsumer, TerminalConsumer

websocket_urlpatterns: list = [
    path("ws/live/", LiveConsumer.as_asgi()),
    path("ws/tasks/<int:task_id>/terminal/", TerminalConsumer.as_asgi()),
]
