"""Connect: a running task's declared port on an origin of its own, ``<task>-<port>.<HCS_APPS_DOMAIN>``.

The portal's ``/tasks/<id>/connect/<port>/<path>`` hands an owner or member over with a one-time ticket; the app
host trades it for a cookie of its own and proxies to the port. Viewers, outsiders, anonymous users, undeclared
ports and ended tasks are refused, neither site accepts the other's credentials, redirects stay on the app's
origin, and the portal's own credentials never reach the job.
"""

from __future__ import annotations

import asyncio
import json
import time
from urllib.parse import urlsplit

import pytest
from channels.db import database_sync_to_async
from channels.testing import WebsocketCommunicator
from django.conf import settings
from django.core import signing
from django.test import AsyncClient
from django.urls import reverse

from apps.clusters.executors.base import JobPhase, JobState
from apps.tasks import connect
from apps.tasks.access import connectable_ports, service_facts
from apps.tasks.models import Task
from apps.tasks.services import stop_task, submit_task
from apps.vdc.models import Membership
from hcsportal.asgi import application
from tests.control.drive import run_until_running, wait_status
from tests.portal import apps_host
from tests.portal.apps_host import HostClient
from tests.portal.test_live import session_cookie

pytestmark = pytest.mark.django_db(transaction=True)

PORT = 8000
# A small web service inside the job: serves its working directory, echoes the headers it got, and redirects.
SERVICE = r"""
echo 'hello from the job' > index.html
cat > serve.py <<'PY'
import http.server, json
REDIRECTS = {"/go": "/index.html", "/away": "https://evil.example/phish", "/slashes": "//evil.example/x",
             "/backslash": "/\\evil.example/x", "/scheme-relative-upstream": None}
class Handler(http.server.SimpleHTTPRequestHandler):
    def do_GET(self):
        if self.path.startswith("/headers"):
            body = json.dumps(dict(self.headers)).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Set-Cookie", "sessionid=stolen; Path=/")
            self.send_header("Set-Cookie", "hcs-app=forged; Path=/")
            self.send_header("Set-Cookie", "app=1; Path=/; Domain=apps.localhost")
            self.send_header("X-Frame-Options", "ALLOWALL")
            self.send_header("Content-Security-Policy", "img-src 'self'")
            self.send_header("Content-Security-Policy", "media-src 'self'")
            self.end_headers()
            self.wfile.write(body)
        elif self.path in REDIRECTS:
            self.send_response(302)
            self.send_header("Location", REDIRECTS[self.path] or "http://" + self.headers["Host"] + "/index.html")
            self.end_headers()
        else:
            super().do_GET()
    def do_POST(self):
        body = self.rfile.read(int(self.headers["Content-Length"]))
        self.send_response(201)
        self.end_headers()
        self.wfile.write(b"got " + body)
http.server.ThreadingHTTPServer(("0.0.0.0", PORT_NUMBER), Handler).serve_forever()
PY
exec python3 serve.py
""".replace("PORT_NUMBER", str(PORT))


@pytest.fixture(autouse=True)
def local_jobs_dir(settings, tmp_path):
    settings.HCS_LOCAL_EXECUTOR_DIR = tmp_path / "local-jobs"


def start_service(world, command: str = SERVICE):
    task = submit_task(
        world.member,
        project=world.project,
        queue="high",
        name="web",
        kind="dev_env",
        command=command,
        gpu_spec="",
        port=PORT,
    )
    return run_until_running(task)


@pytest.fixture
def service(world):
    task = start_service(world)
    yield task
    stop_task(task, world.owner)
    wait_status(task, {"stopped", "completed", "failed"})


def url(task, port=PORT, path=""):
    return reverse("portal:task-connect", args=[task.pk, port, path])


def app_host(task, port=PORT) -> str:
    return apps_host.app_host(task, port)


async def read(response) -> bytes:
    if not response.streaming:
        return response.content
    return b"".join([chunk async for chunk in response.streaming_content])


