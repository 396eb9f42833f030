"""Kubernetes executor on the official ``kubernetes`` client.

Manifests come from :mod:`k8s_manifests` (pure functions); this module only creates, reads
and deletes them. Every object of a task carries the ``hcs.io/name`` label, so status, logs
and delete find them by one selector; docs/kubernetes.md describes the objects per kind.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any, TypeVar

import urllib3
import yaml
from kubernetes import client, config
from kubernetes.stream import stream
from kubernetes.stream.ws_client import RESIZE_CHANNEL
from kubernetes.utils import parse_quantity

from apps.clusters.executors import k8s_manifests as m
from apps.clusters.executors import projects
from apps.clusters.executors.base import (
    LABEL_ATTEMPT,
    LABEL_INSTALLATION,
    LABEL_LAUNCH_TOKEN,
    LABEL_TASK_UID,
    LOG_CHUNK_BYTES,
    TASK_UID_RE,
    Endpoint,
    Executor,
    ExecutorError,
    Failure,
    InstanceState,
    JobPhase,
    JobSpec,
    JobState,
    LogChunk,
    NodeCondition,
    Terminal,
    checkpoint_mount,
    wants_checkpoints,
)
from apps.clusters.executors.terminal import clamp_size

T = TypeVar("T")

# Kubernetes kinds this executor creates, with the suffix of their typed client methods
# (create_namespaced_<suffix>, list_namespaced_<suffix>, ...). The Volcano Job goes through
# CustomObjectsApi instead.
_TYPED = {
    "Pod": ("core", "pod"),
    "Service": ("core", "service"),
    "Secret": ("core", "secret"),
    "PersistentVolumeClaim": ("core", "persistent_volume_claim"),
    "Ingress": ("networking", "ingress"),
    "HorizontalPodAutoscaler": ("autoscaling", "horizontal_pod_autoscaler"),
    "Job": ("batch", "job"),
    "Deployment": ("apps", "deployment"),
}
_WORKLOAD_KIND = {m.WORKLOAD_POD: "Pod", m.WORKLOAD_JOB: "Job", m.WORKLOAD_DEPLOYMENT: "Deployment"}
# Deleted in this order by delete(): workloads first so nothing recreates pods meanwhile.
_DELETE_ORDER = ("Deployment", "Job", "Pod", "HorizontalPodAutoscaler", "Ingress", "Service", "Secret")

_WAITING_REASONS_FAILED = {"InvalidImageName", "CreateContainerConfigError", "CreateContainerError"}
_VOLCANO_PHASES = {
    "Pending": JobPhase.PENDING,
    "Inqueue": JobPhase.PENDING,
    "Running": JobPhase.RUNNING,
    "Restarting": JobPhase.RUNNING,
    "Completing": JobPhase.RUNNING,
    "Completed": JobPhase.SUCCEEDED,
    "Failed": JobPhase.FAILED,
    "Terminated": JobPhase.FAILED,
    "Aborting": JobPhase.CANCELLED,
    "Aborted": JobPhase.CANCELLED,
    "Terminating": JobPhase.CANCELLED,
}


def _api_message(exc: client.ApiException) -> str:
    """The API server's own message from a Status body, else the HTTP reason."""
    message = ""
    if exc.body:
        try:
            body = json.loads(exc.body)
        except (TypeError, ValueError):
            body = None
        if isinstance(body, dict):
            message = str(body.get("message") or "")
        elif isinstance(exc.body, str):
            message = exc.body[:500]
    return f"Kubernetes API {exc.status} {exc.reason or ''}".rstrip() + (f": {message}" if message else "")


