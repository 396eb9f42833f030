"""What a task may ask for: bounds on every count, duration and text, and the shapes of env, labels, volumes.

``Task.clean()`` applies these rules, and every door (API, pages, admin) submits through ``submit_task``,
which runs it, so the same input is refused everywhere with the same message before anything is
written. The bounds keep one submission from costing every scheduling cycle, list and page (200,000
instances of nothing) and keep launches from failing on input a backend cannot take.
"""

from __future__ import annotations

import posixpath
import re
from collections.abc import Iterable, Mapping
from datetime import timedelta
from decimal import Decimal, InvalidOperation
from typing import Any

from apps.clusters import services as cluster_services
from apps.clusters.hostpaths import is_approved, path_problem
from apps.clusters.models import Cluster
from apps.queues.models import LONGEST_EXPECTED_DURATION
from apps.tasks import schedule

# Per instance.
MIN_CPU = Decimal("0.01")
MAX_CPU = Decimal("1024")
MIN_MEMORY_GIB = Decimal("0.01")
MAX_MEMORY_GIB = Decimal("16384")
# Gang ranks, elastic replicas and autoscaling replicas alike.
MAX_INSTANCES = 1024
# Autoscaling target: requests per second per replica.
MAX_RPS = 1_000_000
MAX_LATENCY_MS = 600_000  # ten minutes
# Autoscaling target: requests in flight per replica.
MAX_CONCURRENCY = 10_000
MAX_EPOCHS = 1_000_000
MAX_BATCH_SIZE = 1_048_576
MAX_TOKENS = 10_000_000
MAX_RETRIES = 20
MAX_COMMAND_LENGTH = 65_536

MAX_ENV_VARS = 128
MAX_ENV_NAME_LENGTH = 255
MAX_ENV_VALUE_LENGTH = 32_768
MAX_ENV_TOTAL_LENGTH = 131_072
ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")

MAX_LABELS = 32
MAX_LABEL_LENGTH = 253

MAX_VOLUMES = 32
VOLUME_KEYS = ("name", "mount_path", "claim_name", "host_path", "read_only")
# Kubernetes volume names are DNS labels; the manifests keep 40 characters of them.
VOLUME_NAME = re.compile(r"^[a-z0-9]([-a-z0-9]{0,38}[a-z0-9])?$")
CLAIM_NAME = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
MAX_CLAIM_NAME_LENGTH = 253
# Volumes the platform adds itself (drivers, /dev/shm) are named hcs-...
RESERVED_VOLUME_PREFIX = "hcs-"

# Environment variables the platform sets or that decide which devices and driver features a job gets.
# A task's env is applied last on some backends and read by container runtimes before the job starts,
# so these are refused at submission. Loader variables (LD_PRELOAD, LD_LIBRARY_PATH) stay allowed: they
# reach only the job's own processes (local jobs apply the env inside the sandbox, after privileges are
# dropped; containers and Slurm jobs get it as their environment), where the job's command could set
# them anyway.
RESERVED_ENV_PREFIXES = ("HCS_", "NVIDIA_REQUIRE_")
RESERVED_ENV_SUFFIXES = ("_VISIBLE_DEVICES",)
RESERVED_ENV_NAMES = (
    "NVIDIA_DRIVER_CAPABILITIES",
    "NVIDIA_DISABLE_REQUIRE",
    "NVIDIA_MIG_CONFIG_DEVICES",
    "NVIDIA_MIG_MONITOR_DEVICES",
)