async def hand_over(user, task, path="", port=PORT, secure=False) -> str:
    """Where the portal's Connect link sends ``user``: the app host's exchange URL with a fresh ticket."""
    portal = AsyncClient()
    await portal.aforce_login(user)
    response = await portal.get(url(task, port, path), secure=secure)
    assert response.status_code == 302, await read(response)
    return response["Location"]


async def exchange(location: str, secure=False) -> tuple[AsyncClient, object]:
    """A fresh browser (no portal cookie) following the hand-over to the app host."""
    parts = urlsplit(location)
    app = HostClient(parts.netloc)
    return app, await app.get(f"{parts.path}?{parts.query}", secure=secure)


async def enter(user, task, path="") -> AsyncClient:
    """A browser that went through the hand-over as ``user`` and holds the app cookie."""
    app, response = await exchange(await hand_over(user, task, path))
    assert response.status_code == 302, await read(response)
    return app


async def when_up(request):
    """The service needs a moment after the job starts to listen."""
    for _ in range(50):
        response = await request()
        if response.status_code != 502:
            return response
        await asyncio.sleep(0.1)
    return response


# --- the hand-over and the app host -----------------------------------------------------------------------------


@pytest.mark.asyncio
async def test_the_connect_link_hands_a_member_over_to_the_ports_own_origin_with_a_one_time_ticket(world, service):
    assert url(service, PORT, "index.html") == f"/tasks/{service.pk}/connect/{PORT}/index.html"
    location = await hand_over(world.member, service, "index.html")
    assert location.startswith(f"http://{app_host(service)}{connect.EXCHANGE_PATH}?ticket=")

    app, response = await exchange(location)
    assert response.status_code == 302 and response["Location"] == "/index.html"
    assert response["Referrer-Policy"] == "no-referrer" and response["Cache-Control"] == "no-store"
    cookie = response.cookies["hcs-app"]
    assert cookie["httponly"] and cookie["samesite"] == "Lax" and cookie["path"] == "/" and not cookie["domain"]
    page = await when_up(lambda: app.get("/index.html"))
    assert page.status_code == 200 and await read(page) == b"hello from the job\n"
    events = await database_sync_to_async(lambda: list(service.events.values_list("message", flat=True)))()
    assert f"Connect to port {PORT} opened by max" in events

    replayed_app, replayed = await exchange(location)
    assert replayed.status_code == 403 and b"already used" in replayed.content
    assert "hcs-app" not in replayed.cookies


@pytest.mark.asyncio
async def test_over_https_the_app_cookie_is_host_only_and_secure(world, service):
    location = await hand_over(world.member, service, secure=True)
    assert location.startswith(f"https://{app_host(service)}{connect.EXCHANGE_PATH}?")
    _, response = await exchange(location, secure=True)
    cookie = response.cookies["__Host-hcs-app"]
    assert cookie["secure"] and cookie["httponly"] and cookie["path"] == "/" and not cookie["domain"]
    assert "hcs-app" not in response.cookies


@pytest.mark.asyncio
async def test_a_path_that_would_leave_the_origin_stays_on_it(world, service):
    # A ticket's path always becomes a path on the app's own origin.
    for path, expected in (
        ("/evil.example/x", "/evil.example/x"),
        ("\\evil.example", "/%5Cevil.example"),
        ("//evil.example", "/evil.example"),
    ):
        _, response = await exchange(await hand_over(world.member, service, path))
        assert response["Location"] == expected


@pytest.mark.asyncio
async def test_the_job_never_gets_the_visitors_credentials_and_cannot_set_reserved_cookies(world, service):
    app = await enter(world.owner, service)
    portal_session = (await database_sync_to_async(session_cookie)(world.owner)).decode().split("=", 1)[1]
    app.cookies[settings.SESSION_COOKIE_NAME] = portal_session
    app.cookies["app"] = "mine"
    response = await when_up(lambda: app.get("/headers", headers={"Authorization": "Token secret"}))
    seen = {k.lower(): v for k, v in json.loads(await read(response)).items()}
    assert seen["cookie"] == "app=mine"
    assert "authorization" not in seen
    assert seen["x-forwarded-host"] == app_host(service) and seen["x-forwarded-proto"] == "http"
    assert "sessionid" not in response.cookies and "hcs-app" not in response.cookies
    assert response.cookies["app"]["path"] == "/" and not response.cookies["app"]["domain"]


