"""Ways into running work (Web Console, Connect): who may open a shell in a task or reach one of its ports,
and the timeline entries they leave.

The rules are ``apps.vdc.policy``'s: owners and members reach into a task as the job, viewers only read it,
outsiders do not see it at all. A terminal runs commands as the job, so it is an action, not a read; staff
holding ``tasks.open_any_console`` get a visitor's shell instead, without the job's secrets.
"""

from __future__ import annotations

import contextlib
import functools
import ssl
from dataclasses import dataclass
from urllib.parse import quote

import httpx
from django.db import transaction
from django.urls import reverse
from websockets.asyncio.client import connect as ws_connect
from websockets.asyncio.client import unix_connect

from apps.clusters.backends import executor_for
from apps.clusters.executors.base import Endpoint, Executor, ExecutorError, JobState
from apps.clusters.executors.local import ide_port
from apps.tasks.choices import ASLEEP, WAITING, EventKind, TaskKind, TaskStatus
from apps.tasks.models import Task
from apps.tasks.services import record_event
from apps.vdc import policy

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
    """Where a terminal goes: the executor of the task's cluster and the job's id there; ``visitor`` for a shell
    without the job's secrets (a user outside the project)."""

    task_id: int
    project_id: int
    executor: Executor
    external_id: str
    instance: int
    visitor: bool = False

    def open(self, rows: int, cols: int):
        """The shell (blocking): the job's own, or a visitor's."""
        if self.visitor:
            return self.executor.open_visitor_terminal(self.external_id, self.instance, rows, cols)
        return self.executor.open_terminal(self.external_id, self.instance, rows, cols)


def terminal_target(user, task_id: int, instance: int) -> TerminalTarget:
    """Check that ``user`` may open a shell in instance ``instance`` of task ``task_id`` now; Refused otherwise."""
    if user is None or not user.is_authenticated:
        raise Refused(CLOSE_UNAUTHENTICATED, "Log in to open a terminal.")
    task = Task.objects.select_related("project", "cluster").filter(pk=task_id).first()
    if task is None or not policy.can_view(user, task.project, policy.VIEW_TASK):
        raise Refused(CLOSE_NOT_FOUND, "No such task.")
    console = policy.console_access(user, task.project)
    if console is None:
        raise Refused(CLOSE_FORBIDDEN, console_refusal(user, task.project))
    if task.status != TaskStatus.RUNNING or not task.external_id or task.cluster is None:
        raise Refused(CLOSE_NOT_RUNNING, f"The task is {task.get_status_display().lower()}, not running.")
    if not 0 <= instance < max(task.instances, 1):
        raise Refused(CLOSE_BAD_REQUEST, f"The task has instances 0 to {max(task.instances, 1) - 1}.")
    executor = executor_for(task.cluster)
    visitor = console == policy.VISITOR_CONSOLE
    if visitor and not executor.visitor_terminals:
        kind = task.cluster.get_cluster_type_display()
        raise Refused(
            CLOSE_FORBIDDEN,
            f"A visitor's Web Console (for users outside project {task.project}) is "
            f"only offered where it can hide the job's secrets: not on {kind} clusters. Ask an owner or "
            "member of the project.",
        )
    return TerminalTarget(task.pk, task.project_id, executor, task.external_id, instance, visitor)


def console_refusal(user, project) -> str:
    """Why the user may open no Web Console in the project's tasks."""
    if policy.project_role(user, project) is not None:
        return "Project viewers cannot open a terminal: it runs commands as the job."
    return (
        f"You are not an owner or member of project {project}: opening a Web Console into its tasks needs "
        "the permission to open any project's console."
    )


def terminal_access_lost(user_id: int, target: TerminalTarget) -> str | None:
    """Why an open Web Console must close now (its user left the project, lost the role or the permission, or
    was deactivated); None while the policy still lets it stay open the way it was opened."""
    user = policy.fresh_user(user_id)
    if user is None:
        return "Your account is no longer active."
    console = policy.console_access(user, target.project_id)
    # A visitor's shell may stay open under either right; the job's own shell only while its user is owner or member.
    if console is None or (console == policy.VISITOR_CONSOLE and not target.visitor):
        return "Your access to this task's project was withdrawn."
    return None


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


