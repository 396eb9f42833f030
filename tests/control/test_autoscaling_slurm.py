"""Autoscaling on the real dev Slurm cluster: the portal's autoscaler asks for a second replica of a service,
the engine grants it, the reconciler runs it as a Slurm job of its own (never cancelled as a stray), the
service shrinks back to one job when the load goes, and stopping the task cancels every job."""

import json
import time

import pytest

from apps.clusters.backends import can_scale_services, executor_for
from apps.control import autoscaling
from apps.control.reconcile import installation_label
from apps.control.scheduling import run_cycle
from apps.tasks import request_rate
from apps.tasks.services import stop_task, submit_task
from tests.control.drive import intent, reconcile_all, run_until_running, wait_status

pytestmark = pytest.mark.slurm


def load(task, rps, now, seconds=30):
    """``rps`` requests a second for the ``seconds`` before ``now``, as the proxy counts them."""
    for s in range(int(now) - seconds, int(now)):
        for _ in range(rps):
            request_rate.count(task.pk, now=s)


def slurm_jobs(task) -> list[dict]:
    """The task's Slurm jobs that have not ended, as slurmrestd lists them (no folding by the executor)."""
    body, errors = executor_for(task.cluster)._call("GET", "jobs")
    assert not errors, errors
    return [
        job
        for job in body["jobs"]
        if json.loads(job.get("comment") or "{}").get("hcs.io/task-uid") == task.uid.hex
        and job["job_state"].split("+")[0] in ("PENDING", "CONFIGURING", "RUNNING", "COMPLETING")
    ]


def wait_replicas(task, n, results, timeout=60.0):
    """Reconcile (what beat does) until Slurm runs ``n`` jobs of the service and the portal settled its placement."""
    deadline = time.monotonic() + timeout
    while True:
        results += reconcile_all()
        task.refresh_from_db()
        running = executor_for(task.cluster).status(task.external_id).replicas
        settled = len(task.placement) == n and len(intent(task).device_ids) == n
        if running == n and settled and len(slurm_jobs(task)) == n:
            return task
        if time.monotonic() > deadline:
            events = list(task.events.values_list("kind", "message"))
            raise AssertionError(f"{running} running, jobs {slurm_jobs(task)}, placement {task.placement}; {events}")
        time.sleep(0.3)


def test_a_service_on_slurm_grows_to_two_jobs_shrinks_to_one_and_stopping_it_cancels_all(slurm_world):
    world = slurm_world
    assert can_scale_services(world.slurm_cluster)
    svc = submit_task(
        world.member,
        project=world.project,
        queue="high",
        name="svc",
        kind="inference",
        command="sleep 600",
        gpu_spec="1(A100)",
        port=8000,
        autoscale_min=1,
        autoscale_max=2,
        autoscale_rps=5,
    )
    svc = run_until_running(svc)
    assert svc.cluster == world.slurm_cluster
    request_rate.forget(svc.pk)
    results = []
    try:
        now = time.time()
        load(svc, 10, now)  # twice what one replica should serve
        [outcome] = [o for o in autoscaling.run_autoscaler(now) if o.task_id == svc.pk]
        assert (outcome.running, outcome.desired) == (1, 2), outcome.reason
        run_cycle(world.vdc.pk)
        svc = wait_replicas(svc, 2, results)
        jobs = slurm_jobs(svc)
        assert str(svc.external_id) in {str(j["job_id"]) for j in jobs}
        for _ in range(3):  # more passes: the replica job stays, one object per attempt
            results += reconcile_all()
        assert len(slurm_jobs(svc)) == 2
        assert sum(r.cancelled + r.untracked for r in results) == 0, results
        assert {str(j["job_id"]) for j in slurm_jobs(svc)} == {str(j["job_id"]) for j in jobs}
        # The reconciler sees one job for the attempt, the service's own, with its replica counted in it.
        [state] = [
            s
            for s in executor_for(svc.cluster).list_by_owner(installation_label())
            if s.labels.get("hcs.io/task-uid") == svc.uid.hex
        ]
        assert (state.external_id, state.replicas, state.desired_replicas) == (svc.external_id, 2, 2)
        assert [o.external_id for o in svc.backend_objects.all()] == [svc.external_id]
        assert "resized" in list(svc.events.values_list("kind", flat=True))

        request_rate.forget(svc.pk)
        for step in range(1, 40):  # no load for a stabilisation window: the autoscaler's passes until it asks for 1
            outcomes = [o for o in autoscaling.run_autoscaler(now + 15 * step) if o.task_id == svc.pk and o.changed]
            if outcomes:
                break
        assert outcomes and outcomes[0].desired == 1
        run_cycle(world.vdc.pk)
        svc.refresh_from_db()
        assert len(svc.placement) == 1 and len(intent(svc).device_ids) == 2  # held by the job until Slurm confirms
        svc = wait_replicas(svc, 1, results)
        assert [str(j["job_id"]) for j in slurm_jobs(svc)] == [svc.external_id]

        svc.autoscale_desired = 2  # grow again, so that the stop has two jobs to cancel
        svc.save(update_fields=["autoscale_desired"])
        run_cycle(world.vdc.pk)
        svc = wait_replicas(svc, 2, results)
    finally:
        stop_task(svc, world.member)
    wait_status(svc, {"stopped"})
    deadline = time.monotonic() + 30
    while slurm_jobs(svc) and time.monotonic() < deadline:
        reconcile_all()
        time.sleep(0.3)
    assert slurm_jobs(svc) == []