@pytest.mark.asyncio
async def test_every_answer_of_an_app_host_keeps_it_from_framing_or_scripting_the_portal(world, service):
    app = await enter(world.member, service)
    proxied = await when_up(lambda: app.get("/headers"))
    refused = await HostClient(app_host(service)).get("/")
    for response in (proxied, refused):
        policies = [p.strip() for p in response["Content-Security-Policy"].split(",")]
        assert connect.APP_POLICY in policies
        directives = dict(d.strip().split(" ", 1) for d in connect.APP_POLICY.split(";"))
        assert directives["connect-src"] == "'self'" and directives["form-action"] == "'self'"
        assert directives["frame-ancestors"] == "'self'"
        assert response["Cross-Origin-Opener-Policy"] == "same-origin"
        assert response["Cross-Origin-Resource-Policy"] == "same-origin"
        assert response["X-Frame-Options"] == "SAMEORIGIN"
        assert response["X-Content-Type-Options"] == "nosniff"
    # The service's own policies are kept beside the app host's; its framing header is not.
    assert proxied["Content-Security-Policy"] == f"img-src 'self', media-src 'self', {connect.APP_POLICY}"


def test_the_portals_pages_keep_their_own_policy(world, client):
    client.force_login(world.member)
    response = client.get(reverse("portal:compute-tasks"))
    assert "frame-ancestors 'none'" in response["Content-Security-Policy"]
    assert response["X-Frame-Options"] == "DENY"


@pytest.mark.asyncio
async def test_redirects_stay_on_the_apps_origin_and_posts_from_other_origins_are_refused(world, service):
    app = await enter(world.member, service)
    response = await when_up(lambda: app.get("/go"))
    assert response.status_code == 302 and response["Location"] == "/index.html"
    # To the service itself by its own address: kept, as a path here.
    response = await app.get("/scheme-relative-upstream")
    assert response.status_code == 302 and response["Location"] == "/index.html"
    response = await app.get("/backslash")
    assert response.status_code == 302 and response["Location"] == "/%5Cevil.example/x"
    for away in ("/away", "/slashes"):
        response = await app.get(away)
        assert response.status_code == 502 and "Location" not in response
        assert b"outside this app's own address" in response.content

    own = f"http://{app_host(service)}"
    posted = await app.post("/echo", data=b"abc", content_type="text/plain", headers={"Origin": own})
    assert posted.status_code == 201 and await read(posted) == b"got abc"
    for origin in ("http://evil.example", f"http://{service.pk}-6006.{settings.HCS_APPS_DOMAIN}", "null"):
        posted = await app.post("/echo", data=b"abc", content_type="text/plain", headers={"Origin": origin})
        assert posted.status_code == 403


# --- the credentials ---------------------------------------------------------------------------------------------


@pytest.mark.asyncio
async def test_a_ticket_is_refused_when_expired_forged_or_for_another_app(world, service, monkeypatch):
    started = time.time()
    with monkeypatch.context() as past:
        past.setattr(signing.time, "time", lambda: started - connect.TICKET_MAX_AGE_S - 5)
        expired = connect.issue_ticket(world.member, service.pk, PORT, "")
    ticket = connect.issue_ticket(world.member, service.pk, PORT, "")
    forged = signing.dumps({"u": world.member.pk, "t": service.pk, "p": PORT, "to": "/", "n": "x"}, salt="other")
    app = HostClient(app_host(service))
    cases = [(expired, b"expired"), (forged, b"not a valid Connect link"), (ticket[:-2] + "xx", b"not a valid")]
    for value, message in cases:
        response = await app.get(connect.EXCHANGE_PATH, {"ticket": value})
        assert response.status_code == 403 and message in response.content
    other = HostClient(app_host(service, 6006))
    response = await other.get(connect.EXCHANGE_PATH, {"ticket": ticket})
    assert response.status_code == 403 and b"for another app" in response.content
    assert (await app.post(f"{connect.EXCHANGE_PATH}?ticket={ticket}")).status_code == 405
    assert "hcs-app" not in other.cookies and "hcs-app" not in app.cookies


