"""Replicas of an inference service the portal scales on Slurm: each extra replica is a Slurm job of its own.

Unit tests of the job names, labels and the folding of replica jobs into their service's state (no cluster),
then a service resized 1 -> 2 -> 1 on the real dev cluster, read back through the executor and slurmrestd.
"""

from __future__ import annotations

import json
import time

import pytest

from apps.clusters.executors.base import DeviceSlot, JobPhase, NodePlacement
from apps.clusters.executors.slurm import (
    LABEL_REPLICA,
    LABEL_REPLICA_OF,
    LABEL_SCALED,
    SlurmExecutor,
    replica_key,
)

from .conftest import A100, build_spec

ACTIVE = {JobPhase.PENDING, JobPhase.RUNNING}
FINAL = {JobPhase.SUCCEEDED, JobPhase.FAILED, JobPhase.CANCELLED, JobPhase.LOST}


def card(node: str, *indices: int) -> NodePlacement:
    return NodePlacement(node=node, devices=tuple(DeviceSlot(index=i) for i in indices))


def service_spec(placements, **overrides):
    values = {
        "kind": "inference",
        "command": "sleep 300",
        "gpu_model": A100,
        "gpus_per_instance": 1,
        "settings": {"min_replicas": 1, "max_replicas": 3},
        "instances": len(placements),
        "placements": tuple(placements),
    }
    values.update(overrides)
    return build_spec(**values)


class FakeSlurm(SlurmExecutor):
    """A Slurm executor whose job listing, reads, submits and cancels are a list in memory."""

    def __init__(self, records):
        super().__init__(endpoint="http://127.0.0.1:9", token="t", user="hcs", output_dir="/shared/out")
        self.records, self.cancelled, self.posted = records, [], []

    def _jobs(self):
        return self.records

    def _record(self, external_id):
        return next((r for r in self.records if str(r["job_id"]) == str(external_id)), None)

    def _cancel(self, external_id):
        self.cancelled.append(external_id)
        self._record(external_id)["job_state"] = "CANCELLED"

    def _post(self, spec, description):
        job_id = 1000 + len(self.posted)
        self.posted.append(description)
        self.records.append({"job_id": job_id, "job_state": "PENDING", **description["job"]})
        return str(job_id)


def record(job_id, state, comment, name="svc"):
    return {"job_id": job_id, "job_state": state, "name": name, "comment": json.dumps(comment)}


# -- naming and labels (no cluster) ---------------------------------------------------------------


def test_a_scaled_service_job_is_marked_and_its_replica_jobs_carry_the_attempts_identity():
    spec = service_spec([card("n1", 0), card("n2", 3, 4)])
    fake = FakeSlurm([])

    main_id = fake.submit(spec)

    main, replica = fake.posted
    assert main["job"]["name"] == spec.name and main["job"]["nodelist"] == "n1"
    assert json.loads(main["job"]["comment"]) == {**spec.labels, LABEL_SCALED: "1"}
    assert replica["job"]["name"] == f"{spec.name}-n2-gpu-3-4" and replica["job"]["nodelist"] == "n2"
    assert replica["job"]["nodes"] == [1, 1] and replica["job"]["gres"] == "gpu:a100:1"
    assert json.loads(replica["job"]["comment"]) == {
        **spec.labels,
        LABEL_REPLICA_OF: main_id,
        LABEL_REPLICA: "n2-gpu-3-4",
    }
    assert replica["job"]["standard_output"] == f"/shared/out/{spec.name}-n2-gpu-3-4.out"
    assert (replica_key(card("n1"), 2), replica_key(card("n1", 7), 2)) == ("n1-r2", "n1-gpu-7")
    # Other jobs are not marked: a training job, or a service without autoscaling.
    assert LABEL_SCALED not in fake.job_description(build_spec())["job"]["comment"]
    assert LABEL_SCALED not in fake.job_description(build_spec(kind="inference"))["job"]["comment"]


