"""KubernetesExecutor against a real cluster: runs only when KUBECONFIG points at one.

The namespace is HCS_K8S_TEST_NAMESPACE (default "default"); the test needs to pull busybox.
"""

from __future__ import annotations

import os
import time
import uuid

import pytest

from apps.clusters.executors.base import JobPhase
from apps.clusters.executors.kubernetes import KubernetesExecutor
from tests.executors_k8s.specs import spec

pytestmark = [
    pytest.mark.kubernetes_real,
    pytest.mark.skipif(not os.environ.get("KUBECONFIG"), reason="KUBECONFIG is not set: no real cluster to run on"),
]

NAMESPACE = os.environ.get("HCS_K8S_TEST_NAMESPACE", "default")
DEADLINE_S = 300


@pytest.fixture
def executor() -> KubernetesExecutor:
    return KubernetesExecutor(kubeconfig=os.environ["KUBECONFIG"], namespace=NAMESPACE)


def wait_for(predicate, timeout: float = DEADLINE_S, interval: float = 2.0):
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value or time.monotonic() > deadline:
            return value
        time.sleep(interval)


def test_busybox_job_runs_to_completion_and_is_deleted(executor):
    assert executor.health().startswith("Kubernetes v")
    unique = uuid.uuid4().hex[:6]
    job_spec = spec(
        name=f"hcs-real-{unique}",
        command="echo hello from hcs; sleep 2",
        cpu=0.1,
        memory_gib=0.0625,
        instances=2,
        labels={"hcs/test-run": unique},
    )
    ext_id = executor.submit(job_spec)
    try:
        assert executor.submit(job_spec) == ext_id  # idempotent

        state = wait_for(lambda: (s := executor.status(ext_id)).phase in (JobPhase.SUCCEEDED, JobPhase.FAILED) and s)
        assert state, f"job did not finish within {DEADLINE_S}s: {executor.status(ext_id)}"
        assert state.phase == JobPhase.SUCCEEDED, state.message
        assert "hello from hcs" in executor.logs(ext_id)
        assert [s.external_id for s in executor.list_by_owner({"hcs/test-run": unique})] == [ext_id]
    finally:
        executor.delete(ext_id)

    assert wait_for(lambda: executor.status(ext_id).phase == JobPhase.LOST, timeout=60)
    assert wait_for(lambda: executor.list_by_owner({"hcs/test-run": unique}) == [], timeout=60)