# (field, lowest, highest) for every bounded number a submission sets.
# Idle autostop waits at most a week (docs/rules.md#idle-autostop).
MAX_IDLE_STOP_MINUTES = 7 * 24 * 60
# Scale to zero waits between the autoscaler's stable window doubled and a week (docs/tasks.md "Scale to zero").
MIN_SCALE_TO_ZERO_S = 30
MAX_SCALE_TO_ZERO_S = 7 * 24 * 3600
NUMBER_BOUNDS: tuple[tuple[str, Any, Any], ...] = (
    ("cpu", MIN_CPU, MAX_CPU),
    ("memory_gib", MIN_MEMORY_GIB, MAX_MEMORY_GIB),
    ("instances", 1, MAX_INSTANCES),
    ("elastic_min", 1, MAX_INSTANCES),
    ("elastic_max", 1, MAX_INSTANCES),
    ("autoscale_min", 1, MAX_INSTANCES),
    ("autoscale_max", 1, MAX_INSTANCES),
    ("autoscale_rps", 1, MAX_RPS),
    ("autoscale_concurrency", 1, MAX_CONCURRENCY),
    ("autoscale_latency_ms", 1, MAX_LATENCY_MS),
    ("epochs", 1, MAX_EPOCHS),
    ("batch_size", 1, MAX_BATCH_SIZE),
    ("max_tokens", 1, MAX_TOKENS),
    ("max_retries", 0, MAX_RETRIES),
    ("idle_stop_percent", 1, 100),
    ("idle_stop_minutes", 0, MAX_IDLE_STOP_MINUTES),
    ("scale_to_zero_after_s", MIN_SCALE_TO_ZERO_S, MAX_SCALE_TO_ZERO_S),
)
TEXT_FIELDS = (
    "name",
    "gpu_spec",
    "image",
    "command",
    "model_path",
    "checkpoint_path",
    "tensorboard_dir",
    "readiness_path",
)
# The system's programs and configuration, and the kernel's trees.
SYSTEM_TREES = (
    "/usr",
    "/bin",
    "/sbin",
    "/lib",
    "/lib32",
    "/lib64",
    "/libx32",
    "/etc",
    "/opt",
    "/sys",
    "/proc",
    "/dev",
)
# Trees a checkpoint directory may not be mounted over: the system's and the job's runtime.
CHECKPOINT_RESERVED = (*SYSTEM_TREES, "/run", "/tmp", "/var/tmp")


def in_trees(path: str, trees: tuple[str, ...]) -> bool:
    """Whether ``path`` is / or lies in (or is) one of ``trees``."""
    return path == "/" or any(path == tree or path.startswith(tree + "/") for tree in trees)


def task_errors(task) -> dict[str, str]:
    """Every rule of this module applied to a task about to be submitted: {field: message}.

    Values that are not of the field's type are left to the model's field validation, which reports them.
    """
    errors: dict[str, str] = {}
    for field, lowest, highest in NUMBER_BOUNDS:
        message = _number_error(getattr(task, field), lowest, highest)
        if message:
            errors[field] = message
    for low, high in (("elastic_min", "elastic_max"), ("autoscale_min", "autoscale_max")):
        low_value, high_value = getattr(task, low), getattr(task, high)
        if _is_number(low_value) and _is_number(high_value) and high not in errors and low_value > high_value:
            errors[high] = f"Expected at least {low} ({low_value}), got {high_value}."
    if task.kind != "dev_env":
        for field in ("idle_stop_percent", "idle_stop_minutes"):
            if getattr(task, field) is not None and field not in errors:
                errors[field] = "Idle autostop applies to dev environments only; leave it empty for this kind."
    message = _schedule_error(task)
    if message:
        errors["autoscale_schedule"] = message
    message = _scale_to_zero_error(task)
    if message and "scale_to_zero_after_s" not in errors:
        errors["scale_to_zero_after_s"] = message
    for field in TEXT_FIELDS:
        value = getattr(task, field)
        if isinstance(value, str) and "\x00" in value:
            errors[field] = "Expected text without NUL characters."
    if isinstance(task.command, str) and len(task.command) > MAX_COMMAND_LENGTH and "command" not in errors:
        errors["command"] = f"Expected a command of at most {MAX_COMMAND_LENGTH} characters, got {len(task.command)}."
    queue = task.queue if task.queue_id else None
    message = duration_error(task.expected_duration, queue.max_expected_duration if queue else None)
    if message:
        errors["expected_duration"] = message
    message = wall_time_error(task.wall_time, queue.max_wall_time if queue else None)
    if message:
        errors["wall_time"] = message
    for field, check in (("env", env_error), ("required_labels", labels_error)):
        message = check(getattr(task, field))
        if message:
            errors[field] = message
    message = checkpoint_path_error(task.checkpoint_path)
    if message and "checkpoint_path" not in errors:
        errors["checkpoint_path"] = message
    message = tensorboard_dir_error(task.tensorboard_dir)
    if message and "tensorboard_dir" not in errors:
        errors["tensorboard_dir"] = message
    message = secret_files_checkpoint_error(task.secret_refs, task.checkpoint_path)
    if message:
        errors["secret_refs"] = message
    message = readiness_path_error(task.readiness_path)
    if message:
        errors["readiness_path"] = message
    message = volumes_error(task.volumes, lambda: approved_host_paths(task.vdc_id))
    if message:
        errors["volumes"] = message
    return errors