def test_listings_fold_replica_jobs_into_their_service_and_cancel_orphans():
    labels = {"hcs.io/task-uid": "u", "hcs.io/attempt": "1"}
    fake = FakeSlurm(
        [
            record(1, "RUNNING", {**labels, LABEL_SCALED: "1"}),
            record(2, "RUNNING", {**labels, LABEL_REPLICA_OF: "1", LABEL_REPLICA: "n2-gpu-0"}),
            record(3, "PENDING", {**labels, LABEL_REPLICA_OF: "1", LABEL_REPLICA: "n3-gpu-0"}),
            record(4, "CANCELLED", {**labels, LABEL_REPLICA_OF: "1", LABEL_REPLICA: "n4-gpu-0"}),
            record(5, "COMPLETED", {"hcs.io/task-uid": "v", "hcs.io/attempt": "1", LABEL_SCALED: "1"}),
            record(6, "RUNNING", {"hcs.io/task-uid": "v", "hcs.io/attempt": "1", LABEL_REPLICA_OF: "5"}),
            record(7, "RUNNING", {"hcs.io/task-uid": "w", "hcs.io/attempt": "1", LABEL_REPLICA_OF: "99"}),
        ]
    )

    states = fake.list_by_owner({"hcs.io/attempt": "1"})

    assert [(s.external_id, s.replicas, s.desired_replicas) for s in states] == [("1", 2, 3), ("5", None, None)]
    assert sorted(fake.cancelled) == ["6", "7"]  # the replicas of an ended service, and of one Slurm forgot
    assert (fake.status("1").replicas, fake.status("1").desired_replicas) == (2, 3)


def test_resize_submits_new_placements_cancels_those_that_left_and_restarts_dead_ones():
    spec = service_spec([card("n1", 0)])
    fake = FakeSlurm([])
    main_id = fake.submit(spec)
    fake.records[0]["job_state"] = "RUNNING"

    fake.resize(main_id, 3, spec=service_spec([card("n1", 0), card("n2", 0), card("n3", 1)], task_id=spec.task_id))
    assert [p["job"]["nodelist"] for p in fake.posted] == ["n1", "n2", "n3"]
    fake.resize(main_id, 3, spec=service_spec([card("n1", 0), card("n2", 0), card("n3", 1)], task_id=spec.task_id))
    assert len(fake.posted) == 3 and fake.cancelled == []  # idempotent

    fake.records[1]["job_state"] = "FAILED"  # the n2 replica died
    fake.resize(main_id, 2, spec=service_spec([card("n1", 0), card("n2", 0)], task_id=spec.task_id))
    assert [p["job"]["nodelist"] for p in fake.posted] == ["n1", "n2", "n3", "n2"]
    assert fake.cancelled == ["1002"]  # n3 left the placement

    fake.stop(main_id)
    assert fake.cancelled == ["1002", main_id, "1003"]
    with pytest.raises(Exception, match="placements"):
        fake.resize(main_id, 2, spec=service_spec([card("n1", 0)]))


def test_a_services_instances_are_its_job_and_its_running_replica_jobs():
    labels = {"hcs.io/task-uid": "u", "hcs.io/attempt": "1"}
    fake = FakeSlurm(
        [
            {**record(1, "RUNNING", {**labels, LABEL_SCALED: "1"}), "nodes": "n1"},
            {**record(3, "RUNNING", {**labels, LABEL_REPLICA_OF: "1"}, name="svc-n3-gpu-0"), "nodes": "n3"},
            {**record(2, "RUNNING", {**labels, LABEL_REPLICA_OF: "1"}, name="svc-n2-gpu-0"), "nodes": "n2"},
            {**record(4, "PENDING", {**labels, LABEL_REPLICA_OF: "1"}, name="svc-n4-gpu-0"), "nodes": ""},
        ]
    )
    fake._call = lambda method, path, payload=None, api="slurm": (
        {"nodes": [{"name": f"n{i}", "address": f"10.0.0.{i}"} for i in range(1, 5)]},
        [],
    )

    instances = fake.instances("1")

    assert [(i.index, i.name, i.ip) for i in instances] == [
        (0, "1/n1", "10.0.0.1"),
        (1, "2/n2", "10.0.0.2"),
        (2, "3/n3", "10.0.0.3"),
    ]


