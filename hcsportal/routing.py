"""WebSocket routes (live task and queue updates; the Web Console of running tasks)."""

from django.urls import path

from apps.tasks.consumers import LiveConsumer, TerminalConsumer

websocket_urlpatterns: list = [
    path("ws/live/", LiveConsumer.as_asgi()),
    path("ws/tasks/<int:task_id>/terminal/", TerminalConsumer.as_asgi()),
]