@pytest.mark.parametrize(("role", "status"), [("viewer", 403), ("outsider", 404)])
def test_viewers_and_outsiders_get_no_ticket(world, service, client, role, status):
    client.force_login(world.user(role))
    response = client.get(url(service, PORT, "index.html"))
    assert response.status_code == status and "Location" not in response


def test_an_anonymous_visitor_is_sent_to_log_in_on_the_portal(world, service, client):
    response = client.get(url(service, PORT, "index.html"))
    assert response.status_code == 302
    assert response["Location"] == f"/accounts/login/?next=/tasks/{service.pk}/connect/{PORT}/index.html"


def test_only_the_tasks_declared_ports_are_reachable(world, service, client):
    assert connectable_ports(service) == [6006, PORT]
    client.force_login(world.member)
    response = client.get(url(service, 5432, ""))
    assert response.status_code == 403 and b"not a port of this task" in response.content


def test_an_ended_task_is_not_reachable(world, client):
    task = start_service(world)
    stop_task(task, world.member)
    wait_status(task, "stopped")
    client.force_login(world.member)
    assert client.get(url(task, PORT, "")).status_code == 409


def test_the_portal_path_hands_over_and_serves_nothing_of_the_task(world, service, client):
    client.force_login(world.member)
    assert client.post(url(service, PORT, "echo"), data=b"abc", content_type="text/plain").status_code == 405


@pytest.mark.asyncio
async def test_an_app_cookie_works_only_for_its_user_while_allowed_and_for_its_own_port(world, service):
    app = await enter(world.member, service)
    cookie = app.cookies["hcs-app"].value
    assert (await when_up(lambda: app.get("/index.html"))).status_code == 200

    # On another app host (another port of the task) it counts for nothing.
    other = HostClient(app_host(service, 6006))
    other.cookies["hcs-app"] = cookie
    assert (await other.get("/")).status_code == 401

    # A viewer's or an outsider's cookie (were one made) is refused by the rule checked on every request.
    for role, status in (("viewer", 403), ("outsider", 404)):
        stranger = HostClient(app_host(service))
        stranger.cookies["hcs-app"] = connect.app_cookie(world.user(role), service.pk, PORT)
        assert (await stranger.get("/index.html")).status_code == status

    # Another user's id in it breaks the signature.
    data, signed = cookie.split(":", 1)
    payload = json.loads(signing.b64_decode(data.encode()))
    tampered = signing.b64_encode(json.dumps({**payload, "u": world.owner.pk}, separators=(",", ":")).encode())
    tampered = tampered.decode() + ":" + signed
    app.cookies["hcs-app"] = tampered
    assert (await app.get("/index.html")).status_code == 401
    app.cookies["hcs-app"] = cookie

    # Withdrawn membership ends the visit at the next request.
    await Membership.objects.filter(user=world.member, project=world.project).adelete()
    assert (await app.get("/index.html")).status_code == 404


@pytest.mark.asyncio
async def test_a_new_password_ends_the_users_app_cookies(world, service):
    app = await enter(world.member, service)
    assert (await when_up(lambda: app.get("/index.html"))).status_code == 200
    world.member.set_password("a-new-password-2026")
    await world.member.asave()
    assert (await app.get("/index.html")).status_code == 401


@pytest.mark.asyncio
async def test_the_app_host_ignores_the_portals_session_and_the_portal_ignores_the_app_cookie(world, service):
    app = HostClient(app_host(service))
    app.cookies[settings.SESSION_COOKIE_NAME] = (
        (await database_sync_to_async(session_cookie)(world.member)).decode().split("=", 1)[1]
    )
    response = await app.get("/index.html")
    assert response.status_code == 401 and b"Open this app from its task's page" in response.content

    holder = await enter(world.member, service)
    portal = AsyncClient()
    portal.cookies["hcs-app"] = holder.cookies["hcs-app"].value
    assert (await portal.get("/api/v1/tasks/")).status_code in (401, 403)
    page = await portal.get(reverse("portal:compute-tasks"))
    assert page.status_code == 302 and page["Location"].startswith("/accounts/login/")


