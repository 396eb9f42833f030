"""``Idempotency-Key`` on submits: a POST retried after its answer was lost gets that answer, not a second task.

The first successful answer to a key is stored with it (``IdempotentRequest``, unique per user) in the same
transaction as the write, so every web process sees it and two copies sent at once create one task: the second
waits on the key's row and then replays the first's answer. The same key with another body, or on another
endpoint, is refused with 422. Keys are remembered for ``KEY_TTL``; only successful answers are kept, so a
request refused for its content can be corrected and sent again with the same key. docs/api.md describes it.
"""

from __future__ import annotations

import functools
import hashlib
import json
import re
from datetime import timedelta

from django.db import IntegrityError, transaction
from django.utils import timezone
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse
from rest_framework import exceptions, status
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.utils.encoders import JSONEncoder

from apps.core.api.schema import ErrorDetailSerializer
from apps.tasks.models import IdempotentRequest

HEADER = "Idempotency-Key"
REPLAYED_HEADER = "Idempotent-Replayed"
KEY_TTL = timedelta(hours=24)
# Visible ASCII, as a header value may hold; a UUID is the usual key.
KEY_PATTERN = re.compile(r"[\x21-\x7e]{1,255}")

PARAMETER = OpenApiParameter(
    HEADER,
    {"type": "string", "minLength": 1, "maxLength": 255, "pattern": "^[!-~]+$"},
    OpenApiParameter.HEADER,
    required=False,
    description="A key of your choosing (1 to 255 visible ASCII characters; a fresh UUID per submit). Sent again "
    "with the same body within 24 hours, it gets the first answer again (same status and body, header "
    f"`{REPLAYED_HEADER}: true`) and nothing is created twice; with another body it gets 422.",
)
KEY_REUSED = OpenApiResponse(
    ErrorDetailSerializer, description=f"The {HEADER} was used for a different request within the last 24 hours."
)


class KeyReused(exceptions.APIException):
    """The key came with a different request than the one it first answered."""

    status_code = status.HTTP_422_UNPROCESSABLE_ENTITY
    default_code = "idempotency_key_reused"


def _fingerprint(request: Request) -> str:
    """SHA-256 of the method, path and parsed body (keys sorted, so a re-encoded body matches)."""
    data = request.data
    if hasattr(data, "lists"):
        data = dict(data.lists())
    body = json.dumps(data, sort_keys=True, separators=(",", ":"), cls=JSONEncoder)
    return hashlib.sha256(f"{request.method} {request.path}\n{body}".encode()).hexdigest()


def _replay(record: IdempotentRequest, fingerprint: str) -> Response:
    if record.fingerprint != fingerprint:
        raise KeyReused(
            f"This {HEADER} was used for a different request (another body or endpoint) at "
            f"{record.created_at.isoformat()}; send a new key for a new request."
        )
    return Response(record.body, status=record.status_code, headers={REPLAYED_HEADER: "true"})


def _stored(user, key: str) -> IdempotentRequest | None:
    record = IdempotentRequest.objects.filter(user=user, key=key).first()
    if record is not None and record.created_at <= timezone.now() - KEY_TTL:
        record.delete()
        return None
    return record


def idempotent(create):
    """Decorate a DRF view's create method: with an ``Idempotency-Key`` header it runs at most once per key and
    user, and retries get its first successful answer (see the module's docstring)."""

    @functools.wraps(create)
    def wrapper(view, request: Request, *args, **kwargs) -> Response:
        key = request.headers.get(HEADER)
        if key is None:
            return create(view, request, *args, **kwargs)
        if not KEY_PATTERN.fullmatch(key):
            raise exceptions.ValidationError(
                {HEADER: [f"Expected 1 to 255 visible ASCII characters (a UUID, say), got {key[:300]!r}."]}
            )
        fingerprint = _fingerprint(request)
        with transaction.atomic():
            record = _stored(request.user, key)
            if record is not None:
                return _replay(record, fingerprint)
            try:
                # The same key in flight elsewhere holds this row: wait for it, then answer as it did.
                with transaction.atomic():
                    record = IdempotentRequest.objects.create(
                        user=request.user, key=key, fingerprint=fingerprint, status_code=0, body={}
                    )
            except IntegrityError:
                return _replay(IdempotentRequest.objects.get(user=request.user, key=key), fingerprint)
            response = create(view, request, *args, **kwargs)
            if status.is_success(response.status_code):
                record.status_code = response.status_code
                record.body = json.loads(json.dumps(response.data, cls=JSONEncoder))
                record.save(update_fields=["status_code", "body"])
            else:
                record.delete()
            return response

    return wrapper


def forget_expired() -> int:
    """Delete keys older than ``KEY_TTL``; returns how many."""
    deleted, _ = IdempotentRequest.objects.filter(created_at__lte=timezone.now() - KEY_TTL).delete()
    return deleted
