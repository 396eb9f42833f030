"""SlurmExecutor.instances(): one instance per node of a running job, on the dev Slurm cluster."""

from __future__ import annotations

import time

import pytest

from apps.clusters.executors.base import JobPhase
from apps.clusters.executors.slurm import NO_USAGE_NOTE, SlurmExecutor, expand_hostlist

from .test_slurm import FINAL, wait_for


@pytest.fixture
def slurm(slurm_cluster):
    return SlurmExecutor(**slurm_cluster.executor_kwargs())


def test_compressed_host_lists_expand_like_slurm():
    assert expand_hostlist("hcs-node-[1-2]") == ["hcs-node-1", "hcs-node-2"]
    assert expand_hostlist("gpu[01-03,07],login") == ["gpu01", "gpu02", "gpu03", "gpu07", "login"]
    assert expand_hostlist("") == []


@pytest.mark.slurm
def test_a_running_two_node_job_has_an_instance_per_node(slurm, make_spec):
    job_id = slurm.submit(make_spec(command="sleep 60", instances=2))
    deadline = time.monotonic() + 60
    while slurm.status(job_id).phase != JobPhase.RUNNING and time.monotonic() < deadline:
        time.sleep(0.5)
    try:
        nodes = slurm.status(job_id).nodes  # the compressed host list, expanded
        assert len(nodes) == 2 and all(n.startswith("hcs-node-") for n in nodes), nodes
        first, second = slurm.instances(job_id)
        assert (first.index, second.index) == (0, 1)
        assert first.node != second.node and first.node.startswith("hcs-node-")
        assert first.name == f"{job_id}/{first.node}" and first.state.startswith("RUNNING")
        assert first.ip  # the node's NodeAddr
        assert first.cpu_used_cores is None and first.usage_note == NO_USAGE_NOTE
        assert first.started_at is not None and first.restarts == 0
    finally:
        slurm.stop(job_id)
    assert wait_for(slurm, job_id, FINAL).phase == JobPhase.CANCELLED
    assert slurm.instances("999999999") == []
