"""Ways into running work (Web Console, Connect): who may open a shell in a task or reach one of its ports,
and the timeline entry a shell leaves.

The rules are the project's: owners, members and platform admins act on a task, viewers only read it,
outsiders do not see it at all. A terminal runs commands as the job, so it is an action, not a read.
"""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import quote

from django.conf import settings
from django.db import transaction
from django.urls import reverse
from websockets.asyncio.client import connect as ws_connect
from websockets.asyncio.client import unix_connect

from apps.clusters.backends import executor_for
from apps.clusters.executors.base import Endpoint, Executor, JobState
from apps.clusters.executors.local import ide_port
from apps.tasks.choices import EventKind, TaskKind, TaskStatus
from apps.tasks.models import Task
from apps.tasks.services import record_event
from apps.vdc.services import can_act, can_view

# Close codes of the terminal socket (4000-4999 are the application's): the page shows the reason beside them.
CLOSE_UNAUTHENTICATED = 4401
CLOSE_FORBIDDEN = 4403
CLOSE_NOT_FOUND = 4404
CLOSE_NOT_RUNNING = 4409
CLOSE_BAD_REQUEST = 4400
CLOSE_BACKEND = 4502


class Refused(Exception):
    """The user may not open a terminal here; ``code`` is the socket's close code, the message says why."""

    def __init__(self, code: int, message: str):
        super().__init__(message)
        self.code = code


@dataclass(frozen=True)
class TerminalTarget:
    """Where a terminal goes: the executor of the task's cluster and the job's id there."""

    task_id: int
    executor: Executor
    external_id: str
    instance: int


def terminal_target(user, task_id: int, instance: int) -> TerminalTarget:
    """Check that ``user`` may open a shell in instance ``instance`` of task ``task_id`` now; Refused otherwise."""
    if user is None or not user.is_authenticated:
        raise Refused(CLOSE_UNAUTHENTICATED, "Log in to open a terminal.")
    task = Task.objects.select_related("project", "cluster").filter(pk=task_id).first()
    if task is None or not can_view(user, task.project):
        raise Refused(CLOSE_NOT_FOUND, "No such task.")
    if not can_act(user, task.project):
        raise Refused(CLOSE_FORBIDDEN, "Project viewers cannot open a terminal: it runs commands as the job.")
    if task.status != TaskStatus.RUNNING or not task.external_id or task.cluster is None:
        raise Refused(CLOSE_NOT_RUNNING, f"The task is {task.get_status_display().lower()}, not running.")
    if not 0 <= instance < max(task.instances, 1):
        raise Refused(CLOSE_BAD_REQUEST, f"The task has instances 0 to {max(task.instances, 1) - 1}.")
    return TerminalTarget(task.pk, executor_for(task.cluster), task.external_id, instance)


TENSORBOARD_PORT = 6006


def connectable_ports(task: Task) -> list[int]:
    """Ports of a task the portal proxies: the task's own port, its IDE's, and TensorBoard's."""
    ports = {TENSORBOARD_PORT}
    if task.port:
        ports.add(task.port)
    if task.kind == TaskKind.DEV_ENV:
        ports.add(task.port or ide_port(task.ide_type or "jupyter"))
    return sorted(ports)


def connect_url(task: Task, port: int, path: str = "") -> str:
    """The portal's URL of ``port`` of the task (contract: ``/tasks/<id>/connect/<port>/<path>``)."""
    return reverse("portal:task-connect", args=[task.pk, port, path])


def ide_connect_url(task: Task) -> str:
    """Where the Connect button of a dev environment goes: its IDE's port through the proxy."""
    if task.kind != TaskKind.DEV_ENV:
        return ""
    port = task.port or ide_port(task.ide_type or "jupyter")
    return connect_url(task, port) if port else ""


@dataclass(frozen=True)
class ServiceFacts:
    """What an inference service's monitoring page shows: where to reach it and how many replicas run."""

    proxied_url: str  # through the portal (every backend), for a browser or a script with the user's session
    addresses: list[str]  # on the backend: the Ingress host, the in-cluster Service, the node's port
    replicas: int  # running now
    desired_replicas: int  # what the backend (or its autoscaler) is set to run


