"""Login lockout on every door: the login page, the admin's login and the API's token login.

After five failures for one username from one address, that username is locked out from that address
(even with the right password) with a clear 429; other addresses, and the count after a success, are unaffected.
Many usernames tried from one address lock the address out. The address is the web server's peer, not a header.
"""

from __future__ import annotations

import shlex
import socket
import threading
import time

import httpx
import pytest
from django.core.exceptions import ImproperlyConfigured
from django.test import Client
from rest_framework.test import APIClient

from hcsportal.env import env_networks
from tests.factories import UserFactory

PASSWORD = "pw-for-tests-1"
LIMIT = 5
DOORS = {
    "login page": ("/accounts/login/", "max"),
    "admin login": ("/admin/login/", "admin"),
    "api token": ("/api/v1/auth/token/", "max"),
}


def attempt(door: str, password: str, address: str = "203.0.113.7"):
    path, username = DOORS[door]
    client = APIClient() if door == "api token" else Client()
    return client.post(path, {"username": username, "password": password}, REMOTE_ADDR=address)


def succeeded(door: str, response) -> bool:
    if door == "api token":
        return response.status_code == 200 and "token" in response.json()
    return response.status_code == 302  # a redirect to where the login leads


@pytest.mark.parametrize("door", DOORS)
def test_five_failures_lock_the_username_out_from_that_address(world, door):
    for _ in range(LIMIT - 1):
        response = attempt(door, "wrong-password")
        assert response.status_code in (200, 400) and not succeeded(door, response)
    locked = attempt(door, "wrong-password")
    assert locked.status_code == 429

    right_password = attempt(door, PASSWORD)
    assert right_password.status_code == 429, "a locked-out username must not log in, even with its password"
    if door == "api token":
        body = right_password.json()
        assert "Too many failed logins" in body["detail"] and "15 minutes" in body["detail"]
        assert right_password["Retry-After"] == str(15 * 60)
    else:
        page = right_password.content.decode()
        assert "Locked out" in page and "Too many failed logins" in page and "15 minutes" in page

    assert succeeded(door, attempt(door, PASSWORD, address="198.51.100.9")), "another address is not locked"


@pytest.mark.parametrize("door", DOORS)
def test_a_successful_login_clears_the_failure_count(world, door):
    for _ in range(LIMIT - 1):
        attempt(door, "wrong-password")
    assert succeeded(door, attempt(door, PASSWORD))
    for _ in range(LIMIT - 1):
        attempt(door, "wrong-password")
    assert succeeded(door, attempt(door, PASSWORD))


@pytest.mark.parametrize("door", DOORS)
def test_failures_from_one_address_over_many_usernames_lock_that_address_out(world, door, settings):
    """Trying many usernames from one address (each below its own limit) locks the address out for all."""
    settings.HCS_LOGIN_ADDRESS_FAILURE_LIMIT = 8
    path, username = DOORS[door]
    client = APIClient() if door == "api token" else Client()
    for guess in range(4):
        for _ in range(2):
            response = client.post(path, {"username": f"guess-{guess}", "password": "x"}, REMOTE_ADDR="203.0.113.7")
            assert response.status_code in (200, 400)
    locked = attempt(door, PASSWORD)
    assert locked.status_code == 429, "a username with no failures of its own is refused from that address"
    text = locked.json()["detail"] if door == "api token" else locked.content.decode()
    assert "Too many failed logins from your address" in text and "after 8 failures" in text
    assert succeeded(door, attempt(door, PASSWORD, address="198.51.100.9")), "another address is not locked"


def test_x_forwarded_for_is_not_the_address_the_lockout_counts(world):
    """Behind no trusted proxy a client's X-Forwarded-For says nothing: each guess counts against its peer."""
    client = APIClient()
    for n in range(LIMIT):
        client.post(
            "/api/v1/auth/token/",
            {"username": "max", "password": "wrong"},
            REMOTE_ADDR="203.0.113.7",
            HTTP_X_FORWARDED_FOR=f"192.0.2.{n}",
        )
    locked = client.post(
        "/api/v1/auth/token/",
        {"username": "max", "password": PASSWORD},
        REMOTE_ADDR="203.0.113.7",
        HTTP_X_FORWARDED_FOR="192.0.2.200",
    )
    assert locked.status_code == 429


