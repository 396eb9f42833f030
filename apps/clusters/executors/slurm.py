"""Slurm executor: submits batch jobs through the Slurm REST API (slurmrestd, JWT auth).

Written against Slurm 22.05's ``v0.0.38`` API. Notes on that API that shaped this module:

- job properties use sbatch-like names: ``gres`` (not ``tres_per_node``), ``nodes`` as a
  ``[min, max]`` pair, ``nodelist`` for required nodes, ``time_limit`` in minutes, and an
  ``environment`` dictionary that must be present;
- failures come back in an ``errors`` array with Slurm's errno and text, often with HTTP 500
  even for plain validation errors, so retryability is decided by the errno, not the status;
- ``exit_code`` in job records is a raw wait status (exit status in the high byte, signal low);
- ``requeue: false`` is accepted and ignored (every job shows ``Requeue=1``, also after a job update through the
  API). The batch script's first act is to ask for it itself (``scontrol update jobid=$SLURM_JOB_ID requeue=0``,
  which slurmctld honours from the job's owner), so a node failure ends the job (``NODE_FAIL``) and the portal's
  requeue rules apply. Where ``scontrol`` is missing on a node, the older guard remains: a restarted job reports
  ``restart_cnt`` > 0 (``JobState.restarts``), the reconciler cancels it and requeues the task as a new attempt, and
  the batch script exits at once when Slurm restarts it;
- a job whose slurmd dies keeps running on its node (its slurmstepd lives on) after slurmctld declared it ended: the
  batch script runs a watchdog that asks slurmctld every ``FENCE_S`` seconds whether the job still runs and ends the
  job's processes when it does not (docs/slurm.md, "Fencing").
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import os
import pwd
import re
import shlex
import shutil
import time
from datetime import UTC, datetime
from pathlib import Path

import requests

from .base import (
    TASK_UID_RE,
    Endpoint,
    Executor,
    ExecutorError,
    Failure,
    InstanceState,
    JobPhase,
    JobSpec,
    JobState,
    NodeCondition,
    Terminal,
    platform_environment,
    wants_checkpoints,
)
from .local import job_command, job_secrets, tail_lines
from .logfile import LogChunk, read_log_file
from .sandbox import TRUSTED_ENV
from .terminal import PtyTerminal
from .vram import DEFAULT_LIBRARY, LIMIT_ENV, SHARE_ENV, vram_limit_bytes

_PHASES = {
    "PENDING": JobPhase.PENDING,
    "CONFIGURING": JobPhase.PENDING,
    "REQUEUED": JobPhase.PENDING,
    "REQUEUE_HOLD": JobPhase.PENDING,
    "REQUEUE_FED": JobPhase.PENDING,
    "RESV_DEL_HOLD": JobPhase.PENDING,
    "RUNNING": JobPhase.RUNNING,
    "COMPLETING": JobPhase.RUNNING,
    "STAGE_OUT": JobPhase.RUNNING,
    "SIGNALING": JobPhase.RUNNING,
    "RESIZING": JobPhase.RUNNING,
    "SUSPENDED": JobPhase.RUNNING,
    "STOPPED": JobPhase.RUNNING,
    "COMPLETED": JobPhase.SUCCEEDED,
    "FAILED": JobPhase.FAILED,
    "OUT_OF_MEMORY": JobPhase.FAILED,
    "BOOT_FAIL": JobPhase.FAILED,
    "DEADLINE": JobPhase.FAILED,
    "TIMEOUT": JobPhase.FAILED,
    "SPECIAL_EXIT": JobPhase.FAILED,
    "REVOKED": JobPhase.CANCELLED,
    "NODE_FAIL": JobPhase.LOST,
    "CANCELLED": JobPhase.CANCELLED,
    "PREEMPTED": JobPhase.PREEMPTED,
}

_STATE_MESSAGES = {
    "TIMEOUT": "wall-time limit reached",
    "BOOT_FAIL": "node boot failure",
    "DEADLINE": "deadline reached before the job could finish",
    "NODE_FAIL": "node failure",
    "PREEMPTED": "preempted by Slurm",
}

_STATE_FAILURES = {
    "TIMEOUT": Failure.WALL_TIME,
    "DEADLINE": Failure.WALL_TIME,
    "OUT_OF_MEMORY": Failure.OUT_OF_MEMORY,
    "BOOT_FAIL": Failure.NODE,
}

_ACTIVE = (JobPhase.PENDING, JobPhase.RUNNING, JobPhase.UNKNOWN)
# The job asks slurmctld for no requeue itself: the REST API drops ``requeue: false`` (see the module docstring).
NO_REQUEUE = 'command -v scontrol >/dev/null 2>&1 && scontrol update jobid="$SLURM_JOB_ID" requeue=0 >/dev/null 2>&1'
# How often a job's watchdog asks slurmctld whether the job still runs; a run slurmctld no longer counts (its node
# declared down while its slurmd was gone, cancelled then) ends within this many seconds (docs/slurm.md, "Fencing").
FENCE_S = 5
FENCE = (
    "hcs_fence() {{ while sleep {interval}; do "
    'hcs_state="$(scontrol -o show job "$SLURM_JOB_ID" 2>/dev/null | grep -o "JobState=[A-Z_]*")" || continue; '
    'case "$hcs_state" in JobState=RUNNING|JobState=COMPLETING|JobState=SUSPENDED|"") ;; '
    '*) echo "hcs: slurmctld no longer counts job $SLURM_JOB_ID as running ($hcs_state): ending this run" >&2; '
    "kill -KILL 0;; esac; done; }}\n"
    'if [ -n "${{SLURM_JOB_ID:-}}" ] && command -v scontrol >/dev/null 2>&1; then hcs_fence & disown; fi'
)
# Replicas of an inference service the portal scales (docs/tasks.md "Autoscaling"): the service's own job is its
# first instance and carries LABEL_SCALED; each extra replica is a job of its own whose comment adds the main
# job's id and the replica's placement key to the task's owner labels. Listings fold replica jobs into their
# service's state, so the reconciler sees one job per attempt (never a replica as a stray).
LABEL_SCALED = "hcs.io/scaled-service"
LABEL_REPLICA_OF = "hcs.io/replica-of"
LABEL_REPLICA = "hcs.io/replica"
# A job that cannot keep checkpoints would lose its work at the next preemption without a word: it fails instead.
MAKE_CHECKPOINT_DIR = (
    'mkdir -p "$HCS_CHECKPOINT_DIR" || { echo "hcs: cannot create the checkpoint directory $HCS_CHECKPOINT_DIR" >&2; '
    "exit 1; }"
)
# A TensorBoard log dir is a path on the nodes: made at the start, and said at once when the job may not write it.
MAKE_TENSORBOARD_DIR = (
    'mkdir -p "$HCS_TENSORBOARD_DIR" 2>/dev/null || echo "hcs: cannot create the TensorBoard log dir '
    '$HCS_TENSORBOARD_DIR on $(hostname); put it under the checkpoint directory or the working directory" >&2'
)
# Project names are slugs; anything else never becomes part of a path.
_PROJECT_RE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_-]*$")

ESLURM_INVALID_JOB_ID = 2017
_NOTHING_FOUND = 9003  # slurmdbd: "Nothing found with query"
# Slurm errnos worth another try: communication and socket errors, "try again" answers,
# a controller in standby, and -1 (slurmrestd could not talk to slurmctld at all).
_RETRYABLE_ERRNOS = {-1, 2007, 2020, 2027}


def _retryable(errno: int | None, http_status: int) -> bool:
    if errno is not None:
        if errno in _RETRYABLE_ERRNOS or 1000 <= errno < 2000 or 5000 <= errno < 6000:
            return True
        if errno >= 2000:
            return False
    return http_status >= 500 or http_status in (408, 429)


# A job's secret files travel in variables of its environment (job/submit's ``environment``: kept by slurmctld,
# never in the batch script) and are written by the job itself, on each node, into a private directory.
SECRET_FILE_VARIABLE = "HCS_SECRET_FILE_{index}"


def secret_file_variables(spec: JobSpec) -> dict[str, str]:
    """The variables that carry the spec's secret files to the batch script, in path order."""
    return {
        SECRET_FILE_VARIABLE.format(index=i): spec.secret_files[path]
        for i, path in enumerate(sorted(spec.secret_files))
    }


