"""``POST /api/v1/tasks/{id}/connect-ticket/``: a Connect ticket for clients that are not browsers, under the
Connect link's rule (owners and members, a declared port, a running task); the ticket it gives is redeemed on the
app host like the link's (tests/cli/test_remote.py runs it against a real task)."""

from __future__ import annotations

from urllib.parse import unquote

import pytest

from apps.tasks import connect
from apps.tasks.access import Refused
from tests.api.base import API, client_for
from tests.factories import TaskFactory

pytestmark = pytest.mark.django_db


def ask(user, task_id: int, body: dict):
    return client_for(user).post(f"{API}tasks/{task_id}/connect-ticket/", body, format="json")


def test_refusals_say_why_as_the_connect_link_does(world):
    task = TaskFactory(project=world.project, owner=world.member, kind="dev_env", port=8000, status="queued")
    assert ask(world.member, task.pk, {"port": 8000}).json() == {"detail": "The task is queued, not running."}
    assert ask(world.member, task.pk, {"port": 8000}).status_code == 409
    refused = ask(world.viewer, task.pk, {"port": 8000})
    assert refused.status_code == 403
    assert refused.json() == {"detail": "Only owners and members of the project connect to its tasks' services."}
    undeclared = ask(world.member, task.pk, {"port": 9999})
    assert undeclared.status_code == 403 and undeclared.json()["detail"].startswith("Port 9999 is not a port")
    assert ask(world.outsider, task.pk, {"port": 8000}).status_code == 404
    assert ask(world.member, 999999, {"port": 8000}).status_code == 404
    assert ask(world.member, task.pk, {"port": 0}).status_code == 400
    assert ask(world.member, task.pk, {}).status_code == 400
    assert ask(None, task.pk, {"port": 8000}).status_code == 401


def test_a_running_tasks_ticket_names_the_ports_origin_and_is_good_once(world):
    task = TaskFactory(
        project=world.project,
        owner=world.member,
        kind="dev_env",
        port=8000,
        status="running",
        cluster=world.cluster,
        external_id="job-1",
    )
    answer = ask(world.member, task.pk, {"port": 8000})
    assert answer.status_code == 200, answer.content
    body = answer.json()
    assert body["origin"] == f"http://{task.pk}-8000.{connect.apps_domain()}"
    assert body["expires_in"] == connect.TICKET_MAX_AGE_S
    prefix = f"{body['origin']}{connect.EXCHANGE_PATH}?ticket="
    assert body["url"].startswith(prefix)
    ticket = unquote(body["url"].removeprefix(prefix))
    assert connect.redeem_ticket(ticket, task.pk, 8000)[:2] == (world.member.pk, "/")
    with pytest.raises(Refused, match="already used"):
        connect.redeem_ticket(ticket, task.pk, 8000)
