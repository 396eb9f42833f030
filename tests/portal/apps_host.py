"""Test clients for Connect's app hosts (``<task>-<port>.<HCS_APPS_DOMAIN>``): one host name, optionally holding a
user's app cookie as the hand-over would have set it."""

from __future__ import annotations

from django.conf import settings
from django.test import AsyncClient, Client

from apps.tasks import connect


def app_host(task, port: int) -> str:
    return f"{task.pk}-{port}.{settings.HCS_APPS_DOMAIN}"


class HostClient(AsyncClient):
    """An async test client that asks for one host name (Django's puts its own Host header before any other)."""

    def __init__(self, host: str, **kwargs):
        super().__init__(**kwargs)
        self.host = host.encode()

    async def request(self, **request):
        request["headers"] = [(k, v) for k, v in request["headers"] if k != b"host"] + [(b"host", self.host)]
        return await super().request(**request)


def app_clients(user, task, port: int) -> tuple[Client, HostClient]:
    """A plain and an async client of the task port's app host, each with ``user``'s app cookie."""
    host, cookie = app_host(task, port), connect.app_cookie(user, task.pk, port)
    sync, client = Client(HTTP_HOST=host), HostClient(host)
    for each in (sync, client):
        each.cookies[connect.cookie_name(secure=False)] = cookie
    return sync, client
