"""Markers for tests that need a real service: outside CI they skip with a reason, in CI they must run."""

import os

import pytest
from django.conf import settings

IN_CI = os.environ.get("CI", "").lower() == "true"

# CI always runs on PostgreSQL (tests/conftest.py refuses anything else), so this never skips there.
requires_postgres = pytest.mark.skipif(
    settings.DATABASES["default"]["ENGINE"] != "django.db.backends.postgresql" and not IN_CI,
    reason="needs PostgreSQL row locks: set DATABASE_URL=postgres://...",
)
