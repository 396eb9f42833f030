"""The deployment descriptions under deploy/ (docs/deploy.md): parsed, checked against the official Kubernetes
client's models field by field, and consistent with what the portal reads and serves."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml
from kubernetes import client

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
MODELS = {
    ("v1", "ConfigMap"): "V1ConfigMap",
    ("v1", "Service"): "V1Service",
    ("batch/v1", "Job"): "V1Job",
    ("apps/v1", "Deployment"): "V1Deployment",
    ("networking.k8s.io/v1", "Ingress"): "V1Ingress",
}


def _manifests() -> list[dict]:
    return [doc for doc in yaml.safe_load_all((DEPLOY / "kubernetes" / "portal.yaml").read_text()) if doc]


def _strip_nones(value):
    if isinstance(value, dict):
        return {k: _strip_nones(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [_strip_nones(v) for v in value]
    return value


@pytest.mark.parametrize("doc", _manifests(), ids=lambda d: f"{d['kind']}-{d['metadata']['name']}")
def test_every_manifest_is_a_valid_object_of_its_kind(doc):
    api = client.ApiClient()
    model = api._ApiClient__deserialize(doc, MODELS[(doc["apiVersion"], doc["kind"])])  # required fields checked
    # A misspelled or misplaced field is dropped by the model: the round trip must give the document back.
    assert _strip_nones(api.sanitize_for_serialization(model)) == _strip_nones(doc)


def test_kubernetes_runs_one_beat_probes_what_the_web_serves_and_reads_what_settings_read():
    docs = {(d["kind"], d["metadata"]["name"]): d for d in _manifests()}
    beat = docs[("Deployment", "hcs-portal-beat")]["spec"]
    assert beat["replicas"] == 1 and beat["strategy"]["type"] == "Recreate"
    web = docs[("Deployment", "hcs-portal-web")]["spec"]["template"]["spec"]["containers"][0]
    probes = (web["livenessProbe"]["httpGet"]["path"], web["readinessProbe"]["httpGet"]["path"])
    assert probes == ("/healthz", "/readyz")
    settings_source = (ROOT / "hcsportal" / "settings.py").read_text()
    for name in docs[("ConfigMap", "hcs-portal")]["data"]:
        assert f'"{name}"' in settings_source, f"{name} is not read by hcsportal/settings.py"


def test_the_ingress_brings_the_portal_and_every_app_host_to_the_web_service_over_tls():
    docs = {(d["kind"], d["metadata"]["name"]): d for d in _manifests()}
    apps_domain = docs[("ConfigMap", "hcs-portal")]["data"]["HCS_APPS_DOMAIN"]
    portal = docs[("ConfigMap", "hcs-portal")]["data"]["ALLOWED_HOSTS"]
    ingress = docs[("Ingress", "hcs-portal")]["spec"]
    assert [rule["host"] for rule in ingress["rules"]] == [portal, f"*.{apps_domain}"]
    assert [host for tls in ingress["tls"] for host in tls["hosts"]] == [portal, f"*.{apps_domain}"]
    for rule in ingress["rules"]:
        assert rule["http"]["paths"][0]["backend"]["service"]["name"] == "hcs-portal-web"


def test_compose_has_the_roles_and_one_beat_with_shared_keys():
    compose = yaml.safe_load((DEPLOY / "compose.yaml").read_text())
    services = compose["services"]
    assert {"postgres", "redis", "migrate", "web", "worker", "beat"} <= set(services)
    assert services["beat"]["deploy"]["replicas"] == 1
    env = services["web"]["environment"]
    for name in ("DATABASE_URL", "REDIS_URL", "SECRET_KEY", "HCS_CREDENTIALS_KEY"):
        assert name in env
    settings_source = (ROOT / "hcsportal" / "settings.py").read_text()
    for name in env:
        assert f'"{name}"' in settings_source, f"{name} is not read by hcsportal/settings.py"
    assert "/readyz" in str(services["web"]["healthcheck"]["test"])


def test_the_image_runs_the_modules_the_manifests_name():
    dockerfile = (DEPLOY / "Dockerfile").read_text()
    text = dockerfile + (DEPLOY / "compose.yaml").read_text() + (DEPLOY / "kubernetes" / "portal.yaml").read_text()
    assert "hcsportal.asgi:application" in text and (ROOT / "hcsportal" / "asgi.py").exists()
    assert re.search(r"celery_app\b", text) and (ROOT / "celery_app" / "__init__.py").exists()
    assert "requirements.txt" in dockerfile


def test_every_job_the_beat_schedule_and_the_routes_name_is_registered():
    # A name no job is declared under is discarded by the worker ("unregistered task"): a beat entry with a
    # stale name never runs, and a route with one sends nothing to its queue.
    from celery_app.app import app

    app.loader.import_default_modules()
    registered = set(app.tasks)
    beat = {entry["task"] for entry in app.conf.beat_schedule.values()}
    assert beat - registered == set()
    assert set(app.conf.task_routes) - registered == set()
    # The jobs other code queues by name, too.
    from apps.control import triggers

    queued = {value for name, value in vars(triggers).items() if name.isupper() and str(value).startswith("apps.")}
    assert queued and queued - registered == set()


def test_the_scheduler_and_the_autoscaler_have_queues_and_worker_pools_of_their_own():
    from celery_app.app import app

    def queue_of(name):
        return app.amqp.router.route({}, name)["queue"].name

    assert queue_of("apps.control.jobs.run_scheduler") == "scheduling"
    assert queue_of("apps.control.jobs.launch") == "scheduling"
    assert queue_of("apps.control.jobs.autoscale_services") == "autoscale"
    assert queue_of("apps.control.jobs.refit_forecasts") == "celery"  # fits stay off the autoscaler's loop
    assert queue_of("apps.control.jobs.reconcile_all") == "celery"
    # A worker started without -Q serves every queue (one worker is enough to run the portal).
    assert {q.name for q in app.conf.task_queues} == {"scheduling", "autoscale", "celery"}
    compose = yaml.safe_load((DEPLOY / "compose.yaml").read_text())["services"]
    documents = yaml.safe_load_all((DEPLOY / "kubernetes" / "portal.yaml").read_text())
    manifests = {(d["kind"], d["metadata"]["name"]): d for d in documents if d}
    from hcsportal.management.commands.runportal import WORKER_POOLS

    pools = (("worker", "celery"), ("scheduler", "scheduling"), ("autoscaler", "autoscale"))
    assert {role: queue for role, (queue, _, _) in WORKER_POOLS.items()} == dict(pools)  # make run's pools
    for role, queue in pools:
        command = compose[role]["command"]
        assert command[command.index("-Q") + 1] == queue
        container = manifests[("Deployment", f"hcs-portal-{role}")]["spec"]["template"]["spec"]["containers"][0]
        assert container["command"][container["command"].index("-Q") + 1] == queue