# --- routing by host ---------------------------------------------------------------------------------------------


@pytest.mark.asyncio
async def test_requests_for_an_app_host_never_reach_the_portals_views(world, service):
    anonymous = HostClient(app_host(service))
    for path in ("/accounts/login/", "/api/v1/tasks/", "/admin/", "/healthz", f"/tasks/{service.pk}/connect/8000/"):
        response = await anonymous.get(path)
        assert response.status_code == 401 and b"Open this app" in response.content, path
    app = await enter(world.member, service)
    for path in ("/accounts/login/", "/api/v1/tasks/", "/healthz"):
        response = await when_up(lambda path=path: app.get(path))
        assert response.status_code == 404 and b"File not found" in await read(response), path
    domain = settings.HCS_APPS_DOMAIN
    for host in (
        domain,
        f"www.{domain}",
        f"0-8000.{domain}",
        f"{service.pk}-70000.{domain}",
        f"x.{service.pk}-8000.{domain}",
    ):
        response = await HostClient(host).get("/accounts/login/")
        assert response.status_code == 404 and b"No app here" in response.content, host


def test_the_portal_does_not_answer_the_app_hosts_paths(world, client):
    client.force_login(world.member)
    assert client.get(connect.EXCHANGE_PATH, {"ticket": "x"}).status_code == 404
    assert client.get("/", headers={"host": "evil.example"}).status_code == 400


# --- the page ------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("role", "shown"), [("member", True), ("owner", True), ("viewer", False)])
def test_the_monitoring_page_of_a_running_dev_environment_has_connect_and_terminal_for_those_who_may(
    world, service, client, role, shown
):
    client.force_login(world.user(role))
    page = monitoring_page_once_up(client, service)
    assert (f'href="/tasks/{service.pk}/connect/{PORT}/"' in page) is shown
    assert (f'href="/task-monitoring/{service.pk}/terminal/?instance=0"' in page) is shown


def monitoring_page_once_up(client, task) -> str:
    """The task's page once the service's port answers (it needs a moment after the job starts to listen)."""
    for _ in range(50):
        page = client.get(reverse("portal:task-monitoring", args=[task.pk])).content.decode()
        if "data-ide-down" not in page:
            return page
        time.sleep(0.1)
    return page


def test_connect_is_offered_only_while_the_ide_answers_and_its_error_pages_link_back(world, client):
    """A dev environment whose port nothing listens on: its page says the IDE is not up (no Connect button), and
    the app host's answer is an HTML page in the portal's look with a link back to the task's page."""
    task = start_service(world, "sleep 300")
    try:
        client.force_login(world.member)
        page = client.get(reverse("portal:task-monitoring", args=[task.pk])).content.decode()
        assert "data-connect" not in page and "data-ide-down" in page
        assert f"not up yet: nothing answers on port {PORT} yet." in page

        async def through_connect():
            app = await enter(world.member, task)
            return await app.get("/lab")

        response = asyncio.run(through_connect())
        assert response.status_code == 502
        assert response["Content-Type"] == "text/html; charset=utf-8"
        body = response.content.decode()
        assert body.startswith("<!doctype html>") and 'data-connect-error="502"' in body
        assert f"Nothing answers on port {PORT} of the task" in body
        assert f'<a href="http://testserver/task-monitoring/{task.pk}/" data-back>' in body

        # The portal side's refusals are pages too: a viewer is told why, with the way back.
        client.force_login(world.viewer)
        refused = client.get(url(task, PORT, ""))
        assert refused.status_code == 403 and refused["Content-Type"].startswith("text/html")
        assert f'href="http://testserver/task-monitoring/{task.pk}/" data-back' in refused.content.decode()
    finally:
        stop_task(task, world.member)
        wait_status(task, "stopped")


def start_inference(world):
    task = submit_task(
        world.member,
        project=world.project,
        queue="high",
        name="llm",
        kind="inference",
        command=SERVICE,
        gpu_spec="",
        port=PORT,
        image="local",
    )
    return run_until_running(task)