def test_only_scaled_services_are_resized():
    fake = FakeSlurm([])
    with pytest.raises(Exception, match="only inference services") as err:
        fake.resize("1", 2, spec=build_spec(instances=2, placements=(card("n1"), card("n2"))))
    assert err.value.retryable is False
    assert SlurmExecutor.scales_services is True


# -- the real dev cluster -------------------------------------------------------------------------


def active_jobs_of(executor: SlurmExecutor, task_id: int) -> list[dict]:
    """The task's jobs slurmrestd lists as not ended (ending ones included), read without the executor's folding."""
    body, errors = executor._call("GET", "jobs")
    assert not errors, errors
    return [
        job
        for job in body["jobs"]
        if json.loads(job.get("comment") or "{}").get("hcs/task-id") == str(task_id)
        and job["job_state"].split("+")[0] in ("PENDING", "CONFIGURING", "RUNNING", "COMPLETING")
    ]


def wait_until(predicate, timeout=60.0):
    deadline = time.monotonic() + timeout
    while not (value := predicate()) and time.monotonic() < deadline:
        time.sleep(0.3)
    return value


@pytest.fixture
def slurm_executor(slurm_cluster):
    executor = SlurmExecutor(**slurm_cluster.executor_kwargs())
    yield executor
    executor._listing = None


@pytest.mark.slurm
def test_a_service_resized_1_2_1_runs_that_many_slurm_jobs_and_stopping_it_cancels_all(slurm_executor):
    slurm = slurm_executor
    one = service_spec([card("hcs-node-1", 0)])
    two = service_spec([card("hcs-node-1", 0), card("hcs-node-2", 0)], task_id=one.task_id)
    job_id = slurm.submit(one)
    try:
        assert wait_until(lambda: slurm.status(job_id).replicas == 1), slurm.status(job_id)

        slurm.resize(job_id, 2, spec=two)
        assert wait_until(lambda: slurm.status(job_id).replicas == 2), slurm.status(job_id)
        jobs = active_jobs_of(slurm, one.task_id)
        assert sorted(j["nodes"] for j in jobs) == ["hcs-node-1", "hcs-node-2"]
        [listed] = slurm.list_by_owner({"hcs/task-id": str(one.task_id)})  # one state per attempt
        assert (listed.external_id, listed.replicas, listed.desired_replicas) == (job_id, 2, 2)
        assert sorted(i.node for i in slurm.instances(job_id)) == ["hcs-node-1", "hcs-node-2"]
        assert slurm.port_endpoint(job_id, 1, 8000).port == 8000
        with pytest.raises(Exception, match="no instance 2"):
            slurm.port_endpoint(job_id, 2, 8000)

        # A replica job that dies is submitted again by the next resize (the reconciler's, with the same size).
        [replica] = [j for j in jobs if str(j["job_id"]) != job_id]
        slurm._cancel(str(replica["job_id"]))
        assert wait_until(lambda: slurm.status(job_id).replicas == 1)
        slurm.resize(job_id, 2, spec=two)
        assert wait_until(lambda: slurm.status(job_id).replicas == 2)
        assert str(replica["job_id"]) not in {str(j["job_id"]) for j in active_jobs_of(slurm, one.task_id)}

        slurm.resize(job_id, 1, spec=one)
        assert wait_until(lambda: len(active_jobs_of(slurm, one.task_id)) == 1), active_jobs_of(slurm, one.task_id)
        assert [str(j["job_id"]) for j in active_jobs_of(slurm, one.task_id)] == [job_id]
        assert (slurm.status(job_id).replicas, slurm.status(job_id).desired_replicas) == (1, 1)

        slurm.resize(job_id, 2, spec=two)
        assert wait_until(lambda: len(active_jobs_of(slurm, one.task_id)) == 2)
    finally:
        slurm.stop(job_id)
    assert wait_until(lambda: not active_jobs_of(slurm, one.task_id), timeout=30), active_jobs_of(slurm, one.task_id)
    assert slurm.status(job_id).phase in FINAL
