"""Per-project Slurm accounts: made through slurmrestd's accounting endpoints on the real dev cluster (slurmdbd on
the local MariaDB), jobs running under them, GrpTRES mirroring the project's limit and holding; and the documented
fallback where a slurmrestd has no accounting (the cluster's health says isolation is degraded)."""

from __future__ import annotations

import json
import os
import subprocess
import threading
import time
import uuid
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from apps.clusters.executors.base import ExecutorError, JobPhase
from apps.clusters.executors.slurm import SlurmExecutor

from .conftest import A100
from .test_slurm import wait_for


def sacctmgr(conf: str, *args: str) -> str:
    """sacctmgr as root on this host (the dev cluster's admin), parsable output."""
    env = {**os.environ, "SLURM_CONF": conf}
    return subprocess.run(["sacctmgr", "-n", "-P", *args], capture_output=True, text=True, env=env, check=True).stdout


def grp_tres(conf: str, account: str, user: str) -> str:
    rows = sacctmgr(conf, "show", "assoc", f"account={account}", f"user={user}", "format=user,grptres")
    return next((line.split("|")[1] for line in rows.splitlines() if line.startswith(f"{user}|")), "<none>")


@pytest.fixture
def project_account(slurm_cluster) -> Iterator[str]:
    """A fresh account name per test (Slurm remembers accounts), removed afterwards."""
    name = f"hcs-test-{uuid.uuid4().hex[:8]}"
    yield name
    env = {**os.environ, "SLURM_CONF": slurm_cluster.conf}
    subprocess.run(["scancel", "-A", name], capture_output=True, env=env, check=False)
    time.sleep(1)
    subprocess.run(["sacctmgr", "-i", "delete", "account", name], capture_output=True, env=env, check=False)


@pytest.fixture
def per_project(slurm_cluster) -> SlurmExecutor:
    return SlurmExecutor(**slurm_cluster.executor_kwargs(), per_project=True)


def isolation(account: str, tres: dict | None) -> dict:
    return {"account": account, "description": "HCS project test", "organization": "hcs-test", "grp_tres": tres}


@pytest.mark.slurm
def test_project_account_is_made_with_the_users_association_and_grp_tres(per_project, slurm_cluster, project_account):
    account = per_project.ensure_project(isolation(project_account, {"cpu": 4, "mem": 8192, "gres/gpu": 2}))
    assert account == project_account
    accounts = sacctmgr(slurm_cluster.conf, "show", "account", project_account, "format=account,descr,org")
    assert accounts.strip() == f"{project_account}|HCS project test|hcs-test"
    assert grp_tres(slurm_cluster.conf, project_account, "hcs") == "cpu=4,gres/gpu=2,mem=8G"
    # Idempotent, then a quota change: the GPU limit goes, the others follow; then no quota: nothing limits.
    assert per_project.ensure_project(isolation(project_account, {"cpu": 4, "mem": 8192, "gres/gpu": 2}))
    per_project.ensure_project(isolation(project_account, {"cpu": 2, "mem": 4096}))
    assert grp_tres(slurm_cluster.conf, project_account, "hcs") == "cpu=2,mem=4G"
    per_project.ensure_project(isolation(project_account, None))
    assert grp_tres(slurm_cluster.conf, project_account, "hcs") == ""


@pytest.mark.slurm
def test_job_runs_under_its_project_account_and_its_limit_holds(per_project, slurm_cluster, project_account, make_spec):
    limits = {"isolation": isolation(project_account, {"cpu": 2, "mem": 4096, "gres/gpu": 1})}
    spec = make_spec(command="echo in-account", gpus_per_instance=1, gpu_model=A100, settings=limits)
    job_id = per_project.submit(spec)
    record = per_project._record(job_id)
    assert record["account"] == project_account
    assert wait_for(per_project, job_id, {JobPhase.SUCCEEDED, JobPhase.FAILED}).phase == JobPhase.SUCCEEDED
    sacct = subprocess.run(
        ["sacct", "-n", "-P", "-X", "-j", job_id, "-o", "account,state"],
        capture_output=True,
        text=True,
        env={**os.environ, "SLURM_CONF": slurm_cluster.conf},
        check=True,
    )
    assert sacct.stdout.split("\n")[0].startswith(f"{project_account}|")
    # Two cards is more than the project's mirrored limit of one: Slurm holds the job by the association limit.
    greedy = make_spec(command="sleep 1", gpus_per_instance=2, gpu_model=A100, settings=limits)
    greedy_id = per_project.submit(greedy)
    deadline = time.monotonic() + 20
    while (state := per_project.status(greedy_id)).message != "waiting: AssocGrpGRES" and time.monotonic() < deadline:
        time.sleep(0.5)
    assert state.phase == JobPhase.PENDING and state.message == "waiting: AssocGrpGRES"
    per_project.stop(greedy_id)


@pytest.mark.slurm
def test_an_account_of_that_name_made_by_someone_else_is_refused(per_project, slurm_cluster, project_account):
    sacctmgr(slurm_cluster.conf, "-i", "add", "account", project_account, "organization=physics", "cluster=hcs-dev")
    with pytest.raises(ExecutorError, match="not made by this portal for this project") as caught:
        per_project.ensure_project(isolation(project_account, {"cpu": 2, "mem": 1024}))
    assert not caught.value.retryable
    assert grp_tres(slurm_cluster.conf, project_account, "hcs") == "<none>"


@pytest.mark.slurm
def test_health_of_a_per_project_cluster_with_accounting_is_not_degraded(per_project):
    assert "degraded" not in per_project.health()


class _NoAccounting(BaseHTTPRequestHandler):
    """A slurmrestd without the accounting plugin: ping, nodes, submit, and a plain-text 404 elsewhere."""

    submitted: list[dict] = []

    def _json(self, body: dict) -> None:
        data = json.dumps(body).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):
        if self.path.endswith("/ping"):
            self._json({"meta": {"Slurm": {"release": "22.05.8"}}, "pings": [{"hostname": "ctl", "ping": "UP"}]})
            return
        if self.path.endswith("/slurm/v0.0.38/nodes"):
            self._json({"nodes": [{"name": "node-1", "state": "IDLE", "state_flags": []}], "errors": []})
            return
        self.send_response(404)
        self.send_header("Content-Type", "text/plain")
        self.end_headers()
        self.wfile.write(b"Unable find requested URL. Please view /openapi/v3 for API reference.")

    def do_POST(self):
        if self.path.endswith("/job/submit"):
            self.submitted.append(json.loads(self.rfile.read(int(self.headers["Content-Length"]))))
            self._json({"job_id": 42, "errors": []})
            return
        self.do_GET()

    def log_message(self, *args) -> None:
        pass


@pytest.fixture
def no_accounting() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _NoAccounting)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    _NoAccounting.submitted.clear()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


def test_without_accounting_jobs_keep_the_default_account_and_health_says_degraded(no_accounting, make_spec):
    executor = SlurmExecutor(endpoint=no_accounting, token="t", user="hcs", per_project=True)
    spec = make_spec(project="vision", settings={"isolation": isolation("hcs-vision", {"cpu": 2, "mem": 1024})})
    assert executor.submit(spec, fresh=True) == "42"
    job = _NoAccounting.submitted[0]["job"]
    assert "account" not in job
    assert json.loads(job["comment"])["hcs/project"] == "vision"
    health = executor.health()
    assert "project isolation degraded" in health and "no accounting endpoints" in health
    # A shared cluster does not ask for accounting at all.
    assert "degraded" not in SlurmExecutor(endpoint=no_accounting, token="t", user="hcs").health()
