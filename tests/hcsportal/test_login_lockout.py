"""Login lockout on every door: the login page, the admin's login and the API's token login.

After five failures for one username from one address, that username is locked out from that address
(even with the right password) with a clear 429; other addresses, and the count after a success, are unaffected.
"""

from __future__ import annotations

import pytest
from django.test import Client
from rest_framework.test import APIClient

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
