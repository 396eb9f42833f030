"""The Kubernetes mutating admission webhook (docs/rules.md#backends, vendor injection): AdmissionReview v1 in, a JSON
patch out.

The API server of a registered cluster sends every pod created in the cluster's enrolled namespaces
(``Cluster.webhook_namespaces``); the answer injects the vendor runtime with the same code that builds the
portal's own manifests (:func:`apps.clusters.executors.k8s_manifests.inject`). A pod asks for accelerators
with the ``hcs.io/gpu`` annotation in the GPU spec grammar, or by requesting a vendor's resource itself.
docs/kubernetes.md describes the registration (deploy/kubernetes/webhook.yaml), TLS and the token.
"""

from __future__ import annotations

import base64
import copy
import hashlib
import hmac
import json
import secrets
import time
from dataclasses import dataclass

import jsonpatch
from django.http import HttpRequest, JsonResponse
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_POST

from apps.clusters.choices import ClusterType
from apps.clusters.executors.base import DeviceSlot, ExecutorError, GPUModelSpec, JobSpec, NodePlacement
from apps.clusters.executors.k8s_manifests import (
    DEFAULT_CONTAINER_ANNOTATION,
    DEFAULT_GPU_MODEL,
    GPU_ANNOTATION,
    Injection,
    accelerator_injection,
    inject,
    runtime_classes,
)
from apps.clusters.gpuspec import Catalog, GPUSpecError, parse_gpu_spec
from apps.clusters.models import Cluster, GPUModel

API_VERSION = "admission.k8s.io/v1"
# The JobSpec kind of a pod the portal did not build: no task kind, so no gang hints.
EXTERNAL_KIND = "external"


# An API server sends at most 3 MiB (its request limit; a pod is at most 1.5 MiB in etcd), and no pod is nested
# anywhere near 64 levels deep (managedFields mirror the pod's own depth, about 15).
MAX_REVIEW_BYTES = 3 * 1024 * 1024
MAX_REVIEW_DEPTH = 64


class ReviewError(ValueError):
    """A body that is not an AdmissionReview v1 request; the message says what was expected."""


# --- the token the API server presents -----------------------------------------------------


def _digest(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def issue_webhook_token(cluster: Cluster) -> str:
    """Give the cluster a new webhook token (the previous one stops working) and return it; only its hash is kept."""
    token = secrets.token_urlsafe(32)
    cluster.webhook_token_hash = _digest(token)
    cluster.save(update_fields=["webhook_token_hash", "updated_at"])
    return token


def cluster_for_webhook_token(token: str) -> Cluster | None:
    """The Kubernetes cluster whose webhook token this is, or None."""
    if not token:
        return None
    digest = _digest(token)
    cluster = Cluster.objects.filter(cluster_type=ClusterType.KUBERNETES, webhook_token_hash=digest).first()
    # The lookup already matched; the constant-time compare keeps the check honest should it ever change.
    if cluster is None or not hmac.compare_digest(cluster.webhook_token_hash, digest):
        return None
    return cluster


# --- the review -----------------------------------------------------------------------------


def _depth_exceeds(value, limit: int) -> bool:
    """Whether JSON ``value`` nests arrays and objects deeper than ``limit`` (walked without recursion)."""
    stack = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict | list):
            if depth > limit:
                return True
            stack.extend((child, depth + 1) for child in (item.values() if isinstance(item, dict) else item))
    return False


def parse_review(body: bytes) -> dict:
    """The ``request`` of an AdmissionReview v1; ReviewError when the body is not one, is larger than
    MAX_REVIEW_BYTES or nests deeper than MAX_REVIEW_DEPTH (what follows copies and diffs it recursively)."""
    if len(body) > MAX_REVIEW_BYTES:
        raise ReviewError(f"Expected an AdmissionReview of at most {MAX_REVIEW_BYTES} bytes, got {len(body)}")
    too_deep = f"Expected an AdmissionReview nested at most {MAX_REVIEW_DEPTH} levels deep"
    try:
        review = json.loads(body)
    except RecursionError:
        raise ReviewError(too_deep) from None
    except (UnicodeDecodeError, ValueError) as exc:
        raise ReviewError(f"Expected an AdmissionReview as JSON: {exc}") from None
    if _depth_exceeds(review, MAX_REVIEW_DEPTH):
        raise ReviewError(too_deep)
    if (
        not isinstance(review, dict)
        or review.get("apiVersion") != API_VERSION
        or review.get("kind") != "AdmissionReview"
    ):
        raise ReviewError(f'Expected {{"apiVersion": "{API_VERSION}", "kind": "AdmissionReview", "request": {{...}}}}')
    request = review.get("request")
    if not isinstance(request, dict) or not isinstance(request.get("uid"), str) or not request["uid"]:
        raise ReviewError("Expected an AdmissionReview with a request that has a uid")
    return request