def _schedule_error(task) -> str | None:
    """Scheduled minimums: well-formed entries, each within the service's replica bounds; inference only."""
    entries = task.autoscale_schedule
    if not entries:
        return None
    if task.kind != "inference":
        return "Scheduled minimums apply to inference services only; leave it empty for this kind."
    low, high = task.autoscale_min, task.autoscale_max
    if not (_is_number(low) and _is_number(high)):
        low = high = None
    return schedule.schedule_error(entries, low, high)


def _scale_to_zero_error(task) -> str | None:
    """Scale to zero: an inference service with a port, since a request through Connect is what wakes it."""
    if task.scale_to_zero_after_s is None:
        return None
    if task.kind != "inference":
        return "Expected an inference service: scale to zero applies to them only; leave it empty for this kind."
    if not task.port:
        return "Expected a port: a service scaled to zero is woken by a request to its port through Connect."
    return None


READINESS_PATH = re.compile(r"/[A-Za-z0-9._~!$&'()*+,;=:@%/?-]{0,254}")


def readiness_path_error(path) -> str | None:
    """A readiness path is the path (and query) of an HTTP GET on the service's port: no scheme, host or spaces."""
    if not path or not isinstance(path, str):
        return None
    if not READINESS_PATH.fullmatch(path):
        return f"Expected an HTTP path starting with / (e.g. /health), no spaces, at most 255 characters: {path!r}."
    return None


def checkpoint_path_error(path) -> str | None:
    """A checkpoint path is where the job finds its checkpoint directory: a plain absolute path outside the
    system's trees (it is mounted there on local and Kubernetes clusters), or empty for /hcs/checkpoint."""
    if not path or not isinstance(path, str):
        return None
    problem = path_problem(path)
    if problem:
        return f"{problem[0].upper()}{problem[1:]} (a directory such as /workspace/checkpoints)."
    if in_trees(path, CHECKPOINT_RESERVED):
        return f"Expected a directory outside /, {', '.join(CHECKPOINT_RESERVED)}, e.g. /workspace/checkpoints."
    return None


def _is_number(value) -> bool:
    return isinstance(value, int | Decimal | float) and not isinstance(value, bool)


def _number_error(value, lowest, highest) -> str | None:
    if value is None or not _is_number(value):
        return None
    if not lowest <= value <= highest:
        return f"Expected a value from {lowest} to {highest}, got {value}."
    return None


def duration_error(duration, longest: timedelta | None) -> str | None:
    """An expected duration must be positive and within the queue's longest (when the queue is known)."""
    if duration is None or not isinstance(duration, timedelta):
        return None
    if duration <= timedelta(0):
        return f"Expected a positive duration, e.g. 02:00:00, got {duration}."
    if longest is not None and duration > longest:
        return f"Expected at most the queue's longest expected duration, {longest}, got {duration}."
    return None


