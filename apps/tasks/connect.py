"""Connect's own origin: every task port is served at ``http(s)://<task>-<port>.<HCS_APPS_DOMAIN>/``, a host that
never receives the portal's cookies, and the portal hands the visitor over to it with a one-time ticket.

The hand-over (docs/console.md): the portal's ``/tasks/<id>/connect/<port>/<path>`` checks the visitor's session,
signs a ticket (user, task, port, where to go, a nonce) valid for ``TICKET_MAX_AGE_S`` and redirects to the app
host's ``EXCHANGE_PATH``. There the ticket is redeemed once (its nonce is claimed in Redis) for the app host's own
cookie, scoped to that host alone, and the browser goes on to the path on the app's own origin. The app host
accepts nothing else (not the portal's session), and the portal never accepts the app cookie.
"""

from __future__ import annotations

import functools
import re
import secrets
from urllib.parse import quote, urljoin, urlsplit, urlunsplit

import redis
from django.conf import settings
from django.contrib.auth import get_user_model
from django.core import signing
from django.http.request import split_domain_port
from django.utils.crypto import constant_time_compare, salted_hmac

from apps.tasks.access import PATH_SAFE, Refused

# The app host's path that redeems a ticket; it is answered by the portal's code and never reaches the app.
EXCHANGE_PATH = "/_hcs/connect"
TICKET_MAX_AGE_S = 60
COOKIE_MAX_AGE_S = 12 * 3600
_TICKET_SALT = "hcs.connect.ticket"
_COOKIE_SALT = "hcs.connect.app-cookie"
_NONCE_KEY = "hcs:connect:ticket:{nonce}"
_APP_LABEL = re.compile(r"^(?P<task>[1-9][0-9]{0,17})-(?P<port>[1-9][0-9]{0,4})$")

# What every answer of an app host carries: it may frame only itself and be framed only by itself, its scripts may
# fetch, open sockets and post forms to its own origin only (so never to the portal), it shares no browsing
# context group with other origins, and other origins cannot embed its resources.
APP_POLICY = (
    "connect-src 'self'; form-action 'self'; frame-ancestors 'self'; frame-src 'self' blob: data:; base-uri 'self'"
)
APP_HEADERS = {
    "Cross-Origin-Opener-Policy": "same-origin",
    "Cross-Origin-Resource-Policy": "same-origin",
    "X-Frame-Options": "SAMEORIGIN",
    "X-Content-Type-Options": "nosniff",
}


def apps_domain() -> str:
    """The apps domain without its port (``apps.localhost``)."""
    return settings.HCS_APPS_DOMAIN.partition(":")[0]


def under_apps_domain(host: str) -> bool:
    """Whether ``host`` (a Host header, port allowed) is the apps domain or one of its names."""
    name = split_domain_port(host)[0] if host else ""
    return name == apps_domain() or name.endswith("." + apps_domain())


def app_of_host(host: str) -> tuple[int, int] | None:
    """The (task id, port) an app host names (``12-8888.apps.example.org``), or None for any other host."""
    name = split_domain_port(host)[0] if host else ""
    label, _, domain = name.partition(".")
    match = _APP_LABEL.match(label)
    if domain != apps_domain() or match is None or int(match["port"]) > 65535:
        return None
    return int(match["task"]), int(match["port"])


def app_origin(request, task_id: int, port: int) -> str:
    """The origin of a task's port, as seen from a portal request: same scheme, and the port the portal was reached
    on unless ``HCS_APPS_DOMAIN`` names one."""
    domain, _, domain_port = settings.HCS_APPS_DOMAIN.partition(":")
    web_port = domain_port or split_domain_port(request.get_host())[1]
    return f"{request.scheme}://{task_id}-{port}.{domain}" + (f":{web_port}" if web_port else "")


def local_path(path: str, query: str = "") -> str:
    """``path`` (decoded, as a URL route gives it) as a path on the app's own origin: one leading slash, every
    character that could change the authority (``\\``, a second ``/`` at the start) escaped or dropped."""
    return "/" + quote(path.lstrip("/"), safe=PATH_SAFE) + (f"?{query}" if query else "")


def local_location(location: str, request_url: str, upstream_origin: str) -> str | None:
    """A service's ``Location`` kept on the app's own origin: relative, or absolute to the service itself or to
    the app host, it becomes a local path (with its query and fragment); anywhere else gives None."""
    target = urlsplit(urljoin(request_url, location.strip()))
    app = urlsplit(request_url)
    if f"{target.scheme}://{target.netloc}" not in (upstream_origin, f"{app.scheme}://{app.netloc}"):
        return None
    path = "/" + quote(target.path.lstrip("/"), safe=PATH_SAFE + "%")
    return urlunsplit(("", "", path, target.query, target.fragment))