def _call(fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """One API call; its failures as ExecutorError (4xx final except 429, 5xx and network retryable)."""
    try:
        return fn(*args, **kwargs)
    except client.ApiException as exc:
        status = exc.status or 0
        retryable = status == 0 or status == 429 or status >= 500
        raise ExecutorError(_api_message(exc), retryable=retryable) from exc
    except (urllib3.exceptions.HTTPError, OSError) as exc:
        raise ExecutorError(f"Kubernetes API unreachable: {exc}", retryable=True) from exc


# Seconds read before the last line a follower saw, for clock skew between the portal host and the nodes.
_LOG_SKEW_S = 60


def _log_marks(cursor: str) -> dict[str, list]:
    """A follower's cursor: pod name -> [second "YYYY-MM-DDTHH:MM:SS", nanoseconds, lines seen at that time]."""
    try:
        marks = json.loads(cursor)
    except ValueError:
        raise ValueError("not a Kubernetes log cursor") from None
    if not isinstance(marks, dict) or not all(
        isinstance(mark, list)
        and len(mark) == 3
        and isinstance(mark[0], str)
        and _stamp_key(f"{mark[0]}Z")
        and all(isinstance(n, int) and not isinstance(n, bool) for n in mark[1:])
        for mark in marks.values()
    ):
        raise ValueError("not a Kubernetes log cursor")
    return marks


def _stamp_key(stamp: str) -> tuple[str, int] | None:
    """The kubelet's RFC 3339 timestamp (UTC, up to nanoseconds) as a sortable (second, nanoseconds) pair."""
    if not stamp.endswith("Z"):
        return None
    second, _, fraction = stamp[:-1].partition(".")
    try:
        datetime.strptime(second, "%Y-%m-%dT%H:%M:%S")
    except ValueError:
        return None
    if fraction and not (fraction.isdigit() and len(fraction) <= 9):
        return None
    return second, int(fraction.ljust(9, "0")) if fraction else 0


def _since_seconds(mark: list) -> int:
    """``since_seconds`` that reaches back to a mark's time, with the skew margin."""
    at = datetime.strptime(mark[0], "%Y-%m-%dT%H:%M:%S").replace(tzinfo=UTC)
    return max(0, math.ceil((datetime.now(UTC) - at).total_seconds())) + _LOG_SKEW_S


def _lines_after(raw: str, mark: list | None, *, whole_only: bool) -> tuple[str, list | None]:
    """The lines of a timestamped log after ``mark`` (without their timestamps), and the new mark.

    ``whole_only``: the read was cut at its byte limit, so its last line may be cut too; it is left for the
    next read.
    """
    lines = raw.splitlines(keepends=True)
    if whole_only and lines and not lines[-1].endswith("\n"):
        lines.pop()
    skip_key, skip_count = ((mark[0], mark[1]), mark[2]) if mark else (None, 0)
    last_key, last_count = skip_key, skip_count
    skipped, out = 0, []
    for line in lines:
        stamp, _, text = line.partition(" ")
        key = _stamp_key(stamp) or last_key  # a line without a timestamp continues the one before
        if skip_key and key and key < skip_key:
            continue
        if key == skip_key and skipped < skip_count:
            skipped += 1
            continue
        out.append(text)
        last_key, last_count = key, (last_count + 1 if key == last_key else 1)
    new_mark = [last_key[0], last_key[1], last_count] if last_key else mark
    return "".join(out), new_mark


def _status_code(exc: ExecutorError) -> int | None:
    cause = exc.__cause__
    return cause.status if isinstance(cause, client.ApiException) else None


def _parse_time(value: Any) -> datetime | None:
    if not value:
        return None
    if isinstance(value, datetime):
        return value
    return datetime.fromisoformat(str(value).replace("Z", "+00:00"))


def _conditions(obj: dict) -> dict[str, dict]:
    return {c.get("type"): c for c in (obj.get("status") or {}).get("conditions") or []}


def _pod_problem(pod: dict) -> str:
    """Why a pod is not running: a waiting container's reason or an unschedulable condition."""
    status = pod.get("status") or {}
    for cs in (status.get("initContainerStatuses") or []) + (status.get("containerStatuses") or []):
        waiting = (cs.get("state") or {}).get("waiting")
        if waiting and waiting.get("reason") not in (None, "ContainerCreating", "PodInitializing"):
            return f"{waiting['reason']}: {waiting.get('message') or ''}".rstrip(": ")
    scheduled = _conditions(pod).get("PodScheduled")
    if scheduled and scheduled.get("status") == "False":
        return f"{scheduled.get('reason') or 'Unschedulable'}: {scheduled.get('message') or ''}".rstrip(": ")
    return ""


def _terminated(pod: dict) -> dict:
    for cs in (pod.get("status") or {}).get("containerStatuses") or []:
        if cs.get("name") == m.CONTAINER_NAME and (cs.get("state") or {}).get("terminated"):
            return cs["state"]["terminated"]
    return {}


def _failure(reason: str, pods: list[dict]) -> Failure:
    """Why a Pod or Job failed: its deadline, a container killed for memory, else its own exit code."""
    if reason == "DeadlineExceeded":
        return Failure.WALL_TIME
    if any(_terminated(p).get("reason") == "OOMKilled" for p in pods):
        return Failure.OUT_OF_MEMORY
    if any(_terminated(p).get("exitCode") not in (None, 0) for p in pods):
        return Failure.EXIT_CODE
    return Failure.BACKEND


def _failure_message(failure: Failure, message: str, pods: list[dict]) -> str:
    """The backend's message, led by what the portal says of an out-of-memory kill: which limit the job hit (the
    memory limit of the container the kernel killed, as its pod asked for it)."""
    if failure != Failure.OUT_OF_MEMORY:
        return message
    limit = ""
    for pod in pods:
        if _terminated(pod).get("reason") != "OOMKilled":
            continue
        for container in (pod.get("spec") or {}).get("containers") or []:
            memory = ((container.get("resources") or {}).get("limits") or {}).get("memory")
            if container.get("name") == m.CONTAINER_NAME and memory:
                limit = f" of {float(parse_quantity(memory)) / 2**30:g} GiB"
    return f"exceeded its memory limit{limit} (out of memory): {message}"


def pod_state(ext_id: str, pod: dict) -> JobState:
    """A dev-env Pod's phase (and any pod's, for messages) as a JobState."""
    status = pod.get("status") or {}
    phase = status.get("phase") or "Pending"
    terminated = _terminated(pod)
    started = _parse_time(status.get("startTime"))
    finished = _parse_time(terminated.get("finishedAt"))
    exit_code = terminated.get("exitCode")
    disruption = _conditions(pod).get("DisruptionTarget") or {}
    if pod.get("metadata", {}).get("deletionTimestamp"):
        return JobState(ext_id, JobPhase.CANCELLED, "being deleted", started, finished, exit_code)
    if phase == "Pending":
        problem = _pod_problem(pod)
        waiting_reason = problem.split(":", 1)[0]
        if waiting_reason in _WAITING_REASONS_FAILED:
            return JobState(ext_id, JobPhase.FAILED, problem, started, failure=Failure.LAUNCH)
        return JobState(ext_id, JobPhase.PENDING, problem, started)
    if phase == "Running":
        return JobState(ext_id, JobPhase.RUNNING, _pod_problem(pod), started)
    if phase == "Succeeded":
        return JobState(ext_id, JobPhase.SUCCEEDED, "", started, finished, exit_code if exit_code is not None else 0)
    if phase == "Failed":
        if disruption.get("status") == "True" and disruption.get("reason") == "PreemptionByScheduler":
            return JobState(ext_id, JobPhase.PREEMPTED, disruption.get("message") or "", started, finished, exit_code)
        reason = status.get("reason") or terminated.get("reason") or "Failed"
        message = status.get("message") or terminated.get("message") or ""
        failure = _failure(reason, [pod])
        message = _failure_message(failure, f"{reason}: {message}".rstrip(": "), [pod])
        return JobState(ext_id, JobPhase.FAILED, message, started, finished, exit_code, failure=failure)
    return JobState(ext_id, JobPhase.UNKNOWN, f"pod phase {phase}", started)


# The resource metrics API (metrics-server or a Prometheus adapter) that serves a pod's CPU and memory use.
METRICS_GROUP, METRICS_VERSION = "metrics.k8s.io", "v1beta1"
NO_METRICS_NOTE = "the cluster serves no resource metrics API (metrics.k8s.io: install metrics-server)"
# Volcano numbers a job's pods with this annotation, as an indexed Job does with JOB_INDEX_ANNOTATION.
_VOLCANO_INDEX_ANNOTATION = "volcano.sh/task-index"


def pod_usage(metrics: list[dict]) -> dict[str, tuple[float, float]]:
    """CPU cores and memory GiB each pod uses now, summed over its containers, from PodMetrics objects."""
    out = {}
    for item in metrics:
        name = (item.get("metadata") or {}).get("name")
        if not name:
            continue
        cpu = memory = 0.0
        for container in item.get("containers") or []:
            usage = container.get("usage") or {}
            cpu += float(parse_quantity(usage.get("cpu") or "0"))
            memory += float(parse_quantity(usage.get("memory") or "0")) / 2**30
        out[name] = (round(cpu, 3), round(memory, 4))
    return out


def pod_secret_names(pod: dict) -> tuple[str, ...]:
    """Names of the Secrets a pod mounts or reads variables from (volumes, envFrom, secretKeyRef, image pulls)."""
    spec = pod.get("spec") or {}
    names = {(v.get("secret") or {}).get("secretName") for v in spec.get("volumes") or []}
    for volume in spec.get("volumes") or []:
        for source in (volume.get("projected") or {}).get("sources") or []:
            names.add((source.get("secret") or {}).get("name"))
    for container in (spec.get("initContainers") or []) + (spec.get("containers") or []):
        names |= {(e.get("secretRef") or {}).get("name") for e in container.get("envFrom") or []}
        refs = ((e.get("valueFrom") or {}).get("secretKeyRef") or {} for e in container.get("env") or [])
        names |= {ref.get("name") for ref in refs}
    names |= {ref.get("name") for ref in spec.get("imagePullSecrets") or []}
    return tuple(sorted(n for n in names if n))


def _pod_index(pod: dict) -> int | None:
    meta = pod.get("metadata") or {}
    for where in (meta.get("annotations") or {}, meta.get("labels") or {}):
        for key in (m.JOB_INDEX_ANNOTATION, _VOLCANO_INDEX_ANNOTATION):
            if str(where.get(key, "")).isdecimal():
                return int(where[key])
    return None


def _pod_state_word(pod: dict) -> tuple[str, str]:
    """(state, message) of a pod as a person reads it: a waiting or failing container's reason wins its phase."""
    status = pod.get("status") or {}
    if (pod.get("metadata") or {}).get("deletionTimestamp"):
        return "Terminating", ""
    for cs in status.get("containerStatuses") or []:
        state = cs.get("state") or {}
        waiting = state.get("waiting") or {}
        if waiting.get("reason") and waiting["reason"] not in ("ContainerCreating", "PodInitializing"):
            return waiting["reason"], waiting.get("message") or ""
        terminated = state.get("terminated") or {}
        if terminated and status.get("phase") not in ("Succeeded", "Failed"):
            return terminated.get("reason") or "Terminated", terminated.get("message") or ""
    return status.get("phase") or "Pending", _pod_problem(pod)


def pod_instances(
    pods: list[dict],
    usage: dict[str, tuple[float, float]] | None,
    service: dict | None = None,
    ingress: dict | None = None,
) -> list[InstanceState]:
    """The instances of a task from its pods (ordered by rank, else by name), the PodMetrics of the namespace
    (None when the cluster serves none), and the task's Service and Ingress objects (None when it has none)."""
    ports = tuple(
        {
            "port": p.get("port"),
            "target_port": p.get("targetPort", p.get("port")),
            "protocol": p.get("protocol", "TCP"),
            "name": p.get("name") or "",
            **({"node_port": p["nodePort"]} if p.get("nodePort") else {}),
        }
        for p in ((service or {}).get("spec") or {}).get("ports") or ()
    )
    rules = ((ingress or {}).get("spec") or {}).get("rules") or []
    host = next((r.get("host") for r in rules if r.get("host")), None)
    tls_hosts = {h for t in ((ingress or {}).get("spec") or {}).get("tls") or [] for h in t.get("hosts") or ()}
    tls = (host in tls_hosts or bool(tls_hosts and not host)) if ingress is not None else None
    ordered = sorted(pods, key=lambda pod: (_pod_index(pod) is None, _pod_index(pod) or 0, pod["metadata"]["name"]))
    out = []
    for number, pod in enumerate(ordered):
        name = pod["metadata"]["name"]
        status = pod.get("status") or {}
        state, message = _pod_state_word(pod)
        cpu, memory = (usage or {}).get(name, (None, None))
        if usage is None:
            note = NO_METRICS_NOTE
        elif cpu is None:
            note = "no metrics for this pod yet (metrics-server samples every 15 s or so)"
        else:
            note = ""
        index = _pod_index(pod)
        out.append(
            InstanceState(
                index=index if index is not None else number,
                name=name,
                state=state,
                node=(pod.get("spec") or {}).get("nodeName") or None,
                ip=status.get("podIP") or None,
                restarts=sum(int(cs.get("restartCount") or 0) for cs in status.get("containerStatuses") or []),
                cpu_used_cores=cpu,
                memory_used_gib=memory,
                started_at=_parse_time(status.get("startTime")),
                message=message,
                usage_note=note,
                service=(service or {}).get("metadata", {}).get("name"),
                ports=ports,
                ingress_host=host,
                ingress_tls=tls,
                secrets=pod_secret_names(pod),
            )
        )
    return out


def _pods_summary(pods: list[dict]) -> tuple[bool, str]:
    """(any pod running, the first pod problem found)."""
    running = any((p.get("status") or {}).get("phase") == "Running" for p in pods)
    problems = [p for p in (_pod_problem(pod) for pod in pods) if p]
    return running, problems[0] if problems else ""


def job_state(ext_id: str, job: dict, pods: list[dict]) -> JobState:
    """An Indexed Job: its Complete / Failed conditions, else the counts and its pods."""
    status = job.get("status") or {}
    conditions = _conditions(job)
    started = _parse_time(status.get("startTime"))
    if job.get("metadata", {}).get("deletionTimestamp"):
        return JobState(ext_id, JobPhase.CANCELLED, "being deleted", started)
    for kind in ("Complete", "SuccessCriteriaMet"):
        if conditions.get(kind, {}).get("status") == "True":
            return JobState(ext_id, JobPhase.SUCCEEDED, "", started, _parse_time(status.get("completionTime")), 0)
    failed = conditions.get("Failed") or conditions.get("FailureTarget") or {}
    if failed.get("status") == "True":
        message = f"{failed.get('reason') or 'Failed'}: {failed.get('message') or ''}".rstrip(": ")
        exit_codes = [_terminated(p).get("exitCode") for p in pods]
        exit_code = next((c for c in exit_codes if c not in (None, 0)), None)
        failure = _failure(failed.get("reason") or "", pods)
        return JobState(
            ext_id,
            JobPhase.FAILED,
            _failure_message(failure, message, pods),
            started,
            _parse_time(failed.get("lastTransitionTime")),
            exit_code,
            failure=failure,
        )
    completions = (job.get("spec") or {}).get("completions") or 1
    if (status.get("succeeded") or 0) >= completions:
        return JobState(ext_id, JobPhase.SUCCEEDED, "", started, _parse_time(status.get("completionTime")), 0)
    if conditions.get("Suspended", {}).get("status") == "True":
        return JobState(ext_id, JobPhase.PENDING, "Suspended", started)
    running, problem = _pods_summary(pods)
    counts = f"{status.get('active') or 0} active, {status.get('succeeded') or 0} succeeded"
    counts += f", {status.get('failed') or 0} failed of {completions}"
    if running:
        return JobState(ext_id, JobPhase.RUNNING, problem or counts, started)
    return JobState(ext_id, JobPhase.PENDING, problem or counts, started)


def deployment_state(ext_id: str, deployment: dict, pods: list[dict]) -> JobState:
    """A Deployment runs while at least one replica is available."""
    status = deployment.get("status") or {}
    conditions = _conditions(deployment)
    wanted = (deployment.get("spec") or {}).get("replicas")
    available = status.get("availableReplicas") or 0
    if deployment.get("metadata", {}).get("deletionTimestamp"):
        return JobState(ext_id, JobPhase.CANCELLED, "being deleted")
    progressing = conditions.get("Progressing") or {}
    if progressing.get("status") == "False" and progressing.get("reason") == "ProgressDeadlineExceeded":
        return JobState(
            ext_id,
            JobPhase.FAILED,
            f"ProgressDeadlineExceeded: {progressing.get('message') or ''}",
            failure=Failure.LAUNCH,
        )
    _, problem = _pods_summary(pods)
    replica_failure = conditions.get("ReplicaFailure") or {}
    if replica_failure.get("status") == "True":
        problem = problem or f"{replica_failure.get('reason')}: {replica_failure.get('message') or ''}"
    ready = int(status.get("readyReplicas") or 0)
    if available > 0:
        return JobState(
            ext_id, JobPhase.RUNNING, problem or f"{available}/{wanted} replicas available", ready_replicas=ready
        )
    return JobState(ext_id, JobPhase.PENDING, problem or f"0/{wanted} replicas available", ready_replicas=ready)


def volcano_state(ext_id: str, vcjob: dict, pods: list[dict]) -> JobState:
    """A Volcano Job's ``status.state.phase``, with the pods' problem while it waits."""
    if vcjob.get("metadata", {}).get("deletionTimestamp"):
        return JobState(ext_id, JobPhase.CANCELLED, "being deleted")
    state = (vcjob.get("status") or {}).get("state") or {}
    raw = state.get("phase") or "Pending"
    phase = _VOLCANO_PHASES.get(raw, JobPhase.UNKNOWN)
    message = f"{state.get('reason') or ''}: {state.get('message') or ''}".strip(": ")
    if phase == JobPhase.PENDING:
        _, problem = _pods_summary(pods)
        message = problem or message or raw
    elif phase == JobPhase.UNKNOWN:
        message = f"Volcano phase {raw}"
    finished = _parse_time(state.get("lastTransitionTime")) if phase in (JobPhase.SUCCEEDED, JobPhase.FAILED) else None
    return JobState(ext_id, phase, message, finished_at=finished)


_STATE_OF = {m.WORKLOAD_JOB: job_state, m.WORKLOAD_VCJOB: volcano_state, m.WORKLOAD_DEPLOYMENT: deployment_state}


class KubernetesExecutor(Executor):
    """Runs tasks as Pods, Indexed Jobs, Volcano Jobs or Deployments in one namespace of a cluster."""

    def __init__(
        self,
        api_client: client.ApiClient | None = None,
        *,
        host: str | None = None,
        token: str | None = None,
        kubeconfig: str | dict | None = None,
        namespace: str = "default",
        ingress_domain: str | None = None,
        ingress_class: str | None = None,
        ca_cert: str | None = None,
        verify_ssl: bool = True,
        checkpoint_storage_class: str = "",
        checkpoint_size_gib: int | None = None,
        per_project: bool = False,
    ):
        """Connect with, in this order: a ready ApiClient, a kubeconfig (path, YAML text or dict),
        host (+ bearer token, CA as a path or PEM text), or the in-cluster service account / the
        default kubeconfig. With ``checkpoint_size_gib``, every training task gets a checkpoint volume claim
        of that size (of ``checkpoint_storage_class``, else the cluster's default class). ``per_project``: jobs
        go to a namespace per project (:meth:`ensure_project`), which listings must reach."""
        self.api_client = api_client or _make_api_client(host, token, kubeconfig, ca_cert, verify_ssl)
        self.checkpoint_storage_class = checkpoint_storage_class
        self.checkpoint_size_gib = checkpoint_size_gib
        self.namespace = namespace
        self.per_project = per_project
        self.ingress_domain = ingress_domain
        self.ingress_class = ingress_class
        self._apis = {
            "core": client.CoreV1Api(self.api_client),
            "batch": client.BatchV1Api(self.api_client),
            "apps": client.AppsV1Api(self.api_client),
            "networking": client.NetworkingV1Api(self.api_client),
            "autoscaling": client.AutoscalingV2Api(self.api_client),
        }
        self._custom = client.CustomObjectsApi(self.api_client)

    # --- raw object access (dicts in camelCase, the same shape as the manifests) --------

    def _to_dict(self, obj: Any) -> dict:
        return obj if isinstance(obj, dict) else self.api_client.sanitize_for_serialization(obj)

    def _method(self, kind: str, verb: str) -> Callable[..., Any]:
        api, suffix = _TYPED[kind]
        return getattr(self._apis[api], f"{verb}_namespaced_{suffix}")

    def _create(self, manifest: dict) -> dict:
        namespace = manifest["metadata"]["namespace"]
        if manifest["apiVersion"].startswith(m.VOLCANO_GROUP + "/"):
            created = _call(
                self._custom.create_namespaced_custom_object,
                m.VOLCANO_GROUP,
                m.VOLCANO_VERSION,
                namespace,
                m.VOLCANO_PLURAL,
                manifest,
            )
        else:
            created = _call(self._method(manifest["kind"], "create"), namespace, manifest)
        return self._to_dict(created) if created is not None else {}

    def _read_workload(self, namespace: str, workload: str, name: str) -> dict:
        if workload == m.WORKLOAD_VCJOB:
            found = _call(
                self._custom.get_namespaced_custom_object,
                m.VOLCANO_GROUP,
                m.VOLCANO_VERSION,
                namespace,
                m.VOLCANO_PLURAL,
                name,
            )
        else:
            found = _call(self._method(_WORKLOAD_KIND[workload], "read"), name, namespace)
        return self._to_dict(found)

    def _list(self, kind: str, namespace: str, selector: str) -> list[dict]:
        if kind == m.WORKLOAD_VCJOB:
            try:
                found = _call(
                    self._custom.list_namespaced_custom_object,
                    m.VOLCANO_GROUP,
                    m.VOLCANO_VERSION,
                    namespace,
                    m.VOLCANO_PLURAL,
                    label_selector=selector,
                )
            except ExecutorError as exc:
                if _status_code(exc) == 404:  # Volcano is not installed on this cluster
                    return []
                raise
            return list(found.get("items") or [])
        found = _call(self._method(kind, "list"), namespace, label_selector=selector)
        return [self._to_dict(item) for item in found.items or []]

    def _delete(self, kind: str, namespace: str, name: str, propagation: str) -> None:
        """Delete one object; one that is already gone is fine."""
        try:
            if kind == m.WORKLOAD_VCJOB:
                _call(
                    self._custom.delete_namespaced_custom_object,
                    m.VOLCANO_GROUP,
                    m.VOLCANO_VERSION,
                    namespace,
                    m.VOLCANO_PLURAL,
                    name,
                    propagation_policy=propagation,
                )
            else:
                _call(self._method(kind, "delete"), name, namespace, propagation_policy=propagation)
        except ExecutorError as exc:
            if _status_code(exc) != 404:
                raise

    def _pods(self, namespace: str, name: str) -> list[dict]:
        pods = self._list("Pod", namespace, f"{m.LABEL_NAME}={name}")
        return sorted(pods, key=lambda pod: pod["metadata"]["name"])

    # --- Executor -----------------------------------------------------------------------

    def _with_checkpoints(self, spec: JobSpec) -> JobSpec:
        """The spec with its checkpoint volume mounted where the job finds it, on clusters that provide one."""
        if not wants_checkpoints(spec) or not self.checkpoint_size_gib:
            return spec
        path = checkpoint_mount(spec)
        volume = {"name": m.CHECKPOINT_VOLUME, "mount_path": path, "claim_name": m.checkpoint_claim_name(spec.task_uid)}
        return dataclasses.replace(spec, checkpoint_dir=path, volumes=(*spec.volumes, volume))

    def checkpoint_claim(self, spec: JobSpec) -> dict | None:
        """The task's checkpoint volume claim, or None when the task or the cluster has none."""
        if not wants_checkpoints(spec) or not self.checkpoint_size_gib:
            return None
        return m.checkpoint_claim_manifest(
            spec, spec.namespace or self.namespace, self.checkpoint_size_gib, self.checkpoint_storage_class
        )

    def manifests(self, spec: JobSpec) -> list[dict]:
        """The objects submit() creates for this spec, in order."""
        spec = self._with_checkpoints(spec)
        return m.build_manifests(
            spec,
            spec.namespace or self.namespace,
            ingress_domain=self.ingress_domain,
            ingress_class=self.ingress_class,
        )

    def submit(self, spec: JobSpec, *, fresh: bool = False) -> str:
        """Create the task's Secret (if it has secret variables), the workload, then its Service / Ingress / HPA
        owned by it; existing objects are kept.

        The Secret comes first because a pod whose Secret is missing fails to start; it is then given the
        workload as owner, so it goes with it like the other objects.
        """
        isolation = spec.settings.get("isolation")
        if isolation:
            self.ensure_project(isolation)
        volcano_queue = spec.settings.get("volcano_queue")
        if volcano_queue and m.workload_of(spec) == m.WORKLOAD_VCJOB:
            self.ensure_volcano_queue(volcano_queue)
        manifests = self.manifests(spec)
        namespace = spec.namespace or self.namespace
        workload = m.workload_of(spec)
        name = manifests[0]["metadata"]["name"]
        secret = m.secret_manifest(spec, namespace)
        if secret is not None:
            self._create_or_existing(secret, namespace, workload, name)
        claim = self.checkpoint_claim(spec)
        if claim is not None:  # kept from an earlier attempt, or made now; owned by no workload
            self._create_or_existing(claim, namespace, workload, name)
        owner = self._create_or_existing(manifests[0], namespace, workload, name)
        uid = (owner.get("metadata") or {}).get("uid")
        owner_references = [
            {
                "apiVersion": manifests[0]["apiVersion"],
                "kind": manifests[0]["kind"],
                "name": name,
                "uid": uid,
                "blockOwnerDeletion": True,
            }
        ]
        for manifest in manifests[1:]:
            if uid:
                # The garbage collector then removes them with the workload, even if only that is deleted.
                manifest["metadata"]["ownerReferences"] = owner_references
            self._create_or_existing(manifest, namespace, workload, name)
        if secret is not None and uid:
            _call(self._method("Secret", "patch"), name, namespace, {"metadata": {"ownerReferences": owner_references}})
        return m.external_id(namespace, workload, name)

    def _create_or_existing(self, manifest: dict, namespace: str, workload: str, name: str) -> dict:
        try:
            return self._create(manifest)
        except ExecutorError as exc:
            if _status_code(exc) != 409:
                raise
        # Already there: keep it if an earlier submit of this very attempt made it, never another's.
        if _is_workload(manifest):
            existing = self._read_workload(namespace, workload, name)
            theirs = (existing.get("metadata") or {}).get("labels") or {}
            ours = manifest["metadata"].get("labels") or {}
            identity = (LABEL_INSTALLATION, LABEL_TASK_UID, LABEL_ATTEMPT, LABEL_LAUNCH_TOKEN)
            if any(theirs.get(key) != ours.get(key) for key in identity if key in ours):
                raise ExecutorError(
                    f"{workload} {namespace}/{name} exists but belongs to another installation or attempt",
                    retryable=False,
                )
            return existing
        return {}

    def status(self, external_id: str) -> JobState:
        namespace, workload, name = m.parse_external_id(external_id)
        try:
            obj = self._read_workload(namespace, workload, name)
        except ExecutorError as exc:
            if _status_code(exc) == 404:
                return JobState(external_id, JobPhase.LOST, f"{workload} {namespace}/{name} not found")
            raise
        if workload == m.WORKLOAD_POD:
            state = pod_state(external_id, obj)
            pods = [obj]
        else:
            pods = self._pods(namespace, name)
            state = _STATE_OF[workload](external_id, obj, pods)
        state = dataclasses.replace(state, devices=_devices_of(_placed(pods)))
        return _with_objects(state, self._objects(namespace, workload, name, obj, pods))

    def _objects(self, namespace: str, workload: str, name: str, obj: dict, pods: list[dict]) -> tuple[dict, ...]:
        """The workload, its pods (phase, node) and the ingress host, for the monitoring page."""
        objects = [{"kind": obj.get("kind") or workload, "name": name, "namespace": namespace}]
        for pod in pods if workload != m.WORKLOAD_POD else []:
            status = pod.get("status") or {}
            objects.append(
                {
                    "kind": "Pod",
                    "name": pod["metadata"]["name"],
                    "phase": status.get("phase") or "",
                    "node": (pod.get("spec") or {}).get("nodeName") or "",
                }
            )
        if workload == m.WORKLOAD_POD:
            objects[0]["node"] = (obj.get("spec") or {}).get("nodeName") or ""
        if self.ingress_domain and workload in (m.WORKLOAD_POD, m.WORKLOAD_DEPLOYMENT):
            objects.append({"kind": "Ingress", "name": name, "host": m.ingress_host(name, self.ingress_domain)})
        return tuple(objects)

    def logs(self, external_id: str, tail: int = 200) -> str:
        """The last ``tail`` lines of each pod of the task; pods are headed by name when there are several."""
        namespace, _, name = m.parse_external_id(external_id)
        pods = self._pods(namespace, name)
        chunks = []
        for pod in pods:
            pod_name = pod["metadata"]["name"]
            try:
                text = _call(
                    self._apis["core"].read_namespaced_pod_log,
                    pod_name,
                    namespace,
                    container=m.CONTAINER_NAME,
                    tail_lines=int(tail),
                )
            except ExecutorError as exc:
                if _status_code(exc) in (400, 404):  # container not started yet, or pod just went
                    continue
                raise
            if not text:
                continue
            chunks.append(f"==> {pod_name} <==\n{text}" if len(pods) > 1 else text)
        return "\n".join(chunks)

    def read_logs(self, external_id: str, *, after: str | None = None, tail: int = 200) -> LogChunk:
        """Each pod's output since the last line a follower saw: the log call has no offset, so lines are read
        with their timestamps, from ``since_seconds`` before the last one seen (plus a margin for clock skew
        between this host and the node), and the lines up to that timestamp that were already seen are
        dropped. Pods are headed by name when there are several.
        """
        seen = _log_marks(after) if after else {}
        namespace, _, name = m.parse_external_id(external_id)
        pods = self._pods(namespace, name)
        chunks, marks, more = [], dict(seen), False
        for pod in pods:
            pod_name = pod["metadata"]["name"]
            options = {"container": m.CONTAINER_NAME, "timestamps": True, "limit_bytes": LOG_CHUNK_BYTES}
            if after is None:
                options["tail_lines"] = int(tail)
            elif pod_name in seen:
                options["since_seconds"] = _since_seconds(seen[pod_name])
            try:
                raw = _call(self._apis["core"].read_namespaced_pod_log, pod_name, namespace, **options)
            except ExecutorError as exc:
                if _status_code(exc) in (400, 404):  # container not started yet, or pod just went
                    continue
                raise
            cut = len((raw or "").encode()) >= LOG_CHUNK_BYTES
            text, mark = _lines_after(raw or "", seen.get(pod_name), whole_only=cut)
            if mark:
                marks[pod_name] = mark
            more = more or cut
            if text:
                chunks.append(f"==> {pod_name} <==\n{text}" if len(pods) > 1 else text)
        return LogChunk("\n".join(chunks), json.dumps(marks), more)

    def _instance_pods(self, external_id: str) -> list[dict]:
        namespace, workload, name = m.parse_external_id(external_id)
        if workload != m.WORKLOAD_POD:
            return self._pods(namespace, name)
        try:
            return [self._read_workload(namespace, workload, name)]
        except ExecutorError as exc:
            if _status_code(exc) == 404:
                raise ExecutorError(f"pod {namespace}/{name} not found", retryable=False)
            raise

    def instances(self, external_id: str) -> list[InstanceState]:
        """The task's pods as instances, with CPU and memory from the metrics API when the cluster serves it
        (None otherwise, with a note saying so), and the ports of its Service and the host and TLS of its Ingress."""
        namespace, workload, name = m.parse_external_id(external_id)
        try:
            pods = self._instance_pods(external_id)
        except ExecutorError as exc:
            if workload == m.WORKLOAD_POD and not exc.retryable:  # the dev environment's pod is gone
                return []
            raise
        if not pods:
            return []
        return pod_instances(
            pods,
            self._pod_metrics(namespace, name),
            self._optional("Service", namespace, name),
            self._optional("Ingress", namespace, name),
        )

    def _pod_metrics(self, namespace: str, name: str) -> dict[str, tuple[float, float]] | None:
        """The task's pods' use from metrics.k8s.io; None when the cluster does not serve that API."""
        try:
            found = _call(
                self._custom.list_namespaced_custom_object,
                METRICS_GROUP,
                METRICS_VERSION,
                namespace,
                "pods",
                label_selector=f"{m.LABEL_NAME}={name}",
            )
        except ExecutorError as exc:
            if _status_code(exc) in (404, 503):  # not served, or its backing service is down
                return None
            raise
        return pod_usage(list((found or {}).get("items") or []))

    def _optional(self, kind: str, namespace: str, name: str) -> dict | None:
        """One object the executor may have created for the task; None when it has none."""
        try:
            return self._to_dict(_call(self._method(kind, "read"), name, namespace))
        except ExecutorError as exc:
            if _status_code(exc) == 404:
                return None
            raise

    def open_terminal(self, external_id: str, instance: int = 0, rows: int = 24, cols: int = 80) -> Terminal:
        """``exec`` with a TTY into the main container of the instance's pod, through the API server's stream."""
        namespace, _, _ = m.parse_external_id(external_id)
        pod = instance_pod(self._instance_pods(external_id), instance)
        try:
            ws = stream(self._apis["core"].connect_get_namespaced_pod_exec, **exec_arguments(pod, namespace))
        except (client.ApiException, OSError, ValueError) as exc:
            raise ExecutorError(f"cannot exec into pod {namespace}/{pod['metadata']['name']}: {exc}", retryable=False)
        terminal = KubernetesTerminal(ws)
        terminal.resize(rows, cols)
        return terminal

    def port_endpoint(self, external_id: str, instance: int, port: int) -> Endpoint:
        """The port on the instance's pod IP (the portal must be able to route to pods: in-cluster, or a flat
        network); the pod is chosen as for a terminal."""
        pod = instance_pod(self._instance_pods(external_id), instance)
        address = (pod.get("status") or {}).get("podIP")
        if not address:
            raise ExecutorError(f"pod {pod['metadata']['name']} has no IP yet", retryable=False)
        return Endpoint(address, port)

    def stop(self, external_id: str) -> None:
        """Delete the workload; Foreground makes its pods go before it does. Services stay until delete()."""
        namespace, workload, name = m.parse_external_id(external_id)
        self._delete(_WORKLOAD_KIND.get(workload, workload), namespace, name, "Foreground")

    def delete(self, external_id: str) -> None:
        """Delete every object labelled with the task: workload, pods, Services, Ingress, HPA."""
        namespace, _, name = m.parse_external_id(external_id)
        selector = f"{m.LABEL_NAME}={name}"
        for kind in (m.WORKLOAD_VCJOB, *_DELETE_ORDER):
            for obj in self._list(kind, namespace, selector):
                self._delete(kind, namespace, obj["metadata"]["name"], "Background")

    def remove_checkpoints(self, task_uid: str, project: str) -> None:
        """Delete the task's checkpoint volume claim (its volume goes by the storage class's reclaim policy)."""
        if not TASK_UID_RE.match(task_uid):
            raise ExecutorError(f"invalid task uid: {task_uid!r}", retryable=False)
        # The claim is where the task's jobs ran: the cluster's namespace, or its project's namespace.
        for namespace in self._job_namespaces({}):
            self._delete("PersistentVolumeClaim", namespace, m.checkpoint_claim_name(task_uid), "Background")

    def list_by_owner(self, labels: dict[str, str]) -> list[JobState]:
        """States of the workloads (Pods, Jobs, Volcano Jobs, Deployments) carrying all ``labels``.

        Pods carry the task labels too, so one pod listing serves every workload's state, its replicas
        (pods not terminating) and its nodes.
        """
        states = []
        for namespace in self._job_namespaces(labels):
            states += self._states_in(namespace, labels)
        return states

    def _states_in(self, namespace: str, labels: dict[str, str]) -> list[JobState]:
        selector = m.selector_for(labels)
        pods_by_task: dict[str, list[dict]] = {}
        for pod in sorted(self._list("Pod", namespace, selector), key=lambda p: p["metadata"]["name"]):
            pods_by_task.setdefault(pod["metadata"].get("labels", {}).get(m.LABEL_NAME, ""), []).append(pod)
        states = []
        for workload in m.WORKLOADS:
            workload_selector = ",".join(s for s in (selector, f"{m.LABEL_WORKLOAD}={workload}") if s)
            for obj in self._list(_WORKLOAD_KIND.get(workload, workload), namespace, workload_selector):
                meta = obj["metadata"]
                ext_id = m.external_id(meta.get("namespace") or namespace, workload, meta["name"])
                pods = [obj] if workload == m.WORKLOAD_POD else pods_by_task.get(meta["name"], [])
                state = pod_state(ext_id, obj) if workload == m.WORKLOAD_POD else _STATE_OF[workload](ext_id, obj, pods)
                placed = _placed(pods)
                states.append(
                    dataclasses.replace(
                        state,
                        name=meta["name"],
                        labels=dict(meta.get("labels") or {}),
                        replicas=len(placed),
                        desired_replicas=_desired_replicas(workload, obj),
                        nodes=tuple(sorted(p["spec"]["nodeName"] for p in placed)),
                        devices=_devices_of(placed),
                        uid=str(meta.get("uid") or ""),
                    )
                )
        return states

    supports_resize = True
    runs_images = True  # containers only: a task without an image has nothing to run here
    # Shares of a card are HAMi resources, which exist for these vendors only.
    share_vendors = frozenset(vendor for vendor, profile in m.VENDOR_PROFILES.items() if profile.hami)
    retries_failed_jobs = True

    # --- per-project namespaces ------------------------------------------------------------

    def _job_namespaces(self, labels: dict[str, str]) -> list[str]:
        """The cluster's namespace and the project namespaces this installation made (labelled with it).

        Listing namespaces needs a cluster-wide permission: a cluster that never ran per project may lack it,
        and then has no project namespaces to list (a 403 there reads as none); per project, it is an error.
        """
        selector = m.selector_for({projects.LABEL_MANAGED_BY: projects.MANAGED_BY, **labels})
        try:
            found = _call(self._apis["core"].list_namespace, label_selector=selector)
        except ExecutorError as exc:
            if self.per_project or _status_code(exc) != 403:
                raise
            return [self.namespace]
        names = sorted(self._to_dict(item)["metadata"]["name"] for item in found.items or [])
        ours = [name for name in names if name != self.namespace]
        return [self.namespace, *ours]

    def ensure_project(self, isolation: dict) -> None:
        """Create or bring in step a project's namespace (labels) and its ResourceQuota; idempotent.

        ``isolation``: ``{"namespace", "labels", "quota": spec.hard or None, "annotations"}`` (see
        :func:`apps.clusters.isolation.kubernetes_isolation`). A namespace of that name that this installation
        did not make is refused, never taken over. No quota (none, or not enforced) removes the ResourceQuota.
        """
        namespace, labels = isolation["namespace"], dict(isolation.get("labels") or {})
        core = self._apis["core"]
        existing = self._read_namespace(namespace)
        if existing is None:
            body = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace, "labels": labels}}
            try:
                _call(core.create_namespace, body)
            except ExecutorError as exc:
                if _status_code(exc) != 409:
                    raise
                # Made meanwhile (another worker, or someone else): whose it is is checked as for any other.
                existing = self._read_namespace(namespace) or {}
        if existing is not None:
            theirs = (existing.get("metadata") or {}).get("labels") or {}
            identity = (projects.LABEL_MANAGED_BY, LABEL_INSTALLATION, projects.LABEL_PROJECT_ID)
            if any(theirs.get(key) != labels[key] for key in identity if key in labels):
                raise ExecutorError(
                    f"namespace {namespace} exists but was not made by this portal installation for this project "
                    f"(labels {', '.join(identity)}); rename it, or set another isolation prefix on the cluster",
                    retryable=False,
                )
            if any(theirs.get(key) != value for key, value in labels.items()):
                _call(core.patch_namespace, namespace, {"metadata": {"labels": labels}})
        self._ensure_quota(namespace, labels, isolation.get("quota"), dict(isolation.get("annotations") or {}))

    def _read_namespace(self, name: str) -> dict | None:
        try:
            return self._to_dict(_call(self._apis["core"].read_namespace, name))
        except ExecutorError as exc:
            if _status_code(exc) != 404:
                raise
            return None

    def _ensure_quota(self, namespace: str, labels: dict, hard: dict | None, annotations: dict) -> None:
        core = self._apis["core"]
        try:
            existing = self._to_dict(_call(core.read_namespaced_resource_quota, projects.QUOTA_NAME, namespace))
        except ExecutorError as exc:
            if _status_code(exc) != 404:
                raise
            existing = None
        if hard is None:
            if existing is not None:
                self._delete_quota(namespace)
            return
        if existing is None:
            body = {
                "apiVersion": "v1",
                "kind": "ResourceQuota",
                "metadata": {
                    "name": projects.QUOTA_NAME,
                    "namespace": namespace,
                    "labels": labels,
                    "annotations": annotations,
                },
                "spec": {"hard": dict(hard)},
            }
            _call(core.create_namespaced_resource_quota, namespace, body)
            return
        current = (existing.get("spec") or {}).get("hard") or {}
        current_notes = (existing.get("metadata") or {}).get("annotations") or {}
        if _same_quantities(current, hard) and all(current_notes.get(k) == v for k, v in annotations.items()):
            return
        # A merge patch: keys the portal no longer limits are removed with null.
        patch_hard = {key: None for key in current if key not in hard} | dict(hard)
        patch = {"metadata": {"labels": labels, "annotations": annotations}, "spec": {"hard": patch_hard}}
        _call(core.patch_namespaced_resource_quota, projects.QUOTA_NAME, namespace, patch)

    def _delete_quota(self, namespace: str) -> None:
        try:
            _call(self._apis["core"].delete_namespaced_resource_quota, projects.QUOTA_NAME, namespace)
        except ExecutorError as exc:
            if _status_code(exc) != 404:
                raise

    # --- Volcano queues -----------------------------------------------------------------------

    def ensure_volcano_queue(self, queue: dict) -> None:
        """Create or bring in step the Volcano ``Queue`` of a portal queue (weight, reclaimable, capability,
        guarantee: :func:`k8s_manifests.volcano_queue_manifest`); idempotent. A Volcano queue of that name this
        installation did not make for that portal queue is refused, never taken over."""
        wanted = m.volcano_queue_manifest(queue)
        name = wanted["metadata"]["name"]
        existing = self._read_volcano_queue(name)
        if existing is None:
            try:
                _call(
                    self._custom.create_cluster_custom_object,
                    m.VOLCANO_QUEUE_GROUP,
                    m.VOLCANO_QUEUE_VERSION,
                    m.VOLCANO_QUEUE_PLURAL,
                    wanted,
                )
                return
            except ExecutorError as exc:
                if _status_code(exc) != 409:
                    raise
            existing = self._read_volcano_queue(name) or {}
        meta = existing.get("metadata") or {}
        theirs, ours = meta.get("labels") or {}, wanted["metadata"]["labels"]
        identity = (projects.LABEL_MANAGED_BY, LABEL_INSTALLATION, m.LABEL_QUEUE_ID)
        if any(theirs.get(key) != ours.get(key) for key in identity):
            raise ExecutorError(
                f"Volcano queue {name} exists but was not made by this portal installation for this queue (labels "
                f"{', '.join(identity)}); rename it, or set another isolation prefix on the cluster",
                retryable=False,
            )
        current = existing.get("spec") or {}
        spec = wanted["spec"]
        patch_spec = {
            "weight": spec["weight"],
            "reclaimable": spec["reclaimable"],
            "capability": _replacing(current.get("capability") or {}, spec.get("capability") or {}),
            "guarantee": _replacing(
                (current.get("guarantee") or {}).get("resource") or {},
                (spec.get("guarantee") or {}).get("resource") or {},
                key="resource",
            ),
        }
        notes = wanted["metadata"].get("annotations") or {}
        same = (
            current.get("weight") == spec["weight"]
            and current.get("reclaimable") == spec["reclaimable"]
            and _same_quantities(current.get("capability") or {}, spec.get("capability") or {})
            and _same_quantities(
                (current.get("guarantee") or {}).get("resource") or {},
                (spec.get("guarantee") or {}).get("resource") or {},
            )
            and all(theirs.get(k) == v for k, v in ours.items())
            and (meta.get("annotations") or {}).get(m.NOTES_ANNOTATION) == notes.get(m.NOTES_ANNOTATION)
        )
        if same:
            return
        annotations = {m.NOTES_ANNOTATION: notes.get(m.NOTES_ANNOTATION)}
        patch = {"metadata": {"labels": ours, "annotations": annotations}, "spec": patch_spec}
        _call(
            self._custom.patch_cluster_custom_object,
            m.VOLCANO_QUEUE_GROUP,
            m.VOLCANO_QUEUE_VERSION,
            m.VOLCANO_QUEUE_PLURAL,
            name,
            patch,
        )

    def _read_volcano_queue(self, name: str) -> dict | None:
        try:
            return self._to_dict(
                _call(
                    self._custom.get_cluster_custom_object,
                    m.VOLCANO_QUEUE_GROUP,
                    m.VOLCANO_QUEUE_VERSION,
                    m.VOLCANO_QUEUE_PLURAL,
                    name,
                )
            )
        except ExecutorError as exc:
            if _status_code(exc) != 404:
                raise
            return None

    def resize(self, external_id: str, replicas: int, keep_nodes: tuple[str, ...] = ()) -> None:
        """Scale a running workload: an Indexed Job's parallelism and completions together (elastic Indexed
        Jobs), or a Deployment's replicas. When shrinking, the pods outside ``keep_nodes`` go first (a
        Deployment's deletion cost; an Indexed Job removes its highest indexes)."""
        namespace, workload, name = m.parse_external_id(external_id)
        if replicas < 1:
            raise ExecutorError(f"cannot resize {external_id} to {replicas} replicas", retryable=False)
        if workload == m.WORKLOAD_JOB:
            body = {"spec": {"parallelism": replicas, "completions": replicas}}
            _call(self._apis["batch"].patch_namespaced_job, name, namespace, body)
        elif workload == m.WORKLOAD_DEPLOYMENT:
            if keep_nodes:
                for pod in self._pods(namespace, name):
                    node = (pod.get("spec") or {}).get("nodeName") or ""
                    cost = "0" if node in keep_nodes else "-1000"
                    annotations = {"controller.kubernetes.io/pod-deletion-cost": cost}
                    _call(
                        self._apis["core"].patch_namespaced_pod,
                        pod["metadata"]["name"],
                        namespace,
                        {"metadata": {"annotations": annotations}},
                    )
            _call(self._apis["apps"].patch_namespaced_deployment, name, namespace, {"spec": {"replicas": replicas}})
        else:
            raise ExecutorError(
                f"a {workload} cannot be resized (elastic tasks run as Jobs or Deployments)", retryable=False
            )

    def update_autoscaling(self, external_id: str, spec: JobSpec) -> None:
        """Patch a Deployment's HPA with the bounds and metrics the spec's settings give now."""
        namespace, workload, name = m.parse_external_id(external_id)
        if workload != m.WORKLOAD_DEPLOYMENT:
            return
        hpa = m.inference_manifests(spec, namespace)[-1]
        _call(
            self._apis["autoscaling"].patch_namespaced_horizontal_pod_autoscaler,
            name,
            namespace,
            {"spec": {k: hpa["spec"][k] for k in ("minReplicas", "maxReplicas", "metrics", "behavior")}},
        )

    def nodes(self) -> list[dict]:
        """Every node's allocatable cores, memory and extended resources (GPU-like: ``vendor/resource: count``)."""
        out = []
        for node in (self._to_dict(item) for item in _call(self._apis["core"].list_node).items or []):
            status = node.get("status") or {}
            allocatable = status.get("allocatable") or status.get("capacity") or {}
            addresses = {a.get("type"): a.get("address") for a in status.get("addresses") or []}
            gpus = {k: int(parse_quantity(v)) for k, v in allocatable.items() if "/" in k and int(parse_quantity(v))}
            out.append(
                {
                    "name": node["metadata"]["name"],
                    "address": addresses.get("InternalIP") or addresses.get("Hostname") or "",
                    "cpus": float(parse_quantity(allocatable.get("cpu", "0"))),
                    "memory_gib": round(float(parse_quantity(allocatable.get("memory", "0"))) / 2**30, 2),
                    "gpus": gpus,
                    "labels": (node["metadata"].get("labels") or {}),
                }
            )
        return out

    def node_conditions(self) -> list[NodeCondition]:
        """Node conditions and cordons: not Ready is down, cordoned (unschedulable) takes nothing new."""
        nodes = _call(self._apis["core"].list_node)
        out = []
        for node in (self._to_dict(item) for item in nodes.items or []):
            name = node["metadata"]["name"]
            ready = _conditions(node).get("Ready") or {}
            if ready.get("status") != "True":
                reason = f"{ready.get('reason') or 'NotReady'}: {ready.get('message') or ''}".rstrip(": ")
                out.append(NodeCondition(name, "down", f"Kubernetes: {reason}"))
            elif (node.get("spec") or {}).get("unschedulable"):
                out.append(NodeCondition(name, "draining", "Kubernetes: cordoned"))
            else:
                out.append(NodeCondition(name, "ready"))
        return out

    def health(self) -> str:
        """The API server's version, or ExecutorError when it cannot be reached."""
        version = _call(client.VersionApi(self.api_client).get_code)
        return f"Kubernetes {version.git_version} ({self.api_client.configuration.host})"