@pytest.fixture
def web_server(transactional_db, settings):
    """Starts uvicorn in this process with the proxy options of the command line `make run` uses."""
    import uvicorn

    from hcsportal.asgi import application
    from hcsportal.management.commands.runportal import web_command
    from tests.portal.conftest import server_sees_test_db

    UserFactory(username="max")
    servers = []

    def start() -> str:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        argv = shlex.split(web_command("127.0.0.1", port, 1))
        assert argv[1:3] == ["-m", "uvicorn"]
        options = uvicorn.main.make_context("uvicorn", argv[3:]).params
        config = uvicorn.Config(
            application,
            host=options["host"],
            port=options["port"],
            lifespan="off",
            proxy_headers=options["proxy_headers"],
            forwarded_allow_ips=options["forwarded_allow_ips"],
            log_level="warning",
        )
        server = uvicorn.Server(config)
        thread = threading.Thread(target=server.run, name="uvicorn-lockout", daemon=True)
        thread.start()
        servers.append((server, thread))
        deadline = time.monotonic() + 20
        while not server.started:
            if time.monotonic() > deadline or not thread.is_alive():
                pytest.fail("uvicorn did not start listening within 20 s")
            time.sleep(0.05)
        return f"http://127.0.0.1:{port}"

    with server_sees_test_db():
        yield start
        for server, thread in servers:
            server.should_exit = True
            thread.join(10)


def test_the_web_server_make_run_starts_does_not_take_x_forwarded_for_from_loopback(web_server, settings):
    """A process on the portal's host cannot dodge the lockout by naming a new address on every guess."""
    url = web_server()
    with httpx.Client(base_url=url, timeout=10) as client:
        for n in range(LIMIT):
            client.post(
                "/api/v1/auth/token/",
                data={"username": "max", "password": "wrong"},
                headers={"X-Forwarded-For": f"192.0.2.{n}"},
            )
        locked = client.post(
            "/api/v1/auth/token/",
            data={"username": "max", "password": PASSWORD},
            headers={"X-Forwarded-For": "192.0.2.200"},
        )
    assert locked.status_code == 429, locked.text

    # A proxy listed in FORWARDED_ALLOW_IPS is believed: its clients count one by one.
    settings.FORWARDED_ALLOW_IPS = ["127.0.0.1"]
    url = web_server()
    with httpx.Client(base_url=url, timeout=10) as client:
        for _ in range(LIMIT):
            client.post(
                "/api/v1/auth/token/",
                data={"username": "max", "password": "wrong"},
                headers={"X-Forwarded-For": "192.0.2.50"},
            )
        other = client.post(
            "/api/v1/auth/token/",
            data={"username": "max", "password": PASSWORD},
            headers={"X-Forwarded-For": "192.0.2.51"},
        )
        same = client.post(
            "/api/v1/auth/token/",
            data={"username": "max", "password": PASSWORD},
            headers={"X-Forwarded-For": "192.0.2.50"},
        )
    assert other.status_code == 200, other.text
    assert same.status_code == 429, same.text


@pytest.mark.parametrize("value", ["*", "10.0.0.0/8,proxy.example", "300.1.2.3"])
def test_forwarded_allow_ips_takes_addresses_and_networks_only(monkeypatch, value):
    monkeypatch.setenv("FORWARDED_ALLOW_IPS", value)
    with pytest.raises(ImproperlyConfigured, match="FORWARDED_ALLOW_IPS must list IP addresses or networks"):
        env_networks("FORWARDED_ALLOW_IPS")
    monkeypatch.setenv("FORWARDED_ALLOW_IPS", "10.0.0.0/8, 192.0.2.7,::1")
    assert env_networks("FORWARDED_ALLOW_IPS") == ["10.0.0.0/8", "192.0.2.7", "::1"]
