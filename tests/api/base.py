"""A shared base for API tests: declare a resource once, get create / read / update / delete / permission tests.

A :class:`Resource` says where a resource lives, how to make one object of it in the test world, what a
create and an update send, and which roles may read, create, update and delete. ``test_permissions``
turns every declaration into a matrix over the roles admin (a superuser), owner, member, viewer, outsider and
staff (a staff user holding every view permission and no other: it reads every object and writes none).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from django.db.models import Model
from rest_framework.test import APIClient

API = "/api/v1/"
ROLES = ("admin", "owner", "member", "viewer", "outsider", "staff")
VIEW_STAFF = "staff"
EVERYONE = frozenset(ROLES)
PROJECT_ROLES = frozenset({"admin", "owner", "member", "viewer"})
ADMIN = frozenset({"admin"})


def client_for(user) -> APIClient:
    """An API client logged in as ``user`` (None: anonymous)."""
    client = APIClient()
    if user is not None:
        client.force_authenticate(user)
    return client


@dataclass(frozen=True)
class Resource:
    """One API resource as the permission matrix sees it.

    ``make(world)`` creates the object the read / update / delete tests act on; ``readers`` are the roles
    that see it (everyone else gets 404, as if it did not exist). ``create`` / ``update`` build request
    bodies; None means the resource does not take that method (405). Roles that may read but not write get
    403; ``create_denied`` overrides the status of a refused create (e.g. 400 for a project you cannot see).
    """

    path: str
    make: Callable[[object], Model]
    readers: frozenset[str]
    create: Callable[[object], dict] | None = None
    creators: frozenset[str] = ADMIN
    create_denied: Mapping[str, int] = field(default_factory=dict)
    update: Callable[[object], dict] | None = None
    updaters: frozenset[str] = ADMIN
    # The object the update test acts on, when an update needs another state than ``make`` gives (default: make).
    make_for_update: Callable[[object], Model] | None = None
    deleters: frozenset[str] | None = ADMIN

    def __str__(self) -> str:
        return self.path

    @property
    def list_url(self) -> str:
        return f"{API}{self.path}/"

    def detail_url(self, obj: Model) -> str:
        return f"{API}{self.path}/{obj.pk}/"

    def reads(self, role: str) -> bool:
        """Whether ``role`` sees the object: its readers, and view-only staff, who see every object."""
        return role in self.readers or role == VIEW_STAFF

    def expected_read(self, role: str) -> int:
        return 200 if self.reads(role) else 404

    def expected_create(self, role: str) -> int:
        if self.create is None:
            return 405
        return 201 if role in self.creators else self.create_denied.get(role, 403)

    def expected_write(self, role: str, allowed: frozenset[str] | None, supported: bool) -> int:
        if not supported:
            return 405
        if not self.reads(role):
            return 404
        return 0 if role in (allowed or ()) else 403

    def expected_update(self, role: str) -> int:
        status = self.expected_write(role, self.updaters, self.update is not None)
        return status or 200

    def expected_delete(self, role: str) -> int:
        status = self.expected_write(role, self.deleters, self.deleters is not None)
        return status or 204


def same(sent, returned) -> bool:
    """Whether a value the API returned is the one sent (decimals come back as strings, maybe longer)."""
    if isinstance(sent, str) and isinstance(returned, str) and sent.replace(".", "").isdigit():
        return float(sent) == float(returned)
    return sent == returned
