"""WebSocket routes (live task and queue updates)."""

from django.urls import path

from apps.tasks.consumers import LiveConsumer

websocket_urlpatterns: list = [path("ws/live/", LiveConsumer.as_asgi())]