_EXEC_SHELL = "export TERM=xterm-256color; if command -v bash >/dev/null 2>&1; then exec bash -i; fi; exec sh -i"


def instance_pod(pods: list[dict], instance: int) -> dict:
    """The running pod of instance ``instance``: an indexed Job's pod of that completion index, else the
    instance-th running pod by name (a Deployment's replicas, a Volcano Job's tasks)."""
    running = [pod for pod in pods if (pod.get("status") or {}).get("phase") == "Running"]
    indexed = [p for p in running if m.JOB_INDEX_ANNOTATION in ((p.get("metadata") or {}).get("annotations") or {})]
    if indexed:
        for pod in indexed:
            if pod["metadata"]["annotations"][m.JOB_INDEX_ANNOTATION] == str(instance):
                return pod
    elif 0 <= instance < len(running):
        return sorted(running, key=lambda pod: pod["metadata"]["name"])[instance]
    raise ExecutorError(f"instance {instance} has no running pod", retryable=False)


def exec_arguments(pod: dict, namespace: str) -> dict:
    """Keyword arguments of ``stream(connect_get_namespaced_pod_exec, ...)`` for an interactive shell."""
    return {
        "name": pod["metadata"]["name"],
        "namespace": namespace,
        "container": m.CONTAINER_NAME,
        "command": ["/bin/sh", "-c", _EXEC_SHELL],
        "stdin": True,
        "stdout": True,
        "stderr": True,
        "tty": True,
        "binary": True,
        "_preload_content": False,
    }