def service_facts(task: Task, state: JobState | None, site_root: str) -> ServiceFacts | None:
    """The endpoint and replicas of an inference task (None for other kinds), from the backend's own state when
    it has one (a Deployment's ready and desired replicas, after its HPA)."""
    if task.kind != TaskKind.INFERENCE:
        return None
    running = task.status == TaskStatus.RUNNING
    proxied = site_root.rstrip("/") + connect_url(task, task.port) if task.port and running else ""
    addresses = []
    for obj in state.objects if state is not None else ():
        if obj.get("kind") == "Ingress" and obj.get("host"):
            addresses.append(f"http://{obj['host']}/")
        elif obj.get("kind") == "Deployment" and obj.get("namespace") and task.port:
            addresses.append(f"{obj['name']}.{obj['namespace']}.svc:{task.port} (in the cluster)")
    if running and task.port and task.cluster is not None and task.cluster.cluster_type == "slurm":
        addresses += [f"{node}:{task.port}" for node in task.node_names]
    current = state.replicas if state is not None and state.replicas is not None else None
    if current is None:
        current = (task.replicas or task.instances) if running else 0
    desired = state.desired_replicas if state is not None and state.desired_replicas is not None else None
    if desired is None:
        desired = (task.replicas or task.instances) if not task.is_final else 0
    return ServiceFacts(proxied, addresses, current, desired)


@dataclass(frozen=True)
class ConnectTarget:
    """Where a proxied request goes: the executor of the task's cluster, the job's id there and the port."""

    task_id: int
    executor: Executor
    external_id: str
    port: int
    # Replicas the proxy spreads requests over: those of a service the portal scales itself, else 1 (instance 0;
    # a Kubernetes Service balances its own replicas).
    replicas: int = 1


def connect_target(user, task_id: int, port: int) -> ConnectTarget:
    """Check that ``user`` may reach ``port`` of task ``task_id`` (instance 0) now; Refused otherwise.

    The codes are HTTP statuses here: 404 for tasks the user cannot see, 403 for viewers, 409 when not running.
    """
    if user is None or not user.is_authenticated:
        raise Refused(401, "Log in to connect.")
    task = Task.objects.select_related("project", "cluster").filter(pk=task_id).first()
    if task is None or not can_view(user, task.project):
        raise Refused(404, "No such task.")
    if not can_act(user, task.project):
        raise Refused(403, "Project viewers cannot connect to a task's services.")
    if port not in connectable_ports(task):
        allowed = ", ".join(map(str, connectable_ports(task)))
        raise Refused(403, f"Port {port} is not a port of this task (its ports: {allowed}).")
    if task.status != TaskStatus.RUNNING or not task.external_id or task.cluster is None:
        raise Refused(409, f"The task is {task.get_status_display().lower()}, not running.")
    replicas = len(task.live_placement) if task.autoscale_desired is not None else 1
    return ConnectTarget(task.pk, executor_for(task.cluster), task.external_id, port, max(replicas, 1))


# Path characters passed on as written (RFC 3986 pchar and "/").
PATH_SAFE = "/:@!$&'()*+,;=-._~"


def upstream_cookies(cookies: dict[str, str]) -> str:
    """The browser's cookies minus the portal's session and CSRF cookies, as a Cookie header ("" for none)."""
    portal_cookies = {settings.SESSION_COOKIE_NAME, settings.CSRF_COOKIE_NAME}
    return "; ".join(f"{name}={value}" for name, value in cookies.items() if name not in portal_cookies)


async def open_upstream_socket(endpoint: Endpoint, path: str, scope: dict):
    """A WebSocket to ``path`` on the task's port, with the page's query, subprotocols and the service's own
    cookies; no Origin (the service sees a direct client) and none of the portal's credentials."""
    query = scope.get("query_string", b"").decode()
    uri = f"ws://{endpoint.host}:{endpoint.port}/{quote(path, safe=PATH_SAFE)}" + (f"?{query}" if query else "")
    cookie = upstream_cookies(scope.get("cookies") or {})
    options = {
        "additional_headers": {"Cookie": cookie} if cookie else None,
        "subprotocols": scope.get("subprotocols") or None,
        "open_timeout": 10,
        "max_size": 16 * 2**20,
    }
    if endpoint.uds:
        return await unix_connect(endpoint.uds, uri, **options)
    return await ws_connect(uri, **options)


def record_terminal_opened(task_id: int, user, instance: int) -> None:
    """The timeline says who opened a shell in the task, and in which instance."""
    with transaction.atomic():
        task = Task.objects.get(pk=task_id)
        record_event(task, EventKind.STATUS, f"Web Console opened by {user.username} on instance {instance}",
                     actor=user, data={"access": "terminal", "instance": instance})  # fmt: skip
