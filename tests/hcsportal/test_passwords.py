"""Passwords: the validators refuse short, common, all-numeric and username-like passwords; the demo's pass."""

from __future__ import annotations

import io

import pytest
from django.contrib.auth import get_user_model
from django.contrib.auth.password_validation import validate_password
from django.core.exceptions import ValidationError
from django.core.management import call_command

from hcsportal.management.commands.demo import DEMO_USERS


@pytest.mark.parametrize(
    ("password", "why"),
    [
        ("short-pw-1", "at least 12 characters"),
        ("password1234", "too common"),
        ("804151927356", "entirely numeric"),
        ("maximilian-mustermann", "too similar to the username"),
    ],
)
def test_weak_passwords_are_refused(db, password, why):
    user = get_user_model()(username="maximilian-mustermann", email="max@example.org")
    with pytest.raises(ValidationError) as refused:
        validate_password(password, user)
    assert any(why in message for message in refused.value.messages)


def test_a_long_unrelated_password_is_accepted(db):
    validate_password("correct-horse-battery", get_user_model()(username="max"))


@pytest.mark.parametrize(("username", "password"), [(u, p) for u, p, _, _ in DEMO_USERS])
def test_demo_passwords_meet_the_validators(db, username, password):
    validate_password(password, get_user_model()(username=username))


def test_demo_users_log_in_with_the_printed_passwords(db, client, settings, tmp_path):
    settings.HCS_LOCAL_EXECUTOR_DIR = tmp_path / "local-jobs"
    call_command("demo", stdout=io.StringIO())
    for username, password, _, _ in DEMO_USERS:
        response = client.post("/accounts/login/", {"username": username, "password": password})
        assert response.status_code == 302, username
        client.logout()