class KubernetesTerminal(Terminal):
    """The Web Console over the API server's exec stream (a WebSocket with one channel per stream)."""

    def __init__(self, ws) -> None:
        self.ws = ws

    def read(self, timeout: float) -> bytes | None:
        if not self.ws.is_open():
            return b""
        try:
            self.ws.update(timeout=timeout)
        except Exception:  # any transport failure ends the session the same way
            return b""
        data = self.ws.read_stdout() + self.ws.read_stderr()
        if data:
            return data
        return None if self.ws.is_open() else b""

    def write(self, data: bytes) -> None:
        if self.ws.is_open():
            self.ws.write_stdin(data)

    def resize(self, rows: int, cols: int) -> None:
        rows, cols = clamp_size(rows, cols)
        if self.ws.is_open():
            self.ws.write_channel(RESIZE_CHANNEL, json.dumps({"Width": cols, "Height": rows}))

    def close(self) -> None:
        self.ws.close()


def _desired_replicas(workload: str, obj: dict) -> int | None:
    """How many replicas a Deployment is set to run (its HPA may have changed it); None for other workloads,
    whose size only the portal sets."""
    if workload != m.WORKLOAD_DEPLOYMENT:
        return None
    replicas = (obj.get("spec") or {}).get("replicas")
    return int(replicas) if replicas is not None else 1