_DURATION_PART = re.compile(r"(\d+(?:\.\d+)?)\s*([dhms])", re.IGNORECASE)
_CLOCK = re.compile(r"^(?:(\d+)\s+)?(\d+):(\d{1,2})(?::(\d{1,2}))?$")
_UNIT_SECONDS = {"d": 86400, "h": 3600, "m": 60, "s": 1}


def is_unit_duration(text: str) -> bool:
    """Whether ``text`` is written with units (``2h``, ``1h30m``, ``90m``, ``1d``)."""
    return bool(_DURATION_PART.search(text)) and not _DURATION_PART.sub("", text).strip()


def parse_duration_text(text: str) -> timedelta:
    """A duration as people write it, the same for the pages and the API: ``2h``, ``1h30m``, ``90m``,
    ``HH:MM[:SS]`` or ``D HH:MM:SS``. Raises ValueError saying what was expected."""
    text = text.strip()
    clock = _CLOCK.match(text)
    if clock:
        days, hours, minutes, seconds = (int(g or 0) for g in clock.groups())
        if minutes > 59 or seconds > 59:
            raise ValueError(f"Expected minutes and seconds below 60, got {text!r}.")
        total = Decimal(((days * 24 + hours) * 60 + minutes) * 60 + seconds)
    else:
        if not is_unit_duration(text):
            raise ValueError(f"Expected a duration like 2h, 1h30m, 90m or 02:00:00, got {text!r}.")
        try:
            total = sum(Decimal(n) * _UNIT_SECONDS[unit.lower()] for n, unit in _DURATION_PART.findall(text))
        except InvalidOperation:
            total = Decimal(LONGEST_EXPECTED_DURATION.total_seconds()) + 1
    # Queues allow at most a year; anything far beyond cannot even be a timedelta.
    if total > Decimal(LONGEST_EXPECTED_DURATION.total_seconds()):
        raise ValueError(f"Expected at most {LONGEST_EXPECTED_DURATION.days} days, got {text!r}.")
    return timedelta(seconds=float(total))


def wall_time_error(wall_time, longest: timedelta | None) -> str | None:
    """A wall-time limit must be positive and within the queue's longest (366 days when it sets none)."""
    if wall_time is None or not isinstance(wall_time, timedelta):
        return None
    longest = longest or LONGEST_EXPECTED_DURATION
    if wall_time <= timedelta(0):
        return f"Expected a positive wall-time limit, e.g. 04:00:00, or none, got {wall_time}."
    if wall_time > longest:
        return f"Expected at most the queue's longest wall time, {longest}, got {wall_time}."
    return None


def reserved_env_name(name: str, visible_devices_env: Iterable[str]) -> bool:
    """Whether the platform owns variable ``name`` (case-insensitively: nobody needs both spellings)."""
    upper = name.upper()
    return (
        upper.startswith(RESERVED_ENV_PREFIXES)
        or upper.endswith(RESERVED_ENV_SUFFIXES)
        or upper in RESERVED_ENV_NAMES
        or upper in {v.upper() for v in visible_devices_env if v}
    )


def env_error(env) -> str | None:
    """Environment variables: an object of at most MAX_ENV_VARS exportable names to bounded text values."""
    if not isinstance(env, Mapping):
        return 'Expected environment variables as an object of strings, e.g. {"EPOCHS": "3"}.'
    if len(env) > MAX_ENV_VARS:
        return f"Expected at most {MAX_ENV_VARS} environment variables, got {len(env)}."
    total = 0
    for name, value in env.items():
        if not isinstance(name, str) or not ENV_NAME.match(name) or len(name) > MAX_ENV_NAME_LENGTH:
            return (
                f"Expected variable names of letters, digits and underscores, not starting with a digit and at most "
                f"{MAX_ENV_NAME_LENGTH} characters (e.g. EPOCHS), got {name!r}."
            )
        if not isinstance(value, str):
            return f'Expected a string value for {name}, e.g. "3", got {type(value).__name__}.'
        if "\x00" in value:
            return f"Expected the value of {name} without NUL characters."
        if len(value) > MAX_ENV_VALUE_LENGTH:
            return f"Expected the value of {name} to be at most {MAX_ENV_VALUE_LENGTH} characters, got {len(value)}."
        total += len(name) + len(value)
    if total > MAX_ENV_TOTAL_LENGTH:
        return f"Expected at most {MAX_ENV_TOTAL_LENGTH} characters of names and values in all, got {total}."
    visible = cluster_services.device_env_names() if env else ()
    reserved = sorted(name for name in env if reserved_env_name(name, visible))
    if reserved:
        return (
            f"{', '.join(reserved)}: reserved. The platform sets HCS_* variables, the device-visibility variables "
            "(*_VISIBLE_DEVICES) from the scheduler's placement and the container runtime's NVIDIA_* controls."
        )
    return None


