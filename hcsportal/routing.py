"""WebSocket routes (live task and queue updates)."""

websocket_urlpatterns: list = []