def _same_quantities(current: dict, wanted: dict) -> bool:
    """Whether two ``spec.hard`` maps say the same (the API server may write ``8`` back as ``8`` or ``8000m``)."""
    if current.keys() != wanted.keys():
        return False
    try:
        return all(parse_quantity(str(current[key])) == parse_quantity(str(wanted[key])) for key in wanted)
    except ValueError:
        return False


def _placed(pods: list[dict]) -> list[dict]:
    """The pods bound to a node and not ending: the instances the workload runs now."""
    return [
        p
        for p in pods
        if not p["metadata"].get("deletionTimestamp")
        and (p.get("status") or {}).get("phase") in ("Pending", "Running")
        and (p.get("spec") or {}).get("nodeName")
    ]


def allocated_devices(pod: dict) -> tuple[str, ...]:
    """The devices the kubelet reports it gave the pod's main container for its accelerator limits, as the device
    plugin names them (an NVIDIA card's UUID), sorted; () where it reports none.

    The kubelet writes them into ``status.containerStatuses[].allocatedResourcesStatus`` (Kubernetes 1.31 and
    later, with its ResourceHealthStatus feature on): the device plugin's own choice, whatever the pod asked.
    """
    containers = (pod.get("spec") or {}).get("containers") or []
    main = next((c for c in containers if c.get("name") == m.CONTAINER_NAME), {})
    accelerators = {name for name in ((main.get("resources") or {}).get("limits") or {}) if "/" in name}
    ids: list[str] = []
    for status in (pod.get("status") or {}).get("containerStatuses") or []:
        if status.get("name") != m.CONTAINER_NAME:
            continue
        for entry in status.get("allocatedResourcesStatus") or []:
            if entry.get("name") in accelerators:
                ids += [str(r["resourceID"]) for r in entry.get("resources") or [] if r.get("resourceID")]
    return tuple(sorted(ids))