def test_an_inference_services_page_shows_its_endpoint_replicas_and_a_test_box_for_members(world, client):
    task = start_inference(world)
    endpoint = f"http://{task.pk}-{PORT}.{settings.HCS_APPS_DOMAIN}/"
    try:
        client.force_login(world.member)
        page = client.get(reverse("portal:task-monitoring", args=[task.pk])).content.decode()
        assert f'<code data-field="endpoint">{endpoint}</code>' in page
        assert f'href="/tasks/{task.pk}/connect/{PORT}/"' in page
        assert "1 running / 1 desired" in page
        assert f'data-test-request="/task-monitoring/{task.pk}/service-test/"' in page
        client.force_login(world.viewer)
        page = client.get(reverse("portal:task-monitoring", args=[task.pk])).content.decode()
        assert "data-test-request" not in page and "1 running / 1 desired" in page and endpoint in page
    finally:
        stop_task(task, world.member)
        wait_status(task, "stopped")
    client.force_login(world.member)
    page = client.get(reverse("portal:task-monitoring", args=[task.pk])).content.decode()
    assert "0 running / 0 desired" in page and "data-test-request" not in page


def test_the_test_box_sends_through_the_portal_and_answers_in_json(world, client):
    task = start_inference(world)
    try:
        client.force_login(world.member)
        test_url = reverse("portal:task-service-test", args=[task.pk])
        for _ in range(50):
            answer = client.post(test_url, {"method": "POST", "path": "v1/completions", "body": '{"prompt": "hi"}'})
            if answer.status_code != 502:
                break
            time.sleep(0.1)
        assert answer.status_code == 200 and answer["Content-Type"] == "application/json"
        assert answer.json()["status"] == 201 and answer.json()["body"] == 'got {"prompt": "hi"}'
        assert client.post(test_url, {"method": "DELETE", "path": ""}).status_code == 400
        client.force_login(world.viewer)
        assert client.post(test_url, {"method": "GET", "path": ""}).status_code == 403
    finally:
        stop_task(task, world.member)
        wait_status(task, "stopped")


def test_a_kubernetes_services_addresses_and_replicas_come_from_the_backends_state(world):
    task = Task(pk=9, kind="inference", status="running", port=8000, instances=1, replicas=2)
    state = JobState(
        "ns/deployment/llm-9",
        JobPhase.RUNNING,
        replicas=2,
        desired_replicas=3,
        objects=(
            {"kind": "Deployment", "name": "llm-9", "namespace": "team-a"},
            {"kind": "Ingress", "name": "llm-9", "host": "llm-9.apps.example.com"},
        ),
    )
    facts = service_facts(task, state, "https://9-8000.apps.example.com")
    assert facts.app_url == "https://9-8000.apps.example.com/"
    assert facts.addresses == ["llm-9.team-a.svc:8000 (in the cluster)", "http://llm-9.apps.example.com/"]
    assert (facts.replicas, facts.desired_replicas) == (2, 3)


# --- WebSockets ----------------------------------------------------------------------------------------------------

# A WebSocket echo server on the standard library alone (the sandbox has the system's Python, not the portal's).
WS_ECHO = r"""
cat > ws.py <<'PY'
import base64, hashlib, socket, struct, threading
def serve(conn):
    request = b""
    while b"\r\n\r\n" not in request:
        request += conn.recv(4096)
    lines = request.decode().split("\r\n")
    headers = {k.lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:] if line)}
    key = headers["sec-websocket-key"] + "258EAFA5-E914-47DA-95CA-C5AB0DC85B11"
    accept = base64.b64encode(hashlib.sha1(key.encode()).digest())
    conn.sendall(b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
                 b"Sec-WebSocket-Accept: " + accept + b"\r\n\r\n")
    while True:
        head = conn.recv(2)
        if len(head) < 2 or head[0] & 0x0F == 8:
            return
        length = head[1] & 0x7F
        if length == 126:
            length = struct.unpack(">H", conn.recv(2))[0]
        mask = conn.recv(4)
        data = b""
        while len(data) < length:
            data += conn.recv(length - len(data))
        data = bytes(b ^ mask[i % 4] for i, b in enumerate(data))
        reply = ("echo " + lines[0].split()[1] + " " + data.decode() + " cookie=" + headers.get("cookie", "-")).encode()
        conn.sendall(bytes([0x81, 126]) + struct.pack(">H", len(reply)) + reply)
server = socket.create_server(("0.0.0.0", PORT_NUMBER))
while True:
    threading.Thread(target=serve, args=(server.accept()[0],), daemon=True).start()
PY
exec python3 ws.py
""".replace("PORT_NUMBER", str(PORT))