# --- the ticket: once, within a minute, for one task port ---------------------------------------------------


def issue_ticket(user, task_id: int, port: int, path: str, query: str = "", back: str = "") -> str:
    """A signed ticket that lets ``user`` into port ``port`` of task ``task_id`` once, then on to ``path``; ``back``
    is the task's page in the portal (absolute), which the app host's own error pages link to."""
    payload = {"u": user.pk, "t": task_id, "p": port, "to": local_path(path, query), "n": secrets.token_urlsafe(16)}
    if back:
        payload["b"] = back
    return signing.dumps(payload, salt=_TICKET_SALT, compress=True)


@functools.cache
def _redis(url: str) -> redis.Redis:
    return redis.Redis.from_url(url, socket_connect_timeout=0.5, socket_timeout=0.5)


def redeem_ticket(ticket: str, task_id: int, port: int) -> tuple[int, str, str]:
    """The user id, the local path and the portal's task page of a ticket for this task port, claimed so it never
    works again; Refused
    (HTTP status and why) for a ticket that is forged, expired, for another app or already used."""
    try:
        payload = signing.loads(ticket, salt=_TICKET_SALT, max_age=TICKET_MAX_AGE_S)
    except signing.SignatureExpired:
        raise Refused(403, "This Connect link has expired: open the app again from its task's page in the portal.")
    except signing.BadSignature:
        raise Refused(403, "This is not a valid Connect link: open the app from its task's page in the portal.")
    if (payload.get("t"), payload.get("p")) != (task_id, port):
        raise Refused(403, "This Connect link is for another app.")
    try:
        claimed = _redis(settings.REDIS_URL).set(
            _NONCE_KEY.format(nonce=payload["n"]), "1", nx=True, ex=TICKET_MAX_AGE_S + 5
        )
    except redis.RedisError:
        raise Refused(503, "Connect cannot check the link just now: open the app again in a moment.")
    if not claimed:
        raise Refused(403, "This Connect link was already used: open the app again from its task's page in the portal.")
    return payload["u"], payload["to"], payload.get("b", "")


# --- the app cookie: this host only, for the user who redeemed the ticket ---------------------------------------


def cookie_name(secure: bool) -> str:
    """The app cookie's name; over HTTPS with the ``__Host-`` prefix, which browsers accept from that host only."""
    return "__Host-hcs-app" if secure else "hcs-app"


def reserved_cookies() -> frozenset[str]:
    """Cookies a service never sees nor sets: the app cookie and any named like the portal's own."""
    return frozenset({cookie_name(True), cookie_name(False), settings.SESSION_COOKIE_NAME, settings.CSRF_COOKIE_NAME})


def _user_mark(user) -> str:
    # Changes with the password, like a portal session: a new password ends the user's app cookies too.
    return salted_hmac(_COOKIE_SALT, user.get_session_auth_hash()).hexdigest()[:20]


def app_cookie(user, task_id: int, port: int, back: str = "") -> str:
    """The app cookie's value: who the visitor is, for which task port (and the portal's task page, for links)."""
    payload = {"u": user.pk, "t": task_id, "p": port, "m": _user_mark(user)}
    if back:
        payload["b"] = back
    return signing.dumps(payload, salt=_COOKIE_SALT)


def app_cookie_back(value: str | None, task_id: int, port: int) -> str:
    """The portal's task page an app cookie of this task port names (signed by the portal, so never a link of
    someone else's choosing); empty without one."""
    if not value:
        return ""
    try:
        payload = signing.loads(value, salt=_COOKIE_SALT, max_age=COOKIE_MAX_AGE_S)
    except signing.BadSignature:
        return ""
    if (payload.get("t"), payload.get("p")) != (task_id, port):
        return ""
    back = payload.get("b", "")
    return back if isinstance(back, str) and back.startswith(("https://", "http://")) else ""


def app_cookie_user(value: str | None, task_id: int, port: int):
    """The active user an app cookie names, if it is genuine, recent and for this task port; else None.

    Whether that user may still reach the port is for :func:`apps.tasks.access.connect_target` to say, on every
    request.
    """
    if not value:
        return None
    try:
        payload = signing.loads(value, salt=_COOKIE_SALT, max_age=COOKIE_MAX_AGE_S)
    except signing.BadSignature:
        return None
    if (payload.get("t"), payload.get("p")) != (task_id, port):
        return None
    user = get_user_model().objects.filter(pk=payload.get("u"), is_active=True).first()
    if user is None or not constant_time_compare(payload.get("m", ""), _user_mark(user)):
        return None
    return user
