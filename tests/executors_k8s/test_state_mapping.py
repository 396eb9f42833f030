"""Kubernetes object status -> JobPhase, on plain dicts (the cases the emulator tests do not walk)."""

from __future__ import annotations

import pytest

from apps.clusters.executors.base import JobPhase
from apps.clusters.executors.kubernetes import deployment_state, job_state, pod_state, volcano_state

ID = "ns/job/x"


def pod(phase: str, **status) -> dict:
    return {"metadata": {"name": "x-0"}, "status": {"phase": phase, **status}}


def test_pod_preempted_by_the_scheduler_is_preempted():
    condition = {"type": "DisruptionTarget", "status": "True", "reason": "PreemptionByScheduler", "message": "by y"}
    state = pod_state(ID, pod("Failed", conditions=[condition]))
    assert (state.phase, state.message) == (JobPhase.PREEMPTED, "by y")


def test_pod_evicted_is_failed_with_the_kubelets_reason():
    state = pod_state(ID, pod("Failed", reason="Evicted", message="The node was low on resource: memory."))
    assert (state.phase, state.message) == (JobPhase.FAILED, "Evicted: The node was low on resource: memory.")


@pytest.mark.parametrize("state_of", [pod_state, job_state, deployment_state, volcano_state])
def test_a_workload_being_deleted_is_cancelled(state_of):
    obj = {"metadata": {"deletionTimestamp": "2026-11-21T04:00:00Z"}, "status": {"phase": "Running"}}
    args = (ID, obj) if state_of is pod_state else (ID, obj, [])
    assert state_of(*args).phase == JobPhase.CANCELLED


def test_pod_succeeded_has_exit_code_zero_and_unknown_phase_is_unknown():
    assert pod_state(ID, pod("Succeeded")).exit_code == 0
    assert pod_state(ID, pod("Unknown")).phase == JobPhase.UNKNOWN


def test_crash_looping_container_keeps_running_with_the_reason():
    status = {"containerStatuses": [{"name": "main", "state": {"waiting": {"reason": "CrashLoopBackOff"}}}]}
    state = pod_state(ID, pod("Running", **status))
    assert (state.phase, state.message) == (JobPhase.RUNNING, "CrashLoopBackOff")


def test_job_counts_without_conditions_still_complete_it():
    job = {"spec": {"completions": 2}, "status": {"succeeded": 2}}
    assert job_state(ID, job, []).phase == JobPhase.SUCCEEDED


def test_failed_job_reports_the_first_nonzero_exit_code_of_its_pods():
    job = {"status": {"conditions": [{"type": "Failed", "status": "True", "reason": "DeadlineExceeded"}]}}
    ok = {"status": {"containerStatuses": [{"name": "main", "state": {"terminated": {"exitCode": 0}}}]}}
    bad = {"status": {"containerStatuses": [{"name": "main", "state": {"terminated": {"exitCode": 137}}}]}}
    state = job_state(ID, job, [ok, bad])
    assert (state.phase, state.message, state.exit_code) == (JobPhase.FAILED, "DeadlineExceeded", 137)
    assert state.failure == "wall_time"


def test_failure_reasons_of_pods_and_jobs():
    oom = {"containerStatuses": [{"name": "main", "state": {"terminated": {"exitCode": 137, "reason": "OOMKilled"}}}]}
    assert pod_state(ID, pod("Failed", **oom)).failure == "out_of_memory"
    crashed = {"containerStatuses": [{"name": "main", "state": {"terminated": {"exitCode": 1, "reason": "Error"}}}]}
    assert pod_state(ID, pod("Failed", **crashed)).failure == "exit_code"
    evicted = pod_state(ID, pod("Failed", reason="Evicted"))
    assert evicted.failure == "backend"
    bad_image = {"containerStatuses": [{"name": "main", "state": {"waiting": {"reason": "InvalidImageName"}}}]}
    assert pod_state(ID, pod("Pending", **bad_image)).failure == "launch_failed"
    failed_job = {"status": {"conditions": [{"type": "Failed", "status": "True", "reason": "BackoffLimitExceeded"}]}}
    assert job_state(ID, failed_job, [{"status": oom}]).failure == "out_of_memory"


def test_suspended_job_is_pending():
    job = {"status": {"conditions": [{"type": "Suspended", "status": "True"}]}}
    assert job_state(ID, job, []).phase == JobPhase.PENDING


def test_deployment_replica_failure_is_the_message_while_pending():
    deployment = {
        "spec": {"replicas": 1},
        "status": {
            "conditions": [{"type": "ReplicaFailure", "status": "True", "reason": "FailedCreate", "message": "quota"}]
        },
    }
    state = deployment_state(ID, deployment, [])
    assert (state.phase, state.message) == (JobPhase.PENDING, "FailedCreate: quota")


@pytest.mark.parametrize(
    ("raw", "phase"),
    [("Restarting", JobPhase.RUNNING), ("Terminated", JobPhase.FAILED), ("Mystery", JobPhase.UNKNOWN)],
)
def test_other_volcano_phases(raw, phase):
    assert volcano_state(ID, {"status": {"state": {"phase": raw}}}, []).phase == phase


def test_pending_volcano_job_explains_itself_with_its_pods_problem():
    waiting_pod = {
        "status": {
            "phase": "Pending",
            "conditions": [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": "gang"}],
        }
    }
    state = volcano_state(ID, {"status": {"state": {"phase": "Pending"}}}, [waiting_pod])
    assert state.message == "Unschedulable: gang"