def with_secret_files(spec: JobSpec, body: str) -> str:
    """``body`` preceded by the writing of the spec's secret files and followed by their removal.

    A Slurm job is a plain process of the cluster's job user on a shared node, with no file tree of its own:
    each file goes into ``$HCS_SECRETS_DIR`` (a directory only that user can enter, made per job and node
    under ``$TMPDIR``) under its path's file name, mode 0400. The variables that carried them are unset before
    the command runs, which runs as a child so that the directory is removed when it ends or is cancelled.
    """
    lines = [
        'HCS_SECRETS_DIR="$(umask 077; mktemp -d "${TMPDIR:-/tmp}/hcs-secrets.XXXXXXXX")" || '
        '{ echo "hcs: cannot create a private directory for the secret files on $(hostname)" >&2; exit 1; }',
        # (and the VRAM share file of a share's prelude, whose own trap this one replaces)
        'trap \'rm -rf "$HCS_SECRETS_DIR" ${HCS_VRAM_SHARE_FILE:+"$HCS_VRAM_SHARE_FILE"}\' EXIT',
        "trap 'exit 143' TERM INT HUP",
    ]
    for index, path in enumerate(sorted(spec.secret_files)):
        variable = SECRET_FILE_VARIABLE.format(index=index)
        target = shlex.quote(Path(path).name)
        lines.append(f'(umask 0377; printf %s "${variable}" > "$HCS_SECRETS_DIR"/{target}) || exit 1')
    lines.append("unset " + " ".join(SECRET_FILE_VARIABLE.format(index=i) for i in range(len(spec.secret_files))))
    lines += ["export HCS_SECRETS_DIR", f"/bin/bash -c {shlex.quote(body)} &", 'wait "$!"', "exit $?"]
    return "\n".join(lines)


class AccountingUnavailable(ExecutorError):
    """slurmrestd has no accounting endpoints: per-project accounts fall back to the shared account."""

    def __init__(self, message: str):
        super().__init__(message, retryable=False)


def _tres_map(tres: list[dict] | None) -> dict[str, int]:
    """A TRES list of slurmrestd as {"cpu": 8, "mem": 4096, "gres/gpu": 2}, without cleared (-1) entries."""
    out = {}
    for entry in tres or ():
        name = f"{entry.get('type')}/{entry['name']}" if entry.get("name") else str(entry.get("type"))
        if int(entry.get("count", -1)) >= 0:
            out[name] = int(entry["count"])
    return out


def _tres_list(wanted: dict[str, int] | None, current: list[dict] | None) -> list[dict]:
    """The TRES list that sets ``wanted`` and clears (-1) what ``current`` has beyond it."""
    entries = []
    for name, count in sorted((wanted or {}).items()):
        kind, _, sub = name.partition("/")
        entries.append({"type": kind, "name": sub, "count": int(count)} if sub else {"type": kind, "count": int(count)})
    for name in sorted(_tres_map(current).keys() - (wanted or {}).keys()):
        kind, _, sub = name.partition("/")
        entries.append({"type": kind, "name": sub, "count": -1} if sub else {"type": kind, "count": -1})
    return entries


def slurm_phase(job_state: str) -> JobPhase:
    """Backend-neutral phase of a Slurm job state (base state; flags after '+' are ignored)."""
    return _PHASES.get(job_state.split("+")[0].upper(), JobPhase.UNKNOWN)


def time_limit_minutes(time_limit_s: int | None) -> int | None:
    """Slurm time limit in whole minutes, rounded up so a job never gets less than it asked for."""
    if time_limit_s is None:
        return None
    return max(1, math.ceil(time_limit_s / 60))


def decode_exit_code(wait_status: int | None) -> int | None:
    """Shell-style exit code from Slurm's raw wait status: the exit status, or 128 + signal."""
    if wait_status is None:
        return None
    signal_number = wait_status & 0x7F
    return 128 + signal_number if signal_number else (wait_status >> 8) & 0xFF


_SHELL = "export TERM=xterm-256color; if command -v bash >/dev/null 2>&1; then exec bash -i; fi; exec sh -i"


def srun_terminal_argv(job_id: int, user: str, node: str = "", run_as_root: bool = False) -> list[str]:
    """``srun`` starting an interactive shell as a step of job ``job_id`` (on ``node``), as ``user``.

    ``--overlap`` lets the step share the resources the job's own steps hold; ``--pty`` gives it the
    terminal ``srun`` itself runs on. A portal running as root becomes ``user`` first (Slurm accepts a
    step only from the job's owner); otherwise it must already be that user.
    """
    argv = ["srun", f"--jobid={job_id}", "--overlap", "--pty", "--nodes=1", "--ntasks=1", "--quiet"]
    if node:
        argv.append(f"--nodelist={node}")
    argv += ["/bin/sh", "-c", _SHELL]
    if run_as_root:
        argv = ["setpriv", f"--reuid={user}", f"--regid={user}", "--init-groups", "--", *argv]
    return argv


def _timestamp(value: int | None) -> datetime | None:
    return datetime.fromtimestamp(value, UTC) if value else None


def _labels(record: dict) -> dict:
    """The owner labels the portal wrote into the job's comment."""
    try:
        labels = json.loads(record.get("comment") or "")
    except ValueError:
        return {}
    return {str(k): str(v) for k, v in labels.items()} if isinstance(labels, dict) else {}


def replica_key(placement, rank: int) -> str:
    """A replica's identity in its service: its node and cards (its rank where it holds no cards)."""
    cards = "-".join(str(d.index) for d in placement.devices)
    return f"{placement.node}-gpu-{cards}" if cards else f"{placement.node}-r{rank}"


