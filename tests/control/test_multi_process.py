"""Several web and worker processes and one beat on one PostgreSQL and Redis keep every invariant.

Runs ``benchmarks.multi_process`` small: 2 uvicorn web processes, 3 Celery workers and beat, a database of its own
on the PostgreSQL server and database 15 of the Redis server; 40 submissions from 8 client threads through both
web processes, each a real sandboxed job on the local cluster. Nothing accepted is lost, no card is held twice
while it runs, and every run was placed and launched exactly once.
"""

from __future__ import annotations

import os

import pytest
from django.conf import settings

from benchmarks.multi_process import run


@pytest.mark.postgres
@pytest.mark.processes
@pytest.mark.django_db
def test_two_web_three_workers_and_beat_keep_the_invariants_under_concurrent_submits():
    figures = run(
        tasks=40, clients=8, drain_timeout_s=240, server_url=os.environ["DATABASE_URL"], base_redis=settings.REDIS_URL
    )
    assert figures.violations == []
    assert figures.submitted == 40
    assert figures.samples > 5 and figures.cycles > 0