def response(uid: str, *, patch: list | None = None, denied: str = "", warnings: tuple[str, ...] = ()) -> dict:
    """An AdmissionReview v1 answer: allowed (with a JSON patch when there is one) or denied with a reason."""
    answer: dict = {"uid": uid, "allowed": not denied}
    if denied:
        answer["status"] = {"code": 422, "reason": "Invalid", "message": denied}
    if patch:
        answer["patchType"] = "JSONPatch"
        answer["patch"] = base64.b64encode(json.dumps(patch).encode()).decode()
    if warnings:
        answer["warnings"] = list(warnings)
    return {"apiVersion": API_VERSION, "kind": "AdmissionReview", "response": answer}


# How long a webhook process reuses the GPU catalog it read: a catalog edit reaches pods within this time.
CATALOG_TTL_S = 10.0
_catalog_cache: tuple[float, list[GPUModel], Catalog] | None = None


def _catalog() -> tuple[list[GPUModel], Catalog]:
    """The enabled GPU models and their parser catalog, read at most every CATALOG_TTL_S seconds.

    Every pod of an enrolled namespace needs them; reading and indexing them per review would be most of
    the webhook's time (docs/rules.md#performance-targets: < 50 ms).
    """
    global _catalog_cache  # one process-wide cache; a race only reads the catalog twice
    now = time.monotonic()
    if _catalog_cache is None or now - _catalog_cache[0] > CATALOG_TTL_S:
        models = list(GPUModel.objects.filter(enabled=True))
        _catalog_cache = (now, models, Catalog(m.as_catalog_entry() for m in models))
    return _catalog_cache[1], _catalog_cache[2]


class PodRefused(ValueError):
    """A pod whose accelerator request cannot be injected; the message says what was expected."""


@dataclass(frozen=True)
class _Target:
    injection: Injection
    containers: tuple[str, ...]
    set_limits: bool


def _model_spec(model: GPUModel) -> GPUModelSpec:
    return GPUModelSpec(
        name=model.name,
        vendor=model.vendor,
        resource_name=model.resource_name,
        visible_devices_env=model.visible_devices_env,
        slurm_gres_type=model.slurm_gres_type,
        shareable=model.shareable,
        partition=model.partition,
    )


def _injection(
    pod_name: str, namespace: str, model: GPUModelSpec, gpus: float, slot: DeviceSlot | None, labels: dict
) -> Injection:
    """The Injection of the portal's own builders, from a JobSpec that stands for the reviewed pod."""
    spec = JobSpec(
        task_id=0,
        attempt=0,
        name=pod_name or "pod",
        project=namespace,
        owner="",
        kind=EXTERNAL_KIND,
        gpus_per_instance=gpus,
        gpu_model=model,
        # A share is described by a device slot, as the scheduler's placement would; the node is not known.
        placements=(NodePlacement(node="", devices=(slot,)),) if slot is not None else (),
        settings={"runtime_classes": runtime_classes(labels)},
    )
    try:
        injection = accelerator_injection(spec)
    except ExecutorError as exc:
        raise PodRefused(f"{GPU_ANNOTATION}: {exc}") from None
    assert injection is not None  # gpus > 0
    return injection


def _annotation_target(
    pod: dict, text: str, models: list[GPUModel], catalog: Catalog, namespace: str, labels: dict
) -> _Target | None:
    """What ``hcs.io/gpu`` asks for, injected into the default container (limits included)."""
    try:
        request = parse_gpu_spec(text, catalog)
    except GPUSpecError as exc:
        raise PodRefused(f"{GPU_ANNOTATION}: {exc}") from None
    if request.is_none:
        return None
    if request.is_vendor_neutral:
        raise PodRefused(
            f"{GPU_ANNOTATION}: totals such as {text!r} need the portal's scheduler to choose a model; "
            "name the model instead, e.g. 2(A100-80G)"
        )
    by_name = {m.name: m for m in models}
    specs = {_model_spec(by_name[name]) for name in request.models}
    runtimes = {(s.vendor, s.resource_name, s.visible_devices_env) for s in specs}
    if len(runtimes) > 1:
        raise PodRefused(
            f"{GPU_ANNOTATION}: {', '.join(sorted(request.models))} need different device plugins; "
            "name models of one vendor and resource"
        )
    model = min(specs, key=lambda s: s.name) if specs else DEFAULT_GPU_MODEL
    slot = None
    if request.vram_gib is not None or request.cores_percent is not None:
        slot = DeviceSlot(
            index=0,
            vram_gib=float(request.vram_gib) if request.vram_gib is not None else None,
            cores_percent=request.cores_percent,
        )
    name = pod.get("metadata", {}).get("name") or pod.get("metadata", {}).get("generateName", "")
    injection = _injection(name, namespace, model, float(request.count), slot, labels)
    containers = [c.get("name") for c in pod["spec"]["containers"]]
    chosen = pod.get("metadata", {}).get("annotations", {}).get(DEFAULT_CONTAINER_ANNOTATION)
    return _Target(injection, (chosen if chosen in containers else containers[0],), True)


