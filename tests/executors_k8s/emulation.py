"""The kmock Kubernetes API emulator, completed where these tests need a real API server's behaviour."""

from __future__ import annotations

import datetime
import uuid

import kmock
from kmock._internal import parsing

RESOURCES = {
    "v1/pods": "Pod",
    "v1/services": "Service",
    "v1/secrets": "Secret",
    "v1/persistentvolumeclaims": "PersistentVolumeClaim",
    "v1/resourcequotas": "ResourceQuota",
    "networking.k8s.io/v1/ingresses": "Ingress",
    "autoscaling/v2/horizontalpodautoscalers": "HorizontalPodAutoscaler",
    "batch/v1/jobs": "Job",
    "apps/v1/deployments": "Deployment",
    "batch.volcano.sh/v1alpha1/jobs": "Job",
}
CLUSTER_RESOURCES = {"v1/nodes": "Node", "v1/namespaces": "Namespace", "scheduling.volcano.sh/v1beta1/queues": "Queue"}


_parse_path = parsing.parse_path


def _parse_namespace_path(path: str) -> parsing.ParsedPath:
    """kmock's path parser, also reading Namespace objects themselves (``/api/v1/namespaces[/<name>]``), which
    it takes for the namespace prefix of a namespaced path and fails on."""
    parts = path.strip("/").split("/")
    if parts[:3] == ["api", "v1", "namespaces"] and len(parts) <= 4:
        return parsing.ParsedPath("", "v1", "namespaces", None, parts[3] if len(parts) == 4 else None, None)
    return _parse_path(path)


parsing.parse_path = _parse_namespace_path


def _selector_matches(labels: dict[str, str], selector: str) -> bool:
    for term in filter(None, selector.split(",")):
        if "!=" in term:
            key, value = term.split("!=", 1)
            if labels.get(key) == value:
                return False
        elif "=" in term:
            key, value = term.split("=", 1)
            if labels.get(key) != value.lstrip("="):
                return False
        elif term.startswith("!"):
            if term[1:] in labels:
                return False
        elif term not in labels:
            return False
    return True


class ApiServerEmulator(kmock.KubernetesEmulator):
    """kmock's emulator with the API server behaviour these tests rely on and kmock leaves out:
    equality label selectors on lists, a uid and 201 on create, and ``GET /version/``."""

    def __attrs_post_init__(self) -> None:
        super().__attrs_post_init__()
        self.fallback["get /version/"] << self._serve_server_version

    async def _handle(self, request):
        if request.action == kmock.action.CREATE and isinstance(request.data, dict):
            meta = request.data.setdefault("metadata", {})
            meta.setdefault("uid", str(uuid.uuid4()))
            meta.setdefault("creationTimestamp", datetime.datetime.now(tz=datetime.UTC).isoformat())
        response = await super()._handle(request)
        # The API server answers a successful create with 201, and the generated client maps only
        # that status to a body for some calls (custom objects).
        if request.action == kmock.action.CREATE and response.status == 200 and not response.prepared:
            response.set_status(201)
        return response

    async def _serve_list(self, request):
        result = await super()._serve_list(request)
        selector = request.params.get("labelSelector")
        if selector:
            result["items"] = [
                item
                for item in result["items"]
                if _selector_matches((item.get("metadata") or {}).get("labels") or {}, selector)
            ]
        return result


def stored(emulator: ApiServerEmulator, resource: str, namespace: str = "gpu-jobs") -> dict[str, dict]:
    """Objects of one resource as the emulator holds them (not deleted), by name."""
    wanted = kmock.resource(resource)
    return {
        name: obj.raw
        for (res, ns, name), obj in emulator.objects.items()
        if res == wanted and ns == namespace and not obj.deleted
    }
