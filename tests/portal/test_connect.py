"""Connect (issue 11 item 4): a running task's declared port through the portal's authenticated reverse proxy,
``/tasks/<id>/connect/<port>/<path>``; viewers, outsiders, anonymous users, undeclared ports and ended tasks are
refused, and the portal's own credentials never reach the job.
"""

from __future__ import annotations

import pytest
from django.conf import settings
from django.test import AsyncClient
from django.urls import reverse

from apps.tasks.access import connectable_ports
from apps.tasks.services import stop_task, submit_task
from tests.control.drive import run_until_running, wait_status

pytestmark = pytest.mark.django_db(transaction=True)

PORT = 8000
# A small web service inside the job: serves its working directory and echoes the headers it got.
SERVICE = r"""
echo 'hello from the job' > index.html
cat > serve.py <<'PY'
import http.server, json
class Handler(http.server.SimpleHTTPRequestHandler):
    def do_GET(self):
        if self.path.startswith("/headers"):
            body = json.dumps(dict(self.headers)).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Set-Cookie", "sessionid=stolen; Path=/")
            self.send_header("Set-Cookie", "app=1; Path=/")
            self.end_headers()
            self.wfile.write(body)
        elif self.path.startswith("/go"):
            self.send_response(302)
            self.send_header("Location", "/index.html")
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
    task = submit_task(world.member, project=world.project, queue="high", name="web", kind="dev_env",
                       command=command, gpu_spec="", port=PORT)  # fmt: skip
    return run_until_running(task)


def url(task, port=PORT, path=""):
    return reverse("portal:task-connect", args=[task.pk, port, path])


async def get_when_up(client, path, **kwargs):
    """The service needs a moment after the job starts to listen."""
    import asyncio  # noqa: PLC0415

    for _ in range(50):
        response = await client.get(path, **kwargs)
        if response.status_code != 502:
            return response
        await asyncio.sleep(0.1)
    return response


@pytest.fixture
def service(world):
    task = start_service(world)
    yield task
    stop_task(task, world.member)
    wait_status(task, {"stopped", "completed", "failed"})


def body(response) -> bytes:
    return b"".join(response.streaming_content) if response.streaming else response.content


@pytest.mark.asyncio
async def test_a_member_reaches_the_tasks_port_through_the_portal(world, service):
    assert url(service, PORT, "index.html") == f"/tasks/{service.pk}/connect/{PORT}/index.html"
    client = AsyncClient()
    await client.aforce_login(world.member)
    response = await get_when_up(client, url(service, PORT, "index.html"))
    assert response.status_code == 200
    assert b"".join([chunk async for chunk in response.streaming_content]) == b"hello from the job\n"


@pytest.mark.asyncio
async def test_the_job_never_gets_the_portals_session_or_token_and_cannot_set_the_portals_cookies(world, service):
    client = AsyncClient()
    await client.aforce_login(world.owner)
    client.cookies["app"] = "mine"
    response = await get_when_up(client, url(service, PORT, "headers"), headers={"Authorization": "Token secret"})
    import json  # noqa: PLC0415

    seen = json.loads(b"".join([chunk async for chunk in response.streaming_content]))
    seen = {k.lower(): v for k, v in seen.items()}
    assert settings.SESSION_COOKIE_NAME not in seen.get("cookie", "") and "app=mine" in seen["cookie"]
    assert "authorization" not in seen
    assert seen["x-forwarded-prefix"] == f"/tasks/{service.pk}/connect/{PORT}"
    assert settings.SESSION_COOKIE_NAME not in response.cookies
    assert response.cookies["app"]["path"] == f"/tasks/{service.pk}/connect/{PORT}/"


@pytest.mark.asyncio
async def test_redirects_and_posts_stay_under_the_prefix(world, service):
    client = AsyncClient()
    await client.aforce_login(world.member)
    response = await get_when_up(client, url(service, PORT, "go"))
    assert response.status_code == 302
    assert response["Location"] == f"/tasks/{service.pk}/connect/{PORT}/index.html"
    posted = await client.post(url(service, PORT, "echo"), data=b"abc", content_type="text/plain")
    assert posted.status_code == 201
    assert b"".join([chunk async for chunk in posted.streaming_content]) == b"got abc"


@pytest.mark.parametrize(("role", "status"), [("viewer", 403), ("outsider", 404)])
def test_viewers_and_outsiders_are_refused(world, service, client, role, status):
    client.force_login(world.user(role))
    response = client.get(url(service, PORT, "index.html"))
    assert response.status_code == status


def test_an_anonymous_visitor_is_sent_to_log_in(world, service, client):
    response = client.get(url(service, PORT, "index.html"))
    assert response.status_code == 302 and "/accounts/login/" in response["Location"]


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


@pytest.mark.parametrize(("role", "shown"), [("member", True), ("owner", True), ("viewer", False)])
def test_the_monitoring_page_of_a_running_dev_environment_has_connect_and_terminal_for_those_who_may(
    world, service, client, role, shown
):
    client.force_login(world.user(role))
    page = client.get(reverse("portal:task-monitoring", args=[service.pk])).content.decode()
    assert (f'href="/tasks/{service.pk}/connect/{PORT}/"' in page) is shown
    assert (f'href="/task-monitoring/{service.pk}/terminal/?instance=0"' in page) is shown


def start_inference(world):
    task = submit_task(world.member, project=world.project, queue="high", name="llm", kind="inference",
                       command=SERVICE, gpu_spec="", port=PORT, image="local")  # fmt: skip
    return run_until_running(task)


def test_an_inference_services_page_shows_its_endpoint_replicas_and_a_test_box_for_members(world, client):
    task = start_inference(world)
    try:
        client.force_login(world.member)
        page = client.get(reverse("portal:task-monitoring", args=[task.pk])).content.decode()
        assert f"http://testserver/tasks/{task.pk}/connect/{PORT}/</code>" in page
        assert "1 running / 1 desired" in page
        assert f'data-test-request="http://testserver/tasks/{task.pk}/connect/{PORT}/"' in page
        client.force_login(world.viewer)
        page = client.get(reverse("portal:task-monitoring", args=[task.pk])).content.decode()
        assert "data-test-request" not in page and "1 running / 1 desired" in page
    finally:
        stop_task(task, world.member)
        wait_status(task, "stopped")
    client.force_login(world.member)
    page = client.get(reverse("portal:task-monitoring", args=[task.pk])).content.decode()
    assert "0 running / 0 desired" in page and "data-test-request" not in page


def test_a_kubernetes_services_addresses_and_replicas_come_from_the_backends_state(world):
    from apps.clusters.executors.base import JobPhase, JobState  # noqa: PLC0415
    from apps.tasks.access import service_facts  # noqa: PLC0415
    from apps.tasks.models import Task  # noqa: PLC0415

    task = Task(pk=9, kind="inference", status="running", port=8000, instances=1, replicas=2)
    state = JobState("ns/deployment/llm-9", JobPhase.RUNNING, replicas=2, desired_replicas=3, objects=(
        {"kind": "Deployment", "name": "llm-9", "namespace": "team-a"},
        {"kind": "Ingress", "name": "llm-9", "host": "llm-9.apps.example.com"},
    ))  # fmt: skip
    facts = service_facts(task, state, "https://portal.example.com/")
    assert facts.proxied_url == "https://portal.example.com/tasks/9/connect/8000/"
    assert facts.addresses == ["llm-9.team-a.svc:8000 (in the cluster)", "http://llm-9.apps.example.com/"]
    assert (facts.replicas, facts.desired_replicas) == (2, 3)


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


@pytest.mark.asyncio
@pytest.mark.parametrize("prefix", ["ws/tasks", "tasks"])
async def test_a_pages_websocket_is_relayed_to_the_tasks_port_without_the_portals_session(world, prefix):
    import asyncio  # noqa: PLC0415

    from channels.db import database_sync_to_async  # noqa: PLC0415
    from channels.testing import WebsocketCommunicator  # noqa: PLC0415

    from hcsportal.asgi import application  # noqa: PLC0415
    from tests.portal.test_live import session_cookie  # noqa: PLC0415

    task = await database_sync_to_async(start_service)(world, WS_ECHO)
    try:
        cookie = await database_sync_to_async(session_cookie)(world.member)
        headers = [(b"origin", b"http://localhost"), (b"cookie", cookie + b"; app=7")]
        for _ in range(50):
            communicator = WebsocketCommunicator(application, f"/{prefix}/{task.pk}/connect/{PORT}/api/ws?x=1",
                                                 headers=headers)  # fmt: skip
            connected, code = await communicator.connect(timeout=10)
            if connected:
                break
            await asyncio.sleep(0.1)  # the server is not listening yet
        assert connected, code
        await communicator.send_to(text_data="hello")
        assert await communicator.receive_from(timeout=10) == "echo /api/ws?x=1 hello cookie=app=7"
        await communicator.disconnect()

        viewer_cookie = await database_sync_to_async(session_cookie)(world.viewer)
        viewer_headers = [(b"origin", b"http://localhost"), (b"cookie", viewer_cookie)]
        path = f"/{prefix}/{task.pk}/connect/{PORT}/api/ws"
        viewer = WebsocketCommunicator(application, path, headers=viewer_headers)
        assert await viewer.connect(timeout=10) == (False, 4403)
    finally:
        await database_sync_to_async(lambda: (stop_task(task, world.member), wait_status(task, "stopped")))()
