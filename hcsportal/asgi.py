"""ASGI entry point: HTTP through Django, WebSocket through Channels behind auth and origin checks (an API token
for clients that are not browsers, hcsportal/socket_tokens.py); sockets of Connect's app hosts go to Connect alone
(hcsportal/hosts.py)."""

import os

from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "hcsportal.settings")
# Django must be set up before the routing (and the consumers' models) are imported.
django_asgi_app = get_asgi_application()

from channels.auth import AuthMiddlewareStack  # noqa: E402
from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402
from channels.sessions import CookieMiddleware  # noqa: E402

from apps.tasks.consumers import ConnectSocketConsumer  # noqa: E402
from hcsportal.hosts import HostRouter  # noqa: E402
from hcsportal.origins import OriginValidator  # noqa: E402
from hcsportal.routing import websocket_urlpatterns  # noqa: E402
from hcsportal.socket_tokens import TokenHandshakes  # noqa: E402

application = ProtocolTypeRouter(
    {
        "http": django_asgi_app,
        "websocket": HostRouter(
            portal=TokenHandshakes(
                URLRouter(websocket_urlpatterns),
                browsers=OriginValidator(AuthMiddlewareStack(URLRouter(websocket_urlpatterns))),
            ),
            apps=CookieMiddleware(ConnectSocketConsumer.as_asgi()),
        ),
    }
)