def _resource_targets(pod: dict, models: list[GPUModel], namespace: str, labels: dict) -> list[_Target]:
    """Containers that already request a vendor's resource get that vendor's runtime; their limits stay."""
    by_resource: dict[str, GPUModelSpec] = {}
    for model in sorted(models, key=lambda m: m.name):
        by_resource.setdefault(model.resource_name, _model_spec(model))
    by_vendor: dict[GPUModelSpec, list[str]] = {}
    for container in pod["spec"]["containers"]:
        resources = container.get("resources") or {}
        asked = {**(resources.get("requests") or {}), **(resources.get("limits") or {})}
        model = next((by_resource[key] for key in sorted(asked) if key in by_resource), None)
        if model is not None:
            by_vendor.setdefault(model, []).append(container.get("name"))
    name = pod.get("metadata", {}).get("name", "")
    # One card stands for the request: only the vendor's environment and mounts are applied, not limits.
    return [
        _Target(_injection(name, namespace, model, 1, None, labels), tuple(names), False)
        for model, names in by_vendor.items()
    ]


def mutate(request: dict, cluster: Cluster) -> dict:
    """The answer to one admission request from ``cluster``'s API server.

    Only pods created in an enrolled namespace are changed; everything else is allowed as it is. An
    accelerator request that cannot be injected is denied with the reason.
    """
    uid = request["uid"]
    obj = request.get("object")
    kind = request.get("kind") or {}
    if request.get("operation") != "CREATE" or not isinstance(kind, dict) or kind.get("kind") != "Pod":
        return response(uid)
    namespace = request.get("namespace") or ""
    if namespace not in (cluster.webhook_namespaces or []):
        return response(uid)
    if (
        not isinstance(obj, dict)
        or not isinstance(obj.get("spec"), dict)
        or not isinstance(obj["spec"].get("containers"), list)
        or not obj["spec"]["containers"]
        or not all(isinstance(c, dict) for c in obj["spec"]["containers"])
        or not isinstance(obj.get("metadata", {}), dict)
    ):
        return response(uid, warnings=("hcs-portal: not a pod with containers; nothing injected",))
    models, catalog = _catalog()
    annotations = obj.get("metadata", {}).get("annotations") or {}
    pod = copy.deepcopy(obj)
    try:
        if isinstance(annotations, dict) and GPU_ANNOTATION in annotations:
            target = _annotation_target(
                obj, str(annotations[GPU_ANNOTATION]), models, catalog, namespace, cluster.labels
            )
            targets = [target] if target else []
        else:
            targets = _resource_targets(obj, models, namespace, cluster.labels)
        for target in targets:
            inject(pod, target.injection, target.containers, limits=target.set_limits)
    except PodRefused as exc:
        return response(uid, denied=str(exc))
    except (AttributeError, TypeError, KeyError):
        # The API server sends typed pods; only another caller with the token can send these shapes.
        return response(uid, warnings=("hcs-portal: pod fields are not of the Kubernetes types; nothing injected",))
    if not targets:
        return response(uid)
    return response(uid, patch=jsonpatch.make_patch(obj, pod).patch)


# --- the endpoint ---------------------------------------------------------------------------


def _bearer_token(request: HttpRequest) -> str:
    scheme, _, value = request.headers.get("Authorization", "").partition(" ")
    return value.strip() if scheme.lower() == "bearer" else ""


def _read_body(request: HttpRequest) -> bytes:
    """The body, read up to one byte past MAX_REVIEW_BYTES (Django's own upload limit is not the webhook's)."""
    return request.read(MAX_REVIEW_BYTES + 1)


@csrf_exempt
@require_POST
def admission_review(request: HttpRequest) -> JsonResponse:
    """POST /k8s/admission/ with ``Authorization: Bearer <token>``: one AdmissionReview.

    Not a user endpoint: no session, no CSRF; the cluster's webhook token identifies the caller.
    """
    cluster = cluster_for_webhook_token(_bearer_token(request))
    if cluster is None:
        detail = "Expected a cluster's webhook token as 'Authorization: Bearer <token>' (manage.py webhook_token)."
        return JsonResponse({"detail": detail}, status=401)
    try:
        review = parse_review(_read_body(request))
    except ReviewError as exc:
        # Without a uid there is no AdmissionReview to answer: the API server applies the failurePolicy.
        return JsonResponse({"detail": str(exc)}, status=400)
    return JsonResponse(mutate(review, cluster))


@csrf_exempt
def token_in_path_refused(request: HttpRequest, rest: str) -> JsonResponse:
    """Any /k8s/admission/<...>/: where webhook tokens once went, refused without looking at what is there.

    A token in a URL reaches access logs and the registration object, so it is not accepted there any more.
    """
    detail = (
        "Webhook tokens are no longer accepted in the URL, where access logs keep them: register the webhook at "
        "/k8s/admission/ and have the API server send 'Authorization: Bearer <token>' from its admission "
        "configuration (docs/kubernetes.md). Issue a new token with manage.py webhook_token <cluster>: one that "
        "was in a URL should be taken as known."
    )
    return JsonResponse({"detail": detail}, status=410)
