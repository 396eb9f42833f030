"""An unreachable cluster is logged once a minute, not at every reconciliation (every 2 s) nor at every retry."""

from __future__ import annotations

import logging
from types import SimpleNamespace

import pytest
import redis

from apps.clusters.executors.kubernetes import KubernetesExecutor
from apps.control import outages, reconcile
from hcsportal import redis_guard

pytestmark = pytest.mark.django_db

# A port nothing listens on: every call is refused (and retried by the Kubernetes client's urllib3).
NOWHERE = "http://127.0.0.1:1"


@pytest.fixture(autouse=True)
def no_marks(world):
    keys = [outages._KEY.format(cluster_id=world.cluster.pk, what=w) for w in ("since", "warned", "skipped")]
    redis_guard.client().delete(*keys)
    outages._local.delete(*keys)
    yield
    redis_guard.client().delete(*keys)


@pytest.fixture
def unreachable(world, monkeypatch):
    monkeypatch.setattr(reconcile, "executor_for", lambda cluster: KubernetesExecutor(host=NOWHERE))
    return world.cluster


def warnings(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]


def test_many_failed_reconciliations_give_one_warning(unreachable, caplog):
    caplog.set_level(logging.INFO)
    for _ in range(30):
        assert not reconcile.reconcile_cluster(unreachable.pk).reachable
    assert len(warnings(caplog)) == 1, warnings(caplog)
    assert warnings(caplog)[0].startswith(f"cluster {unreachable.name} does not answer: cannot list the backend")
    assert not [r for r in caplog.records if r.getMessage().startswith("Retrying (")]


def test_after_a_minute_one_more_warning_counts_what_was_not_logged(unreachable, caplog):
    caplog.set_level(logging.INFO)
    for _ in range(5):
        reconcile.reconcile_cluster(unreachable.pk)
    redis_guard.client().delete(outages._KEY.format(cluster_id=unreachable.pk, what="warned"))  # the minute is over
    reconcile.reconcile_cluster(unreachable.pk)
    said = warnings(caplog)
    assert len(said) == 2, said
    assert "still does not answer after" in said[1] and "(4 failure(s) not logged since the last warning)" in said[1]


def test_an_answer_is_logged_once_and_the_next_outage_warns_again(unreachable, world, caplog):
    caplog.set_level(logging.INFO)
    for _ in range(3):
        outages.unreachable(world.cluster, "refused")
    outages.answered(world.cluster)
    outages.answered(world.cluster)
    infos = [r.getMessage() for r in caplog.records if r.name == outages.__name__ and r.levelno == logging.INFO]
    assert len(infos) == 1 and infos[0].startswith(f"cluster {world.cluster.name} answers again")
    outages.unreachable(world.cluster, "refused")
    assert warnings(caplog) == [f"cluster {world.cluster.name} does not answer: refused"] * 2


def test_without_redis_each_process_keeps_its_own_minute(world, caplog, monkeypatch):
    def down(**_):
        raise redis.ConnectionError("Redis is out")

    monkeypatch.setattr(outages, "redis_guard", SimpleNamespace(client=down))
    caplog.set_level(logging.INFO)
    for _ in range(10):
        outages.unreachable(world.cluster, "refused")
    assert len(warnings(caplog)) == 1
    outages.answered(world.cluster)
    assert any("answers again" in r.getMessage() for r in caplog.records)