def replica_labels(spec: JobSpec, main_id: str, key: str) -> dict[str, str]:
    """The owner labels of an extra replica job: the task's (same installation, task and attempt) and whose
    replica it is."""
    return {**{k: str(v) for k, v in spec.labels.items()}, LABEL_REPLICA_OF: str(main_id), LABEL_REPLICA: key}


def accounting_state(record: dict) -> JobState:
    """The JobState of a job record of Slurm accounting (``GET /slurmdb/v0.0.38/job/<id>``), whose fields differ
    from slurmctld's: ``state.current``, ``exit_code.return_code`` (or ``.signal``), ``time.start`` / ``.end``."""
    times = record.get("time") or {}
    exit_code = record.get("exit_code") or {}
    signal = (exit_code.get("signal") or {}).get("signal_id") if isinstance(exit_code.get("signal"), dict) else None
    code = exit_code.get("return_code")
    wait_status = ((int(code) & 0xFF) << 8 if code is not None else 0) | (int(signal) & 0x7F if signal else 0)
    current = str((record.get("state") or {}).get("current") or "")
    if current.upper() == "FAILED" and not wait_status:
        # slurmrestd 22.05's dbv0.0.38 reports "SUCCESS", 0 for jobs sacct shows as 3:0: unknown, not 0.
        wait_status = None
    state = job_state(
        {
            "job_id": record.get("job_id"),
            "name": record.get("name"),
            "job_state": current,
            "state_reason": (record.get("state") or {}).get("reason") or "",
            "exit_code": wait_status,
            "start_time": times.get("start"),
            "end_time": times.get("end"),
            "partition": record.get("partition"),
            "nodes": record.get("nodes"),
            "memory_per_node": (record.get("required") or {}).get("memory"),
        }
    )
    if state.phase == JobPhase.FAILED and not state.message:
        state = dataclasses.replace(state, message="failed (Slurm accounting does not tell the exit code)")
    return state


def _memory_limit(record: dict) -> str:
    """The words " of N GiB" for the memory per node a job record says the job asked for (MiB, the portal's
    ``memory_per_node``); "" when the record does not say (or gives memory per CPU, whose flag bit is set)."""
    mib = record.get("memory_per_node")
    if isinstance(mib, dict):  # later API versions: {"set": true, "number": 256}
        mib = mib.get("number") if mib.get("set") else None
    return f" of {mib / 1024:g} GiB" if isinstance(mib, int) and 0 < mib < 2**40 else ""


def job_state(record: dict) -> JobState:
    """The JobState of a job record from ``GET /jobs`` or ``GET /job/<id>``."""
    slurm_state = str(record.get("job_state") or "")
    phase = slurm_phase(slurm_state)
    base_state = slurm_state.split("+")[0].upper()
    exit_code = decode_exit_code(record.get("exit_code")) if phase not in _ACTIVE else None
    message = _STATE_MESSAGES.get(base_state, "")
    if base_state == "OUT_OF_MEMORY":
        message = f"exceeded its memory limit{_memory_limit(record)} (out of memory): Slurm's cgroup killed it"
    reason = record.get("state_reason") or ""
    if phase == JobPhase.PENDING and reason and reason != "None":
        message = f"waiting: {reason}"
    elif phase == JobPhase.FAILED and not message:
        message = f"exit code {exit_code}" if exit_code else (reason if reason != "None" else "")
    objects = (
        {
            "kind": "SlurmJob",
            "name": record.get("name", ""),
            "id": str(record.get("job_id", "")),
            "state": slurm_state,
            "partition": record.get("partition", ""),
            "nodes": record.get("nodes", ""),
            "batch_host": record.get("batch_host", ""),
            "time_limit_min": record.get("time_limit"),
        },
    )
    nodes = tuple(expand_hostlist(str(record.get("nodes") or ""))) if phase == JobPhase.RUNNING else ()
    return JobState(
        external_id=str(record.get("job_id")),
        phase=phase,
        message=message,
        started_at=_timestamp(record.get("start_time")) if phase != JobPhase.PENDING else None,
        finished_at=_timestamp(record.get("end_time")) if phase not in _ACTIVE else None,
        exit_code=exit_code,
        objects=objects,
        name=str(record.get("name") or ""),
        labels=_labels(record),
        restarts=int(record.get("restart_cnt") or 0),
        nodes=nodes,
        failure=_STATE_FAILURES.get(base_state, Failure.EXIT_CODE) if phase == JobPhase.FAILED else "",
    )


# What instances() says of CPU and memory: slurmrestd has no counterpart of sstat for a running job.
NO_USAGE_NOTE = "Slurm's REST API does not report a running job's use (only sstat on a cluster host does)"


def expand_hostlist(hostlist: str) -> list[str]:
    """Slurm's compressed host list as names: ``"gpu[01-03,07],login"`` -> gpu01, gpu02, gpu03, gpu07, login."""
    names = []
    for prefix, ranges, plain in re.findall(r"([^,\[]+)\[([^\]]*)\]|([^,\[\]]+)", hostlist or ""):
        if plain:
            names.append(plain)
            continue
        for part in ranges.split(","):
            low, _, high = part.partition("-")
            if not high:
                names.append(prefix + low)
                continue
            for number in range(int(low), int(high) + 1):
                names.append(f"{prefix}{number:0{len(low)}d}")
    return names


_DOWN_STATES = {"DOWN", "ERROR", "FUTURE", "UNKNOWN"}
_NO_NEW_WORK_FLAGS = {
    "DRAIN",
    "DRAINING",
    "DRAINED",
    "NOT_RESPONDING",
    "MAINTENANCE",
    "REBOOT_REQUESTED",
    "POWERED_DOWN",
    "POWERING_DOWN",
    "POWER_DOWN",
    "FAIL",
}


def node_condition(node: dict) -> NodeCondition:
    """A node of ``SlurmExecutor.nodes()`` as the portal sees it."""
    base = str(node.get("state") or "").split("+")[0].upper()
    flags = set(node.get("state_flags") or ())
    reason = node.get("reason") or ""
    label = "+".join([base.lower(), *sorted(f.lower() for f in flags)])
    if base in _DOWN_STATES:
        return NodeCondition(node["name"], "down", f"Slurm: {label}" + (f" ({reason})" if reason else ""))
    if flags & _NO_NEW_WORK_FLAGS:
        return NodeCondition(node["name"], "draining", f"Slurm: {label}" + (f" ({reason})" if reason else ""))
    return NodeCondition(node["name"], "ready")