@functools.cache
def upstream_tls() -> ssl.SSLContext:
    """The SSL context every client Connect opens to a task's port is given. Those connections are plain HTTP (the
    host's loopback or a unix socket into the job's network), but httpx builds a context for each transport and
    client it creates unless handed one, loading the CA bundle: about 30 ms of CPU per proxied request, enough to
    put a busy host's proxy behind the load it relays (and the autoscaler's request rates with it). One context,
    made once, serves them all."""
    return httpx.create_ssl_context()


def upstream_transport(endpoint: Endpoint) -> httpx.AsyncHTTPTransport:
    """A transport to the task's port (through its unix socket where it has one) for one proxied request."""
    return httpx.AsyncHTTPTransport(uds=endpoint.uds, verify=upstream_tls())


# How long the monitoring page waits for a dev environment's IDE to answer before it says the IDE is not up.
IDE_PROBE_TIMEOUT_S = 1.0


def ide_not_answering(task: Task) -> str:
    """Why a running dev environment's IDE cannot be opened now ("nothing answers on port 8888 yet"), or "" when
    its port answers HTTP (any status): the monitoring page offers Connect only then (docs/console.md)."""
    port = task.port or ide_port(task.ide_type or "jupyter")
    if not port or task.cluster is None or not task.external_id:
        return "the task has no IDE port to connect to"
    try:
        endpoint = executor_for(task.cluster).port_endpoint(task.external_id, 0, port)
    except ExecutorError as exc:
        return f"port {port} cannot be reached: {exc}"
    transport = httpx.HTTPTransport(uds=endpoint.uds, verify=upstream_tls())
    try:
        with httpx.Client(
            transport=transport, verify=upstream_tls(), timeout=IDE_PROBE_TIMEOUT_S, follow_redirects=False
        ) as client:
            client.head(f"http://{endpoint.host}:{endpoint.port}/")
    except httpx.HTTPError:
        return f"nothing answers on port {port} yet"
    return ""


@dataclass(frozen=True)
class ServiceFacts:
    """What an inference service's monitoring page shows: where to reach it and how many replicas run."""

    app_url: str  # its port on its own origin through Connect (every backend), for a browser after the hand-over
    addresses: list[str]  # on the backend: the Ingress host, the in-cluster Service, the node's port
    replicas: int  # running now
    desired_replicas: int  # what the backend (or its autoscaler) is set to run


def service_facts(task: Task, state: JobState | None, app_origin: str) -> ServiceFacts | None:
    """The endpoint and replicas of an inference task (None for other kinds), from the backend's own state when
    it has one (a Deployment's ready and desired replicas, after its HPA). ``app_origin`` is the origin Connect
    serves the task's port at."""
    if task.kind != TaskKind.INFERENCE:
        return None
    running = task.status == TaskStatus.RUNNING
    # A service that scales to zero is reachable while asleep or waking too: a request wakes it and waits.
    reachable = running or (task.scales_to_zero and task.status in WAKING)
    app_url = app_origin.rstrip("/") + "/" if task.port and reachable else ""
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
    return ServiceFacts(app_url, addresses, current, desired)


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


# A service that scales to zero and is in one of these has no replica to serve now, but will have (asleep, woken
# and waiting for its placement, or starting): Connect's proxy holds its requests (docs/tasks.md "Scale to zero").
WAKING = (*ASLEEP, *WAITING, TaskStatus.SCHEDULED, TaskStatus.STARTING, TaskStatus.RUNNING)


class Waking(Refused):
    """The service scales to zero and has no serving replica now; a request may wake it and wait for one."""

    def __init__(self, task: Task):
        status = task.get_status_display().lower()
        super().__init__(409, f"The service is {status}; a request through Connect wakes it.")
        self.asleep = task.is_asleep