async def open_socket(host: str, path: str, origin: str | None, cookie: str = ""):
    headers = [(b"host", host.encode())]
    if origin is not None:
        headers.append((b"origin", origin.encode()))
    if cookie:
        headers.append((b"cookie", cookie.encode()))
    communicator = WebsocketCommunicator(application, path, headers=headers)
    result = await communicator.connect(timeout=10)
    if not result[0]:
        # A refused socket's consumer still waits for the disconnect: left running, the test's event loop could
        # not close (its cancelled channel-layer receive never ended) and the run hung in teardown.
        await communicator.disconnect()
    return communicator, result


@pytest.mark.asyncio
async def test_an_apps_websocket_is_relayed_with_its_own_cookie_and_origin_only(world):
    task = await database_sync_to_async(start_service)(world, WS_ECHO)
    try:
        host, own = app_host(task), f"http://{app_host(task)}"
        member = (await enter(world.member, task)).cookies["hcs-app"].value
        portal_session = (await database_sync_to_async(session_cookie)(world.member)).decode()
        cookie = f"hcs-app={member}; {portal_session}; app=7"
        for _ in range(50):
            communicator, (connected, code) = await open_socket(host, "/api/ws?x=1", own, cookie)
            if connected:
                break
            await asyncio.sleep(0.1)  # the server is not listening yet
        assert connected, code
        await communicator.send_to(text_data="hello")
        assert await communicator.receive_from(timeout=10) == "echo /api/ws?x=1 hello cookie=app=7"
        await communicator.disconnect()

        other_app = f"http://{task.pk}-6006.{settings.HCS_APPS_DOMAIN}"
        for origin in (other_app, "http://localhost", "http://evil.example", None):
            _, result = await open_socket(host, "/api/ws", origin, cookie)
            assert result == (False, 4403), origin
        _, result = await open_socket(host, "/api/ws", own, portal_session)
        assert result == (False, 4401)
        viewer = await database_sync_to_async(connect.app_cookie)(world.viewer, task.pk, PORT)
        _, result = await open_socket(host, "/api/ws", own, f"hcs-app={viewer}")
        assert result == (False, 4403)
        # The portal no longer relays Connect sockets under its own names.
        for path in (f"/ws/tasks/{task.pk}/connect/{PORT}/api/ws", f"/tasks/{task.pk}/connect/{PORT}/api/ws"):
            headers = [(b"host", b"localhost"), (b"origin", b"http://localhost"), (b"cookie", portal_session.encode())]
            communicator = WebsocketCommunicator(application, path, headers=headers)
            with pytest.raises(ValueError, match="No route found"):
                await communicator.connect(timeout=10)
    finally:
        await database_sync_to_async(lambda: (stop_task(task, world.member), wait_status(task, "stopped")))()


@pytest.mark.asyncio
async def test_a_page_of_an_app_host_cannot_open_the_portals_sockets(live_world):
    portal_session = (await database_sync_to_async(session_cookie)(live_world.member)).decode()
    for origin in (f"http://5-8000.{settings.HCS_APPS_DOMAIN}", f"http://{settings.HCS_APPS_DOMAIN}"):
        _, result = await open_socket("localhost", "/ws/live/", origin, portal_session)
        assert result[0] is False, origin
    communicator, (connected, _) = await open_socket("localhost", "/ws/live/", "http://localhost", portal_session)
    assert connected
    await communicator.disconnect()