def secret_env_error(secret_env, env) -> str | None:
    """Secret variables: the rules of ``env`` (names, sizes, reserved names), and no name also in ``env``."""
    message = env_error(secret_env)
    if message:
        return message
    shared = sorted(set(secret_env) & set(env)) if isinstance(env, Mapping) else []
    if shared:
        return f"{', '.join(shared)}: also in env; expected each variable either in env or in secret_env."
    return None


MAX_SECRET_REFS = 32
SECRET_REF_EXAMPLE = (
    '[{"secret": "HF_TOKEN", "env": "HF_TOKEN"}, {"secret": "REGISTRY", "file": "/run/secrets/registry"}]'
)
# Trees a secret file may not be placed in: the system's, and the places of its state.
SECRET_FILE_RESERVED = (*SYSTEM_TREES, "/boot", "/root", "/var/lib", "/var/run")

# The platform's own files in a job's tree: its environment and libraries (/run/hcs-*), its checkpoints (/hcs).
SECRET_FILE_PLATFORM = "/run/hcs"
# Directories every job gets (its scratch space and /run): a secret file goes in them or beside them, never in
# their place or in the place of a directory above them (docs/security.md "Project secrets").
JOB_DIRECTORIES = ("/tmp", "/var/tmp", "/run")


def _replaces_directory(path: str, directory: str) -> bool:
    """Whether a file at ``path`` would stand where ``directory`` is, or where a directory above it is."""
    return directory == path or directory.startswith(path.rstrip("/") + "/")


