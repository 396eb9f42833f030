"""WebSocket routes (live task and queue updates; the Web Console of running tasks)."""

from django.urls import path, re_path

from apps.tasks.consumers import ConnectSocketConsumer, LiveConsumer, TerminalConsumer

websocket_urlpatterns: list = [
    path("ws/live/", LiveConsumer.as_asgi()),
    path("ws/tasks/<int:task_id>/terminal/", TerminalConsumer.as_asgi()),
    # Connect's sockets: under ws/, and under the HTTP proxy's prefix, where proxied pages open theirs.
    re_path(
        r"^(?:ws/)?tasks/(?P<task_id>[0-9]+)/connect/(?P<port>[0-9]{1,5})/(?P<path>.*)$",
        ConnectSocketConsumer.as_asgi(),
    ),  # fmt: skip
]
