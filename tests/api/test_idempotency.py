"""Idempotency-Key on task submits: a retry gets the first answer and no second task; the same key with another
body is a 422; keys are per user and last a day; copies sent at once create one task."""

from __future__ import annotations

import threading
import uuid
from datetime import timedelta

import pytest
from django.db import connection
from django.utils import timezone

from apps.tasks import idempotency
from apps.tasks.models import IdempotentRequest, Task
from tests.api.base import client_for

TASKS = "/api/v1/tasks/"
BODY = {"project": "alpha", "queue": "high", "name": "job", "kind": "training", "command": "echo hi"}


def submit(user, key: str | None, **fields):
    headers = {"HTTP_IDEMPOTENCY_KEY": key} if key is not None else {}
    return client_for(user).post(TASKS, {**BODY, **fields}, format="json", **headers)


def test_a_retried_submit_gets_the_first_answer_and_creates_no_second_task(world):
    key = str(uuid.uuid4())
    first = submit(world.member, key)
    assert first.status_code == 201, first.data
    again = submit(world.member, key)
    assert again.status_code == 201
    assert again.json() == first.json()
    assert again["Idempotent-Replayed"] == "true" and not first.has_header("Idempotent-Replayed")
    assert Task.objects.filter(project=world.project).count() == 1
    # The body as it was sent matters, not its key order.
    reordered = client_for(world.member).post(
        TASKS, dict(reversed(BODY.items())), format="json", HTTP_IDEMPOTENCY_KEY=key
    )
    assert reordered.status_code == 201 and reordered.json()["id"] == first.json()["id"]
    # Without a key every submit is a new task.
    assert submit(world.member, None).status_code == 201 and submit(world.member, None).status_code == 201
    assert Task.objects.filter(project=world.project).count() == 3


def test_the_same_key_with_another_body_is_a_422_and_writes_nothing(world):
    key = str(uuid.uuid4())
    assert submit(world.member, key).status_code == 201
    other = submit(world.member, key, name="another-job")
    assert other.status_code == 422
    assert "used for a different request" in other.json()["detail"] and "new key" in other.json()["detail"]
    assert Task.objects.filter(project=world.project).count() == 1


def test_keys_belong_to_their_user(world):
    key = str(uuid.uuid4())
    mine, theirs = submit(world.member, key), submit(world.owner, key)
    assert mine.status_code == theirs.status_code == 201
    assert mine.json()["id"] != theirs.json()["id"] and theirs.json()["owner"] == world.owner.username


def test_a_refused_submit_is_not_remembered_so_the_corrected_one_goes_through(world):
    key = str(uuid.uuid4())
    refused = submit(world.member, key, gpu_spec="2(NOPE)")
    assert refused.status_code == 400
    assert not IdempotentRequest.objects.exists()
    accepted = submit(world.member, key)
    assert accepted.status_code == 201, accepted.data
    viewer_key = str(uuid.uuid4())
    assert submit(world.viewer, viewer_key).status_code == 403
    assert not IdempotentRequest.objects.filter(key=viewer_key).exists()


def test_a_key_is_forgotten_after_a_day(world):
    key = str(uuid.uuid4())
    first = submit(world.member, key)
    IdempotentRequest.objects.filter(key=key).update(created_at=timezone.now() - timedelta(hours=24, seconds=1))
    later = submit(world.member, key, name="next-day")
    assert later.status_code == 201 and later.json()["id"] != first.json()["id"]
    assert IdempotentRequest.objects.get(key=key).body["name"] == "next-day"
    IdempotentRequest.objects.filter(key=key).update(created_at=timezone.now() - timedelta(hours=25))
    assert idempotency.forget_expired() == 1 and not IdempotentRequest.objects.exists()


@pytest.mark.parametrize("key", ["", "x" * 256, "naïve", "two words"])
def test_a_key_that_is_not_visible_ascii_of_at_most_255_is_a_400(world, key):
    response = submit(world.member, key)
    assert response.status_code == 400
    assert "Expected 1 to 255 visible ASCII characters" in response.json()["Idempotency-Key"][0]
    assert not Task.objects.exists()


@pytest.mark.django_db(transaction=True)
def test_two_copies_sent_at_once_create_one_task(world, monkeypatch):
    """The second copy arrives while the first is inside the submit: it waits for the first's key row and
    then answers as the first did."""
    if connection.vendor == "sqlite" and connection.is_in_memory_db():
        pytest.skip("needs a database that other threads reach with connections of their own (PostgreSQL in CI)")
    from apps.tasks.api import serializers

    inside, release = threading.Event(), threading.Event()
    submit_task = serializers.submit_task

    def slow_submit(*args, **kwargs):
        inside.set()
        release.wait(10)
        return submit_task(*args, **kwargs)

    monkeypatch.setattr(serializers, "submit_task", slow_submit)
    key = str(uuid.uuid4())
    answers = {}

    def send(name):
        try:
            answers[name] = submit(world.member, key)
        finally:
            connection.close()

    first = threading.Thread(target=send, args=("first",))
    first.start()
    assert inside.wait(10)
    second = threading.Thread(target=send, args=("second",))
    second.start()
    second.join(1)  # time to reach the first's key row and wait on it
    release.set()
    first.join(20)
    second.join(20)
    assert answers["first"].status_code == answers["second"].status_code == 201
    assert answers["second"].json() == answers["first"].json()
    assert Task.objects.filter(project=world.project).count() == 1