def secret_refs_error(refs, env, secret_env) -> str | None:
    """Project secrets a task refers to: a list of {"secret": NAME, "env": VAR} or {"secret": NAME, "file": PATH}.

    Variables follow the rules of ``env`` and are in neither ``env`` nor ``secret_env``; files are plain absolute
    paths outside the system's trees, each used once and with a file name of its own (Slurm puts them side by
    side in one directory). Whether the secrets exist is the submit's check.
    """
    if not isinstance(refs, list):
        return f"Expected a list of secret references, e.g. {SECRET_REF_EXAMPLE}."
    if len(refs) > MAX_SECRET_REFS:
        return f"Expected at most {MAX_SECRET_REFS} secret references, got {len(refs)}."
    variables: set[str] = set()
    files: set[str] = set()
    file_names: set[str] = set()
    taken = set(env) if isinstance(env, Mapping) else set()
    taken |= set(secret_env) if isinstance(secret_env, Mapping) else set()
    for number, ref in enumerate(refs, start=1):
        where = f"Reference {number}"
        if not isinstance(ref, Mapping) or set(ref) not in ({"secret", "env"}, {"secret", "file"}):
            return f"{where}: expected an object with secret and either env or file, e.g. {SECRET_REF_EXAMPLE[1:-1]}."
        name = ref["secret"]
        if not isinstance(name, str) or not ENV_NAME.match(name) or len(name) > 64:
            return f"{where}: expected a secret name of letters, digits and underscores (e.g. HF_TOKEN), got {name!r}."
        if "env" in ref:
            variable = ref["env"]
            message = env_error({variable: ""}) if isinstance(variable, str) else None
            if not isinstance(variable, str) or message:
                return f"{where}: env: {message or f'expected a variable name, got {variable!r}'}"
            if variable in taken or variable in variables:
                where_else = "env or secret_env" if variable in taken else "another reference"
                return f"{where}: the variable {variable} is also set by {where_else}; expected each variable once."
            variables.add(variable)
            continue
        path = ref["file"]
        problem = path_problem(path)
        if problem:
            return f"{where}: file: {problem}."
        if in_trees(path, SECRET_FILE_RESERVED):
            return (
                f"{where}: file: expected a path outside {', '.join(SECRET_FILE_RESERVED)}, "
                f"e.g. /run/secrets/{name.lower()}; got {path}."
            )
        if ":" in path:
            return f"{where}: file: expected a path without ':', got {path!r}."
        if path.startswith(SECRET_FILE_PLATFORM) or path == "/hcs" or path.startswith("/hcs/"):
            return f"{where}: file: /run/hcs* and /hcs are the platform's (job environment, checkpoints); got {path}."
        if taken := next((d for d in JOB_DIRECTORIES if _replaces_directory(path, d)), None):
            return (
                f"{where}: file: {path} would replace the job's directory {taken}; expected a file in or beside "
                f"it, e.g. {taken}/{name.lower()}."
            )
        file_name = posixpath.basename(path)
        if path in files or file_name in file_names:
            return f"{where}: file: {path} has the same file name as another secret file; expected distinct names."
        if other := next((f for f in files if _replaces_directory(path, f) or _replaces_directory(f, path)), None):
            return f"{where}: file: {path} and {other} cannot both be files (one would be a directory of the other)."
        files.add(path)
        file_names.add(file_name)
    return None


def tensorboard_dir_error(path) -> str | None:
    """A TensorBoard log dir: a plain path relative to the job's working directory, or an absolute one outside the
    system's trees (a writable directory is mounted there on local clusters, like the checkpoint directory)."""
    if not path or not isinstance(path, str):
        return None
    if not path.startswith("/"):
        if posixpath.normpath(path) != path or path == ".." or path.startswith("../"):
            return f"Expected a plain path without '..' or '.', e.g. tb or /hcs/checkpoint/tb; got {path!r}."
        return None
    problem = path_problem(path)
    if problem:
        return f"{problem[0].upper()}{problem[1:]} (a directory such as /hcs/checkpoint/tb)."
    if in_trees(path, CHECKPOINT_RESERVED):
        return f"Expected a directory outside /, {', '.join(CHECKPOINT_RESERVED)}, e.g. /hcs/checkpoint/tb."
    return None


def secret_files_checkpoint_error(refs, checkpoint_path) -> str | None:
    """A task's secret files stay out of its checkpoint directory (``checkpoint_path``, mounted on local and
    Kubernetes clusters): one inside would leave a file in checkpoints kept across attempts, one at or above it
    would stand where the directory is mounted."""
    if not checkpoint_path or not isinstance(checkpoint_path, str) or not isinstance(refs, list):
        return None
    for number, ref in enumerate(refs, start=1):
        path = ref.get("file") if isinstance(ref, Mapping) else None
        if not isinstance(path, str):
            continue
        if _replaces_directory(path, checkpoint_path) or path.startswith(checkpoint_path.rstrip("/") + "/"):
            return (
                f"Reference {number}: file: {path} is at, above or in the checkpoint directory {checkpoint_path}; "
                "expected a path outside it, e.g. /run/secrets/<name>."
            )
    return None


def labels_error(labels) -> str | None:
    """Required cluster labels: an object of at most MAX_LABELS string keys and string values."""
    expected = 'Expected labels as an object of strings, e.g. {"gpu": "a100"}'
    if not isinstance(labels, Mapping):
        return expected + "."
    if len(labels) > MAX_LABELS:
        return f"Expected at most {MAX_LABELS} labels, got {len(labels)}."
    for key, value in labels.items():
        if not isinstance(key, str) or not isinstance(value, str) or not key:
            return f"{expected}; got {key!r}: {value!r}."
        if "\x00" in key + value or len(key) > MAX_LABEL_LENGTH or len(value) > MAX_LABEL_LENGTH:
            return f"Expected label keys and values of at most {MAX_LABEL_LENGTH} characters without NUL, got {key!r}."
    return None


