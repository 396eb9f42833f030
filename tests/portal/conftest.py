"""Fixtures of the portal tests: the GPU catalog for transactional tests and a logged-in session cookie."""

from __future__ import annotations

import importlib

import pytest
from django.apps import apps as django_apps

seed_migration = importlib.import_module("apps.clusters.migrations.0002_seed_gpu_catalog")


@pytest.fixture
def seeded_catalog(transactional_db):
    """Transactional tests start from a flushed database: put the GPU catalog back before the world is built."""
    seed_migration.seed(django_apps, None)


@pytest.fixture
def live_world(seeded_catalog, world):
    return world