class SlurmExecutor(Executor):
    """Runs jobs on one Slurm cluster as ``user``, authenticated by a slurmrestd JWT."""

    runs_host_commands = True  # a batch script on the nodes; the task's image is not used
    share_vendors = None  # a share takes a whole card's gres (held to its memory on NVIDIA cards)

    def __init__(
        self,
        endpoint: str,
        token: str,
        user: str,
        api_version: str = "v0.0.38",
        partition: str = "",
        output_dir: str = "",
        working_dir: str = "",
        timeout: float = 10.0,
        gres_types: dict[str, str] | None = None,
        slurm_conf: str = "",
        checkpoint_root: str = "",
        vram_library: str = "",
        per_project: bool = False,
        cluster_name: str = "",
    ):
        """``gres_types`` maps catalog model names to this site's gres types where they differ from the
        catalog's (a Slurm site names its gres types itself). ``checkpoint_root`` is a directory every node
        shares: training tasks keep their checkpoints in ``<root>/<project>/<task uid>``. ``vram_library`` is
        where the nodes have the VRAM interceptor (``make vram``), by default where this host builds it.
        ``per_project``: jobs run under an account per project (:meth:`ensure_project`) in Slurm accounting's
        cluster ``cluster_name`` (empty: the only cluster slurmdbd knows)."""
        self.endpoint = endpoint.rstrip("/")
        self.gres_types = dict(gres_types or {})
        self.user = user
        self.api_version = api_version
        self.partition = partition
        self.output_dir = output_dir
        self.working_dir = working_dir or output_dir or "/tmp"
        self.timeout = timeout
        self.slurm_conf = slurm_conf  # where this host's slurm.conf is, for srun (Web Console); "" for the default
        self.checkpoint_root = checkpoint_root
        self.vram_library = vram_library or str(DEFAULT_LIBRARY)
        self.per_project = per_project
        self.cluster_name = cluster_name
        self._session = requests.Session()
        # The last job listing and when it was asked for, for ``update_time`` (reused while nothing changes).
        self._listing: tuple[int, list[dict]] | None = None
        self._session.headers.update(
            {"X-SLURM-USER-NAME": user, "X-SLURM-USER-TOKEN": token, "Accept": "application/json"}
        )

    # -- HTTP -----------------------------------------------------------------------------------

    def _url(self, path: str, api: str = "slurm") -> str:
        return f"{self.endpoint}/{api}/{self.api_version}/{path}"

    def _call(self, method: str, path: str, payload: dict | None = None, api: str = "slurm") -> tuple[dict, list[dict]]:
        """One REST call (``api``: ``slurm``, or ``slurmdb`` for accounting); returns the body and its ``errors``,
        raising only for transport failures."""
        try:
            response = self._session.request(method, self._url(path, api), json=payload, timeout=self.timeout)
        except requests.RequestException as exc:
            raise ExecutorError(f"cannot reach slurmrestd at {self.endpoint}: {exc}", retryable=True)
        return self._parse(response)

    def _parse(self, response: requests.Response) -> tuple[dict, list[dict]]:
        try:
            body = response.json()
        except ValueError:
            text = response.text.strip()[:300] or response.reason
            if response.ok:
                raise ExecutorError(f"slurmrestd sent a non-JSON answer: {text}", retryable=True)
            raise ExecutorError(
                f"slurmrestd HTTP {response.status_code}: {text}",
                retryable=_retryable(None, response.status_code),
            )
        errors = [e for e in body.get("errors") or [] if isinstance(e, dict)]
        body["_http_status"] = response.status_code
        if not response.ok and not errors:
            errors = [{"error": f"HTTP {response.status_code} {response.reason}"}]
        return body, errors

    @staticmethod
    def _errno(error: dict) -> int | None:
        value = error.get("error_number", error.get("error_code"))
        return value if isinstance(value, int) else None

    def _fail(self, body: dict, errors: list[dict], context: str) -> ExecutorError:
        # "Failure during parsing" only says that an earlier entry was fatal; keep the specific ones.
        specific = [e for e in errors if self._errno(e) != 9001] or errors
        messages = []
        for error in specific:
            text = error.get("error") or ""
            description = error.get("description") or ""
            if description and description not in text:
                text = f"{text}: {description}" if text else description
            messages.append(text or "unknown error")
        errno = self._errno(specific[0])
        if errno == -1:
            # slurmrestd answers both a stopped slurmctld and a rejected JWT with this errno.
            messages.append(f"slurmctld is unreachable or rejected the token of user {self.user}")
        return ExecutorError(f"{context}: {'; '.join(messages)}", retryable=_retryable(errno, body["_http_status"]))

    # -- job description ------------------------------------------------------------------------

    def _gpus_per_node(self, spec: JobSpec) -> str:
        if spec.gpus_per_instance <= 0:
            return ""
        # Shares of a card are a Kubernetes (HAMi) feature; on Slurm a share takes the whole card.
        count = math.ceil(spec.gpus_per_instance)
        gres_type = ""
        if spec.gpu_model:
            gres_type = self.gres_types.get(spec.gpu_model.name) or spec.gpu_model.slurm_gres_type
        return f"gpu:{gres_type}:{count}" if gres_type else f"gpu:{count}"

    def _environment(self, spec: JobSpec) -> dict[str, str]:
        """The task's variables over a plain base, then the platform's, which win."""
        env = {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "LANG": "C.UTF-8"}
        env.update(spec.env)
        env.update(spec.secret_env)
        env.update(job_secrets(spec))
        env.update(platform_environment(spec))
        env.update(secret_file_variables(spec))
        return env

    def _script(self, spec: JobSpec) -> str:
        """Batch script: the command once, or once per rank through srun for gang jobs.

        When Slurm restarts the job by itself the script ends at once: the portal requeues the task.
        """
        guard = (
            'if [ "${SLURM_RESTART_COUNT:-0}" != 0 ]; then echo "hcs: Slurm restarted job $SLURM_JOB_ID by itself '
            '(restart $SLURM_RESTART_COUNT); the portal requeues the task as a new attempt" >&2; exit 0; fi\n'
            + NO_REQUEUE
            + "\n"
            + FENCE.format(interval=FENCE_S)
        )
        prelude = ['export HOME="${HOME:-$(getent passwd "$(id -un)" | cut -d: -f6)}"']
        if spec.gpu_model is not None and spec.gpus_per_instance > 0:
            # Slurm sets CUDA_VISIBLE_DEVICES for gres gpus; vendors' runtimes read their own name.
            prelude.append(f'export {spec.gpu_model.visible_devices_env}="${{CUDA_VISIBLE_DEVICES:-}}"')
        if (limit := vram_limit_bytes(spec)) is not None:
            prelude.append(self._vram_prelude(limit))
        body = job_command(spec)
        if spec.secret_files:
            body = with_secret_files(spec, body)
        # Kept across attempts: the first one creates it; the batch host creates it once for every rank.
        setup = [MAKE_CHECKPOINT_DIR] if spec.checkpoint_dir else []
        if spec.settings.get("tensorboard_dir"):
            setup.append(MAKE_TENSORBOARD_DIR)
        if spec.instances <= 1:
            lines = [guard, *setup, *prelude, "export HCS_RANK=0 HCS_WORLD_SIZE=1", body]
            return "#!/bin/bash\n" + "\n".join(lines) + "\n"
        rank_script = "\n".join([*prelude, "export HCS_RANK=$SLURM_PROCID HCS_WORLD_SIZE=$SLURM_NTASKS", body])
        lines = [
            guard,
            *setup,
            'export HCS_MASTER_ADDR="$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)"',
            f"srun --kill-on-bad-exit=1 /bin/bash -c {shlex.quote(rank_script)}",
        ]
        return "#!/bin/bash\n" + "\n".join(lines) + "\n"

    def _vram_prelude(self, limit: int) -> str:
        """Loads the VRAM interceptor into the job's processes; the job fails at once on a node without it
        (the loader would only warn and run the share unlimited)."""
        library = shlex.quote(self.vram_library)
        return (
            f'if [ ! -r {library} ]; then echo "hcs: this job holds part of a card and its VRAM limit needs '
            f'{library}, which is not readable on $(hostname): install it there (make vram)" >&2; exit 1; fi\n'
            f"export {LIMIT_ENV}={limit}\n"
            # The share file every process of this rank counts in: made here (mode 0600, a name nobody can
            # guess and take first on a shared /tmp) and removed at the end.
            f'{SHARE_ENV}="$(mktemp "${{TMPDIR:-/tmp}}/hcs-vram-share.XXXXXXXX")" || {{ echo "hcs: cannot create '
            f'the VRAM share file on $(hostname)" >&2; exit 1; }}\n'
            f"export {SHARE_ENV}\n"
            f"trap 'rm -f \"${SHARE_ENV}\"' EXIT\n"
            f'export LD_PRELOAD={library}"${{LD_PRELOAD:+:$LD_PRELOAD}}"'
        )

    def _output_path(self, name: str) -> str:
        return str(Path(self.output_dir) / f"{name}.out") if self.output_dir else ""

    def checkpoint_dir(self, task_uid: str, project: str) -> str:
        """The shared directory of a task's checkpoints, ``<root>/<project>/<task uid>``; "" without a root."""
        if not self.checkpoint_root:
            return ""
        if not TASK_UID_RE.match(task_uid) or not _PROJECT_RE.match(project):
            raise ExecutorError(f"invalid task uid or project: {task_uid!r}, {project!r}", retryable=False)
        return str(Path(self.checkpoint_root) / project / task_uid)

    def _with_checkpoints(self, spec: JobSpec) -> JobSpec:
        """The spec with its checkpoint directory: the task's checkpoint_path as it is (the user's own directory
        on the shared file system), else the one under the cluster's checkpoint root."""
        if not wants_checkpoints(spec):
            return spec
        path = str(spec.settings.get("checkpoint_path") or "") or self.checkpoint_dir(spec.task_uid, spec.project)
        return dataclasses.replace(spec, checkpoint_dir=path)

    def job_description(self, spec: JobSpec) -> dict:
        """The ``job/submit`` request body for a spec (public so tests and the admin can show it)."""
        spec = self._with_checkpoints(spec)
        partition = spec.namespace or self.partition
        labels = {k: str(v) for k, v in spec.labels.items()}
        if self._serves_replicas(spec) and LABEL_REPLICA_OF not in labels:
            labels[LABEL_SCALED] = "1"
        job: dict = {
            "name": spec.name,
            "comment": json.dumps(labels, sort_keys=True, separators=(",", ":")),
            "nodes": [spec.instances, spec.instances],
            "tasks": spec.instances,
            "tasks_per_node": 1,
            "cpus_per_task": max(1, math.ceil(spec.cpu)),
            "memory_per_node": max(1, math.ceil(spec.memory_gib * 1024)),
            "current_working_directory": self.working_dir,
            "environment": self._environment(spec),
            "requeue": False,  # ignored by v0.0.38 (see the module docstring); kept for later API versions
        }
        if partition:
            job["partition"] = partition
        if gres := self._gpus_per_node(spec):
            job["gres"] = gres
        if spec.placements:
            job["nodelist"] = ",".join(dict.fromkeys(p.node for p in spec.placements))
        if (minutes := time_limit_minutes(spec.time_limit_s)) is not None:
            job["time_limit"] = minutes
        if output := self._output_path(spec.name):
            job["standard_output"] = output
            job["standard_error"] = output
            job["open_mode"] = "append"  # a restart by Slurm must not wipe the first run's log
        return {"script": self._script(spec), "job": job}

    # -- job records ----------------------------------------------------------------------------

    @staticmethod
    def _job_id(external_id: str) -> int:
        try:
            return int(external_id)
        except ValueError:
            raise ExecutorError(f"not a Slurm job id: {external_id!r}", retryable=False)

    def _record(self, external_id: str) -> dict | None:
        body, errors = self._call("GET", f"job/{self._job_id(external_id)}")
        if any(self._errno(e) == ESLURM_INVALID_JOB_ID for e in errors):
            return None
        if errors:
            raise self._fail(body, errors, f"cannot read Slurm job {external_id}")
        jobs = body.get("jobs") or []
        return jobs[0] if jobs else None

    def _jobs(self) -> list[dict]:
        """The user's jobs in one listing; unchanged since the last listing, slurmctld says so (HTTP 304) and
        the last one is reused, so an idle cluster costs a few bytes per sync instead of every job record."""
        path = "jobs"
        if self._listing is not None:
            path += f"?update_time={self._listing[0]}"
        asked_at = int(time.time()) - 1  # slurmctld's clock granularity is a second: never miss a change
        try:
            response = self._session.get(self._url(path), timeout=self.timeout)
        except requests.RequestException as exc:
            raise ExecutorError(f"cannot reach slurmrestd at {self.endpoint}: {exc}", retryable=True)
        if response.status_code == 304 and self._listing is not None:
            return self._listing[1]
        body, errors = self._parse(response)
        if errors:
            raise self._fail(body, errors, "cannot list Slurm jobs")
        jobs = [job for job in body.get("jobs") or [] if job.get("user_name") in (self.user, None)]
        self._listing = (asked_at, jobs)
        return jobs

    # -- Executor interface ---------------------------------------------------------------------

    def submit(self, spec: JobSpec, *, fresh: bool = False) -> str:
        """Submit the batch job unless this attempt's job exists (same name and owner labels); returns the job id.

        A fresh submit skips the search: it would download every job of the cluster for nothing.
        """
        replicas = spec.instances > 1 and self._serves_replicas(spec)
        if replicas and len(spec.placements) != spec.instances:
            raise ExecutorError(
                f"{spec.instances} replicas asked for with {len(spec.placements)} placements", retryable=False
            )
        # A service the portal scales: its own job is the first replica, the others are jobs of their own.
        first = dataclasses.replace(spec, instances=1, placements=spec.placements[:1]) if replicas else spec
        description = self.job_description(first)  # refuses a bad spec before any network call
        labels = _labels({"comment": description["job"]["comment"]})
        for record in () if fresh else self._jobs():
            if (
                record.get("name") == spec.name
                and _labels(record) == labels
                and slurm_phase(str(record.get("job_state"))) != JobPhase.CANCELLED
            ):
                job_id = str(record["job_id"])
                break
        else:
            job_id = self._post(first, description)
        if replicas:
            self._sync_replicas(job_id, spec)
        return job_id

    def _post(self, spec: JobSpec, description: dict) -> str:
        """Submit one job description (under the project's account where there is one); returns its id."""
        isolation = spec.settings.get("isolation")
        if isolation:
            account = self.ensure_project(isolation)
            if account:
                description["job"]["account"] = account
        body, errors = self._call("POST", "job/submit", description)
        job_id = body.get("job_id")
        # Submits can carry informational entries next to a job id (e.g. "job is held").
        if not job_id:
            partition = description["job"].get("partition", "default")
            raise self._fail(body, errors, f"Slurm refused the job (partition {partition})")
        return str(job_id)

    def status(self, external_id: str) -> JobState:
        record = self._record(external_id)
        if record is None:
            return JobState(external_id, JobPhase.LOST, message=f"Slurm no longer knows job {external_id}")
        if LABEL_SCALED not in _labels(record):
            return job_state(record)
        records = self._jobs()
        self._end_orphans(records, only={str(record.get("job_id")): record})
        return self._service_state(record, records)

    def final_state(self, external_id: str, name: str, submitted_after: float | None = None) -> JobState | None:
        """The job's record in Slurm accounting (slurmdbd keeps it after slurmctld forgets the job, ``MinJobAge``
        after it ended, or loses its state): None without accounting, when accounting has no ended job of that
        id and name submitted at ``submitted_after`` or later, or when the job has not ended there."""
        try:
            cluster = self.accounting_cluster()
            body, errors = self._db("GET", f"job/{external_id}")
        except AccountingUnavailable:
            return None
        if any(self._errno(e) == _NOTHING_FOUND for e in errors):
            return None
        if errors:
            raise self._fail(body, errors, f"cannot read job {external_id} from Slurm accounting")
        # Job ids are unique per cluster only, and come again after slurmctld loses its state: the newest record
        # of this cluster, id and name, submitted no earlier than the portal's submit (a minute's clock slack).
        floor = (submitted_after or 0) - 60
        matches = [
            r
            for r in body.get("jobs") or []
            if str(r.get("job_id")) == str(external_id)
            and r.get("name") == name
            and r.get("cluster") == cluster
            and int((r.get("time") or {}).get("submission") or 0) >= floor
        ]
        if not matches:
            return None
        state = accounting_state(max(matches, key=lambda r: int((r.get("time") or {}).get("submission") or 0)))
        return None if state.phase in _ACTIVE else state

    def logs(self, external_id: str, tail: int = 200) -> str:
        """The job's output file, read where this host mounts the shared output directory."""
        record = self._record(external_id)
        path = (record or {}).get("standard_output") or ""
        if not path or "%" in path:  # an unexpanded filename pattern: not a file we wrote
            return ""
        try:
            return tail_lines(Path(path), tail)
        except OSError:
            return ""

    def read_logs(self, external_id: str, *, after: str | None = None, tail: int = 200) -> LogChunk:
        """From a byte offset in the job's output file (slurmrestd has no log call: the file is read where
        this host mounts the shared output directory, as :meth:`logs` does)."""
        record = self._record(external_id)
        path = (record or {}).get("standard_output") or ""
        if not path or "%" in path:
            return LogChunk("", after or "")
        try:
            return read_log_file(Path(path), after=after, tail=tail)
        except OSError:
            return LogChunk("", after or "")

    def instances(self, external_id: str) -> list[InstanceState]:
        """One instance per node of the job (its ranks run there through srun), with the node's address; CPU and
        memory use are unknown (None): the REST API does not report them. Two calls: the job, then its nodes.
        A service the portal scales adds one instance per running replica job (in submission order)."""
        record = self._record(external_id)
        if record is None:
            return []
        state = job_state(record)
        if state.phase == JobPhase.PENDING:
            return []
        records = [record]
        if LABEL_SCALED in _labels(record) and state.phase == JobPhase.RUNNING:
            replicas = self._replica_records(external_id, self._jobs())
            records += [r for r in replicas if slurm_phase(str(r.get("job_state"))) == JobPhase.RUNNING]
        placed = [(r, job_state(r), node) for r in records for node in expand_hostlist(str(r.get("nodes") or ""))]
        addresses = {}
        if placed and state.phase == JobPhase.RUNNING:
            body, errors = self._call("GET", "nodes")
            if not errors:
                addresses = {n.get("name"): n.get("address") or None for n in body.get("nodes") or []}
        return [
            InstanceState(
                index=index,
                name=f"{one.external_id}/{node}",
                state=str(job.get("job_state") or ""),
                node=node,
                ip=addresses.get(node),
                restarts=one.restarts,
                started_at=one.started_at,
                message=one.message,
                usage_note=NO_USAGE_NOTE,
            )
            for index, (job, one, node) in enumerate(placed)
        ]

    def stop(self, external_id: str) -> None:
        """Cancel the job by its id (Slurm sends SIGTERM, then SIGKILL after the cluster's KillWait): one read of the
        job and one cancel, no listing, unless it is a service the portal scales, whose replica jobs go with it."""
        record = self._record(external_id)
        self._cancel(external_id)
        if record is None or LABEL_SCALED not in _labels(record):
            return
        for replica in self._replica_records(external_id, self._jobs()):
            if slurm_phase(str(replica.get("job_state"))) in _ACTIVE:
                self._cancel(str(replica["job_id"]))

    def _cancel(self, external_id: str) -> None:
        body, errors = self._call("DELETE", f"job/{self._job_id(external_id)}")
        errors = [e for e in errors if self._errno(e) != ESLURM_INVALID_JOB_ID]
        if errors:
            raise self._fail(body, errors, f"cannot cancel Slurm job {external_id}")

    def open_terminal(self, external_id: str, instance: int = 0, rows: int = 24, cols: int = 80) -> Terminal:
        """An interactive step in the job's allocation (``srun --overlap --pty``) on the instance's node."""
        state = self.status(external_id)
        if state.phase != JobPhase.RUNNING:
            raise ExecutorError(f"Slurm job {external_id} is not running", retryable=False)
        if instance < len(state.nodes):
            node = state.nodes[instance]
        elif instance == 0:
            node = ""
        else:
            raise ExecutorError(f"Slurm job {external_id} has no instance {instance}", retryable=False)
        if not shutil.which("srun", path=TRUSTED_ENV["PATH"]):
            raise ExecutorError(
                "srun is not installed on the portal host: the Web Console of Slurm jobs needs "
                "Slurm's client commands and munge there",
                retryable=False,
            )
        run_as_root = os.geteuid() == 0
        if not run_as_root and pwd.getpwuid(os.geteuid()).pw_name != self.user:
            raise ExecutorError(
                f"the portal runs as {pwd.getpwuid(os.geteuid()).pw_name}, not as the jobs' user "
                f"{self.user}: srun cannot open a step in their jobs",
                retryable=False,
            )
        env = dict(TRUSTED_ENV, TERM="xterm-256color")
        if self.slurm_conf:
            env["SLURM_CONF"] = self.slurm_conf
        argv = srun_terminal_argv(self._job_id(external_id), self.user, node, run_as_root)
        return PtyTerminal(argv, rows, cols, env=env)

    def port_endpoint(self, external_id: str, instance: int, port: int) -> Endpoint:
        """The port on the node of the instance, at the address slurmctld knows the node by (its NodeAddr)."""
        state = self.status(external_id)
        if state.phase != JobPhase.RUNNING:
            raise ExecutorError(f"Slurm job {external_id} is not running", retryable=False)
        if instance < len(state.nodes):
            node = state.nodes[instance]
        else:
            # Instance k > 0 of a service the portal scales: its k-th running replica job, in submission order.
            running = [job_state(r) for r in self._replica_records(external_id, self._jobs())]
            running = [r for r in running if r.phase == JobPhase.RUNNING and r.nodes]
            if not state.replicas or not 0 < instance <= len(running):
                raise ExecutorError(f"Slurm job {external_id} has no instance {instance}", retryable=False)
            node = running[instance - 1].nodes[0]
        address = next((n.get("address") for n in self.nodes() if n.get("name") == node), "") or node
        return Endpoint(address, port)

    def delete(self, external_id: str) -> None:
        """Cancel the job and remove its output file; Slurm forgets the record after MinJobAge."""
        record = self._record(external_id)
        replicas = self._replica_records(external_id, self._jobs()) if LABEL_SCALED in _labels(record or {}) else []
        self.stop(external_id)
        for one in [record, *replicas]:
            output = (one or {}).get("standard_output") or ""
            if output and self.output_dir and Path(output).parent == Path(self.output_dir):
                Path(output).unlink(missing_ok=True)

    def remove_checkpoints(self, task_uid: str, project: str) -> None:
        """Remove the task's directory under the checkpoint root, where this host mounts the shared root (as for
        logs); a task's own checkpoint_path is the user's and stays."""
        directory = self.checkpoint_dir(task_uid, project)
        if not directory:
            return
        shutil.rmtree(directory, ignore_errors=True)
        if Path(directory).exists():
            raise ExecutorError(f"cannot remove the checkpoint directory {directory}")

    def list_by_owner(self, labels: dict[str, str]) -> list[JobState]:
        """The jobs whose owner labels include ``labels``; a service's replica jobs count in its own state (one
        state per job the portal submitted), and replica jobs whose service job has ended are cancelled."""
        records = self._jobs()
        self._end_orphans(records)
        states = []
        for record in records:
            job_labels = _labels(record)
            if job_labels and all(job_labels.get(key) == value for key, value in labels.items()):
                if LABEL_REPLICA_OF in job_labels:
                    continue
                states.append(self._service_state(record, records) if LABEL_SCALED in job_labels else job_state(record))
        return states

    # -- replicas of an inference service the portal scales (docs/tasks.md "Autoscaling") --------------------

    # Each extra replica is a Slurm job of its own on its node (a Slurm job cannot grow or shrink).
    scales_services = True

    @staticmethod
    def _serves_replicas(spec: JobSpec) -> bool:
        return spec.kind == "inference" and spec.settings.get("min_replicas") is not None

    @staticmethod
    def _replica_records(main_id: str, records: list[dict]) -> list[dict]:
        """The replica jobs of service job ``main_id`` in ``records``, in submission order."""
        mine = [r for r in records if _labels(r).get(LABEL_REPLICA_OF) == str(main_id)]
        return sorted(mine, key=lambda r: int(r.get("job_id") or 0))

    def _service_state(self, record: dict, records: list[dict]) -> JobState:
        """A service job's state with its replicas: running = its own job and its running replica jobs, desired =
        its own job and its replica jobs not ended (pending ones included)."""
        state = job_state(record)
        if state.phase not in _ACTIVE:
            return state
        phases = [slurm_phase(str(r.get("job_state"))) for r in self._replica_records(state.external_id, records)]
        running = int(state.phase == JobPhase.RUNNING) + sum(p == JobPhase.RUNNING for p in phases)
        desired = 1 + sum(p in _ACTIVE for p in phases)
        return dataclasses.replace(state, replicas=running, desired_replicas=desired)

    def _end_orphans(self, records: list[dict], only: dict[str, dict] | None = None) -> None:
        """Cancel the replica jobs in ``records`` whose service job has ended or is gone (only those of the
        service jobs in ``only``, when given): a replica never outlives its service. A failed cancel is tried
        again at the next listing."""
        by_id = {str(r.get("job_id")): r for r in records} | (only or {})
        for record in records:
            main_id = _labels(record).get(LABEL_REPLICA_OF)
            if not main_id or slurm_phase(str(record.get("job_state"))) not in _ACTIVE:
                continue
            if only is not None and main_id not in only:
                continue
            main = by_id.get(main_id)
            if main is None or slurm_phase(str(main.get("job_state"))) not in _ACTIVE:
                with contextlib.suppress(ExecutorError):
                    self._cancel(str(record["job_id"]))

    def resize(self, external_id: str, replicas: int, keep_nodes: tuple[str, ...] = (), spec: JobSpec | None = None):
        """Run ``replicas`` instances of a service from now on: ``spec.placements`` are the live instances in
        order (the first is the service's own job). A replica job keeps running while its node and cards stay in
        the placement; those whose placement left are cancelled; new placements (and replicas whose job ended)
        are submitted."""
        if spec is None or not self._serves_replicas(spec):
            raise ExecutorError("the Slurm executor resizes only inference services the portal scales", retryable=False)
        if len(spec.placements) != replicas or replicas < 1:
            raise ExecutorError(
                f"{replicas} replicas asked for with {len(spec.placements)} placements", retryable=False
            )
        record = self._record(external_id)
        if record is None or slurm_phase(str(record.get("job_state"))) not in _ACTIVE:
            raise ExecutorError(f"Slurm job {external_id} is not running")
        self._sync_replicas(external_id, spec)

    def _sync_replicas(self, main_id: str, spec: JobSpec) -> None:
        """Submit the replica jobs ``spec`` places that do not run, cancel those it no longer places."""
        wanted = {replica_key(p, rank): p for rank, p in enumerate(spec.placements[1:], start=1)}
        live: set[str] = set()
        for record in self._replica_records(main_id, self._jobs()):
            if slurm_phase(str(record.get("job_state"))) not in _ACTIVE:
                continue  # ended (or died): submitted again below if still placed
            key = _labels(record).get(LABEL_REPLICA, "")
            if key in wanted and key not in live:
                live.add(key)
            else:
                self._cancel(str(record["job_id"]))
        for key, placement in wanted.items():
            if key in live:
                continue
            one = dataclasses.replace(
                spec,
                name=f"{spec.name}-{key}",
                instances=1,
                placements=(placement,),
                labels=replica_labels(spec, main_id, key),
            )
            self._post(one, self.job_description(one))

    def nodes(self) -> list[dict]:
        """The partition's nodes: name, cpus, memory GiB, state and GPU gres as ``{type: count}``."""
        body, errors = self._call("GET", "nodes")
        if errors:
            raise self._fail(body, errors, "cannot list Slurm nodes")
        out = []
        for node in body.get("nodes") or []:
            partitions = node.get("partitions") or []
            if self.partition and partitions and self.partition not in partitions:
                continue
            gres: dict[str, int] = {}
            for item in filter(None, (node.get("gres") or "").split(",")):
                parts = item.split("(")[0].split(":")  # gpu:a100:8(S:0) -> gpu, a100, 8
                if parts[0] == "gpu" and len(parts) == 3 and parts[2].isdigit():
                    gres[parts[1]] = gres.get(parts[1], 0) + int(parts[2])
            out.append(
                {
                    "name": node.get("name"),
                    "address": node.get("address") or "",  # NodeAddr: where the node's ports are reached
                    "cpus": node.get("cpus") or 0,
                    "memory_gib": round((node.get("real_memory") or 0) / 1024, 2),
                    "state": node.get("state", ""),
                    "state_flags": [str(f).upper() for f in node.get("state_flags") or []],
                    "reason": node.get("reason") or "",
                    "gres": gres,
                    "gpus": gres,
                }
            )
        return out

    def node_conditions(self) -> list[NodeCondition]:
        """Slurm node states: down / error / future nodes run nothing; drained or unresponsive ones take nothing new."""
        return [node_condition(node) for node in self.nodes()]

    # -- per-project accounts (Slurm accounting through slurmrestd's slurmdbd endpoints) --------

    def _db(self, method: str, path: str, payload: dict | None = None) -> tuple[dict, list[dict]]:
        """One call to the accounting endpoints; :class:`AccountingUnavailable` when slurmrestd has none (it
        answers a path no plugin serves with a plain-text 404)."""
        try:
            response = self._session.request(method, self._url(path, "slurmdb"), json=payload, timeout=self.timeout)
        except requests.RequestException as exc:
            raise ExecutorError(f"cannot reach slurmrestd at {self.endpoint}: {exc}", retryable=True)
        if response.status_code == 404 and "json" not in response.headers.get("Content-Type", ""):
            raise AccountingUnavailable(
                f"slurmrestd at {self.endpoint} serves no accounting endpoints (its openapi/db{self.api_version} "
                "plugin is not loaded: Slurm accounting needs slurmdbd)"
            )
        return self._parse(response)

    def accounting_cluster(self) -> str:
        """The cluster name in Slurm accounting: ``cluster_name``, else the only cluster slurmdbd knows.

        Raises :class:`AccountingUnavailable` when slurmrestd has no accounting endpoints."""
        if self.cluster_name:
            return self.cluster_name
        body, errors = self._db("GET", "clusters")
        if errors:
            raise self._fail(body, errors, "cannot list the clusters of Slurm accounting")
        names = sorted(c.get("name", "") for c in body.get("clusters") or [])
        if len(names) != 1:
            raise ExecutorError(
                f"Slurm accounting knows the clusters {', '.join(names) or '(none)'}: set the cluster label "
                "slurm-cluster to the one this cluster is",
                retryable=False,
            )
        self.cluster_name = names[0]
        return self.cluster_name

    def _associations(self, account: str, cluster: str) -> list[dict]:
        body, errors = self._db("GET", f"associations?account={account}&cluster={cluster}")
        if any(self._errno(e) == _NOTHING_FOUND for e in errors):
            return []
        if errors:
            raise self._fail(body, errors, f"cannot read the associations of account {account}")
        return [a for a in body.get("associations") or [] if a.get("account") == account]

    def ensure_project(self, isolation: dict) -> str | None:
        """Create or bring in step the project's account, this user's association to it and its GrpTRES;
        returns the account to submit under, or None when Slurm accounting is not available (the job then
        runs under the user's default account, its project named in its comment: see :meth:`health`).

        ``isolation``: ``{"account", "description", "organization", "grp_tres": {tres: count} or None}``; the
        organisation says whose account it is, and an existing account of another is refused, never taken. The
        limits sit on this user's association with the account: the portal submits every job of the project
        as this user, so it bounds all of them (slurmrestd v0.0.38 cannot update an account's own association).
        """
        account = str(isolation["account"])
        try:
            cluster = self.accounting_cluster()
        except AccountingUnavailable:
            return None
        body, errors = self._db("GET", f"account/{account}")
        if any(self._errno(e) == _NOTHING_FOUND for e in errors):
            new = {
                "name": account,
                "description": isolation.get("description") or account,
                "organization": isolation.get("organization") or "hcs",
            }
            body, errors = self._db("POST", "accounts", {"accounts": [new]})
            if errors:
                raise self._fail(body, errors, f"cannot create Slurm account {account}")
        elif errors:
            raise self._fail(body, errors, f"cannot read Slurm account {account}")
        else:
            found = next((a for a in body.get("accounts") or [] if a.get("name") == account), {})
            wanted = str(isolation.get("organization") or "hcs").lower()
            if str(found.get("organization") or "").lower() != wanted:
                raise ExecutorError(
                    f"Slurm account {account} exists but was not made by this portal for this project (organisation "
                    f"{found.get('organization')!r}, expected {wanted!r}); rename it, or set another isolation "
                    "prefix on the cluster",
                    retryable=False,
                )
        associations = self._associations(account, cluster)
        if not any(not a.get("user") for a in associations):
            # The account's own association on the cluster, under root. v0.0.38's parser reports the missing
            # user, yet adds it; whether it did is read back below.
            self._db(
                "POST",
                "associations",
                {"associations": [{"account": account, "cluster": cluster, "parent_account": "root"}]},
            )
            associations = self._associations(account, cluster)
            if not any(not a.get("user") for a in associations):
                raise ExecutorError(
                    f"Slurm accounting did not add account {account} to cluster {cluster}; add it with: sacctmgr add "
                    f"account {account} cluster={cluster}",
                    retryable=False,
                )
        mine = next((a for a in associations if a.get("user") == self.user), None)
        wanted = _tres_list(isolation.get("grp_tres"), (mine or {}).get("max", {}).get("tres", {}).get("total"))
        if mine is not None and _tres_map(wanted) == _tres_map(mine.get("max", {}).get("tres", {}).get("total")):
            return account
        association = {"account": account, "cluster": cluster, "user": self.user, "max": {"tres": {"total": wanted}}}
        body, errors = self._db("POST", "associations", {"associations": [association]})
        if errors:
            raise self._fail(body, errors, f"cannot associate user {self.user} with Slurm account {account}")
        return account

    def accounting_problem(self) -> str:
        """Why per-project accounts cannot be made here ("" when they can): said in the cluster's health."""
        try:
            self.accounting_cluster()
        except ExecutorError as exc:  # no accounting endpoints, or slurmdbd not answering
            return str(exc)
        return ""

    def health(self) -> str:
        body, errors = self._call("GET", "ping")
        if errors:
            raise self._fail(body, errors, "slurmrestd ping failed")
        pings = body.get("pings") or []
        if not pings or not any(p.get("ping") == "UP" for p in pings):
            raise ExecutorError(f"no Slurm controller answers at {self.endpoint}", retryable=True)
        release = (body.get("meta") or {}).get("Slurm", {}).get("release", "?")
        hosts = ", ".join(f"{p.get('hostname')} {p.get('ping')}" for p in pings)
        line = f"Slurm {release} ({self.api_version}): controller {hosts}"
        if self.per_project and (problem := self.accounting_problem()):
            line += (
                f"; project isolation degraded: {problem}. Jobs run under the submitting user's default account, "
                "their project named in the job comment"
            )
        return line
