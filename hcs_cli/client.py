"""The REST API (``/api/v1/``) as ``hcs`` uses it: token authentication, JSON in and out, errors as
:class:`ApiError` carrying the API's own field errors."""

from __future__ import annotations

import sys
import time

import requests

TIMEOUT_S = 30
USER_AGENT = "hcs-cli"
# A 503 with Retry-After is the server saying "not now" (its database connection dropped, docs/api.md): a request
# safe to send again (a GET, or one under an Idempotency-Key) is sent again after the wait it asks for, this often.
UNAVAILABLE_RETRIES = 3
RETRY_AFTER_MAX_S = 10.0


class ApiError(Exception):
    """The API refused a request: its status and its body (field errors or ``detail``)."""

    def __init__(self, status: int, body):
        super().__init__(f"HTTP {status}")
        self.status = status
        self.body = body

    def lines(self) -> list[str]:
        """The API's messages, one a line: ``field: message`` for field errors, ``detail`` as it is."""
        return list(_messages(self.body)) or [f"HTTP {self.status}"]


def _messages(body, prefix: str = ""):
    if isinstance(body, dict):
        for key, value in body.items():
            label = "" if key in ("detail", "non_field_errors") else key
            yield from _messages(value, f"{prefix}.{label}" if prefix and label else prefix or label)
    elif isinstance(body, list):
        for item in body:
            yield from _messages(item, prefix)
    elif body is not None:
        yield f"{prefix}: {body}" if prefix else str(body)


class ConnectionFailed(Exception):
    """The server could not be reached (or answered something that is not the API)."""


class _Unavailable(Exception):
    """A 503 with Retry-After: the API's error and the seconds to wait before the next try."""

    def __init__(self, error: ApiError, retry_after: float):
        super().__init__(str(error))
        self.error = error
        self.retry_after = retry_after


def _seconds(retry_after: str) -> float:
    """Retry-After in seconds (an HTTP date or nonsense: 2 s), at most RETRY_AFTER_MAX_S."""
    try:
        return min(max(float(retry_after), 0.0), RETRY_AFTER_MAX_S)
    except ValueError:
        return 2.0


class Client:
    """One server, one token (or none, for the login call itself)."""

    def __init__(self, base_url: str, token: str = ""):
        self.base_url = base_url.rstrip("/")
        self.session = requests.Session()
        self.session.headers["User-Agent"] = USER_AGENT
        self.session.headers["Accept"] = "application/json"
        if token:
            self.session.headers["Authorization"] = f"Token {token}"

    def url(self, path: str) -> str:
        return path if path.startswith(("http://", "https://")) else f"{self.base_url}/api/v1/{path.lstrip('/')}"

    def request(
        self, method: str, path: str, *, params: dict | None = None, json=None, data=None, headers: dict | None = None
    ):
        repeatable = method in ("GET", "HEAD") or "Idempotency-Key" in (headers or {})
        tries = 0
        while True:
            try:
                return self._request_once(method, path, params=params, json=json, data=data, headers=headers)
            except _Unavailable as unavailable:
                tries += 1
                if not repeatable or tries > UNAVAILABLE_RETRIES:
                    raise unavailable.error from None
                wait = unavailable.retry_after
                message = "; ".join(unavailable.error.lines())
                print(f"hcs: {message} (retrying in {wait:g} s)", file=sys.stderr)
                time.sleep(wait)

    def _request_once(self, method: str, path: str, *, params, json, data, headers):
        try:
            response = self.session.request(
                method, self.url(path), params=params, json=json, data=data, headers=headers, timeout=TIMEOUT_S
            )
        except requests.RequestException as exc:
            raise ConnectionFailed(f"Cannot reach {self.base_url}: {exc}") from None
        try:
            body = response.json() if response.content else None
        except ValueError:
            raise ConnectionFailed(
                f"{self.base_url} answered HTTP {response.status_code} with {response.headers.get('Content-Type')}, "
                "not the API's JSON: is this the portal's address?"
            ) from None
        if response.status_code == 503 and "Retry-After" in response.headers:
            raise _Unavailable(ApiError(503, body), _seconds(response.headers["Retry-After"]))
        if response.status_code >= 400:
            raise ApiError(response.status_code, body)
        return body

    def get(self, path: str, params: dict | None = None):
        return self.request("GET", path, params=params)

    def post(self, path: str, json=None, data=None, headers: dict | None = None):
        return self.request("POST", path, json=json, data=data, headers=headers)

    def delete(self, path: str):
        return self.request("DELETE", path)

    def pages(self, path: str, params: dict | None = None, limit: int = 1000):
        """The results of a paginated list, following ``next`` until ``limit`` rows."""
        body = self.get(path, params)
        rows = list(body["results"])
        while body.get("next") and len(rows) < limit:
            body = self.get(body["next"])
            rows.extend(body["results"])
        return rows[:limit]