def connect_target(user, task_id: int, port: int) -> ConnectTarget:
    """Check that ``user`` may reach ``port`` of task ``task_id`` (instance 0) now; Refused otherwise.

    The codes are HTTP statuses here: 404 for tasks the user cannot see, 403 for viewers, 409 when not running
    (:class:`Waking` for a service that scales to zero and has no serving replica yet).
    """
    if user is None or not user.is_authenticated:
        raise Refused(401, "Log in to connect.")
    task = Task.objects.select_related("project", "cluster").filter(pk=task_id).first()
    if task is None or not policy.can_view(user, task.project, policy.VIEW_TASK):
        raise Refused(404, "No such task.")
    if not policy.can_enter(user, task.project):
        raise Refused(403, "Only owners and members of the project connect to its tasks' services.")
    if port not in connectable_ports(task):
        allowed = ", ".join(map(str, connectable_ports(task)))
        raise Refused(403, f"Port {port} is not a port of this task (its ports: {allowed}).")
    if task.status != TaskStatus.RUNNING or not task.external_id or task.cluster is None:
        if task.scales_to_zero and task.status in WAKING:
            raise Waking(task)
        raise Refused(409, f"The task is {task.get_status_display().lower()}, not running.")
    executor = executor_for(task.cluster)
    portal_scaled = task.autoscale_desired is not None and executor.scales_services
    replicas = len(task.placement or []) if portal_scaled else 1
    return ConnectTarget(task.pk, executor, task.external_id, port, max(replicas, 1))


def waking(task_id: int) -> bool:
    """Whether the task is a service that scales to zero and has no running job now (asleep or on its way back)."""
    task = Task.objects.filter(pk=task_id).only("kind", "scale_to_zero_after_s", "status", "external_id").first()
    if task is None or not task.scales_to_zero or task.status not in WAKING:
        return False
    return task.status != TaskStatus.RUNNING or not task.external_id


def check_connect(user, task_id: int, port: int) -> None:
    """:func:`connect_target`'s check for a hand-over (Connect link, ticket, its exchange): a service scaled to zero
    passes, since the visitor's first request wakes it."""
    with contextlib.suppress(Waking):
        connect_target(user, task_id, port)


# Path characters passed on as written (RFC 3986 pchar and "/").
PATH_SAFE = "/:@!$&'()*+,;=-._~"


def upstream_cookies(cookies: dict[str, str], reserved: frozenset[str]) -> str:
    """The browser's cookies minus ``reserved`` ones, as a Cookie header ("" for none)."""
    return "; ".join(f"{name}={value}" for name, value in cookies.items() if name not in reserved)


async def open_upstream_socket(endpoint: Endpoint, path: str, scope: dict, reserved: frozenset[str]):
    """A WebSocket to ``path`` on the task's port, with the page's query, subprotocols and the service's own
    cookies (not the ``reserved`` ones); no Origin (the service sees a direct client)."""
    query = scope.get("query_string", b"").decode()
    uri = f"ws://{endpoint.host}:{endpoint.port}/{quote(path.lstrip('/'), safe=PATH_SAFE)}"
    uri += f"?{query}" if query else ""
    cookie = upstream_cookies(scope.get("cookies") or {}, reserved)
    options = {
        "additional_headers": {"Cookie": cookie} if cookie else None,
        "subprotocols": scope.get("subprotocols") or None,
        "open_timeout": 10,
        "max_size": 16 * 2**20,
    }
    if endpoint.uds:
        return await unix_connect(endpoint.uds, uri, **options)
    return await ws_connect(uri, **options)


def record_connect_opened(task_id: int, user, port: int) -> None:
    """The timeline says who was let into a port of the task through Connect."""
    with transaction.atomic():
        task = Task.objects.get(pk=task_id)
        record_event(
            task,
            EventKind.STATUS,
            f"Connect to port {port} opened by {user.username}",
            actor=user,
            data={"access": "connect", "port": port},
        )


def record_terminal_opened(task_id: int, user, instance: int, visitor: bool = False) -> None:
    """The timeline says who opened a shell in the task, in which instance, and whether as a visitor (a user
    outside the project, by the permission to open any project's console)."""
    message = f"Web Console opened by {user.username} on instance {instance}"
    if visitor:
        message += " as a visitor (not in the project; a shell without the job's secrets)"
    with transaction.atomic():
        task = Task.objects.get(pk=task_id)
        record_event(
            task,
            EventKind.STATUS,
            message,
            actor=user,
            data={"access": "terminal", "instance": instance, "visitor": visitor},
        )