def _devices_of(placed: list[dict]) -> tuple[tuple[str, tuple[str, ...]], ...]:
    """(node, device ids) of each placed pod whose kubelet reported its devices."""
    found = ((p["spec"]["nodeName"], allocated_devices(p)) for p in placed)
    return tuple(sorted((node, ids) for node, ids in found if ids))


def _replacing(current: dict, wanted: dict, key: str | None = None) -> dict | None:
    """A merge patch that makes the map ``current`` equal ``wanted`` (keys it no longer has set to null); None
    removes it altogether. With ``key``, the map sits under that key (``guarantee.resource``)."""
    if not wanted:
        return None
    patch = {name: None for name in current if name not in wanted} | dict(wanted)
    return {key: patch} if key else patch


def _is_workload(manifest: dict) -> bool:
    return m.LABEL_WORKLOAD in manifest["metadata"].get("labels", {})


def _with_objects(state: JobState, objects: tuple[dict, ...]) -> JobState:
    """``state`` with the objects for the monitoring page; all else it says (why it failed, its replicas) kept."""
    return dataclasses.replace(state, objects=objects)


def _make_api_client(
    host: str | None,
    token: str | None,
    kubeconfig: str | dict | None,
    ca_cert: str | None,
    verify_ssl: bool,
) -> client.ApiClient:
    """A kubeconfig wins (it carries its own server and credentials), then host + token, then the
    in-cluster service account, then the default kubeconfig of the portal's user."""
    try:
        if isinstance(kubeconfig, dict):
            return config.new_client_from_config_dict(kubeconfig)
        if kubeconfig and "\n" in kubeconfig:  # the file's content rather than its path
            return config.new_client_from_config_dict(yaml.safe_load(kubeconfig))
        if kubeconfig:
            return config.new_client_from_config(config_file=kubeconfig)
        if host:
            return client.ApiClient(_host_configuration(host, token, ca_cert, verify_ssl))
        try:
            config.load_incluster_config()
            return client.ApiClient()
        except config.ConfigException:
            return config.new_client_from_config()
    except (config.ConfigException, OSError, yaml.YAMLError, TypeError, ValueError) as exc:
        raise ExecutorError(f"Kubernetes configuration unusable: {exc}", retryable=False) from exc


def _host_configuration(host: str, token: str | None, ca_cert: str | None, verify_ssl: bool) -> client.Configuration:
    configuration = client.Configuration()
    configuration.host = host.rstrip("/")
    if token:
        configuration.api_key = {"authorization": token}
        configuration.api_key_prefix = {"authorization": "Bearer"}
    configuration.verify_ssl = verify_ssl
    if ca_cert and "-----BEGIN" in ca_cert:  # PEM text, as kept in the cluster's credentials
        configuration.ca_cert_data = ca_cert
    elif ca_cert:
        configuration.ssl_ca_cert = ca_cert
    return configuration