def approved_host_paths(vdc_id: int | None) -> dict[str, list[str]]:
    """The approved host path prefixes of each enabled cluster of the VDC, by cluster name."""
    if vdc_id is None:
        return {}
    clusters = Cluster.objects.filter(vdc_id=vdc_id, enabled=True).order_by("name")
    return {name: list(paths or []) for name, paths in clusters.values_list("name", "allowed_host_paths")}


def volumes_error(volumes, approved) -> str | None:
    """Volumes: a list of objects with a name, an absolute mount path and one source.

    The source is a volume claim (``claim_name``) or a node directory (``host_path``) that every enabled
    cluster of the VDC approved, since the task may land on any of them. ``approved`` is called only when
    a host path needs checking and returns :func:`approved_host_paths`.
    """
    example = '[{"name": "data", "mount_path": "/data", "claim_name": "datasets"}]'
    if not isinstance(volumes, list):
        return f"Expected a list of volumes, e.g. {example}."
    if len(volumes) > MAX_VOLUMES:
        return f"Expected at most {MAX_VOLUMES} volumes, got {len(volumes)}."
    names, mounts = set(), set()
    clusters = None
    for number, volume in enumerate(volumes, start=1):
        where = f"Volume {number}"
        if not isinstance(volume, Mapping):
            return f"{where}: expected an object such as {example[1:-1]}, got {volume!r}."
        unknown = sorted(str(k) for k in volume if k not in VOLUME_KEYS)
        if unknown:
            return f"{where}: unknown key(s) {', '.join(unknown)}; expected {', '.join(VOLUME_KEYS)}."
        name = volume.get("name")
        if not isinstance(name, str) or not VOLUME_NAME.match(name) or name.startswith(RESERVED_VOLUME_PREFIX):
            return (
                f"{where}: expected a name of at most 40 lowercase letters, digits and '-', not starting with "
                f"{RESERVED_VOLUME_PREFIX!r} (e.g. data), got {name!r}."
            )
        if name in names:
            return f"{where}: the name {name!r} is used twice."
        names.add(name)
        mount = volume.get("mount_path")
        problem = path_problem(mount)
        if problem is None and (mount == "/" or ":" in mount):
            problem = f"expected a directory other than / and without ':', got {mount!r}"
        if problem:
            return f"{where}: mount_path: {problem}."
        if mount in mounts:
            return f"{where}: the mount path {mount} is used twice."
        mounts.add(mount)
        if "read_only" in volume and not isinstance(volume["read_only"], bool):
            return f"{where}: expected read_only to be true or false, got {volume['read_only']!r}."
        claim, host = volume.get("claim_name"), volume.get("host_path")
        if (claim is None) == (host is None):
            return f"{where}: expected exactly one source, claim_name (a volume claim) or host_path (a node directory)."
        if claim is not None:
            if not isinstance(claim, str) or len(claim) > MAX_CLAIM_NAME_LENGTH or not CLAIM_NAME.match(claim):
                return f"{where}: expected claim_name to be a volume claim name such as datasets, got {claim!r}."
            continue
        problem = path_problem(host)
        if problem:
            return f"{where}: host_path: {problem}."
        clusters = approved() if clusters is None else clusters
        refusing = [cluster for cluster, prefixes in clusters.items() if not is_approved(host, prefixes)]
        if refusing or not clusters:
            return (
                f"{where}: expected a host path that every enabled cluster of the VDC approved; {host} is not "
                f"approved on {', '.join(refusing) or 'any: the VDC has no enabled cluster'} (admins approve host "
                "path prefixes per cluster)."
            )
    return None
