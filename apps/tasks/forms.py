"""Forms of the user pages: one create form per task kind, and the queue admin's policy form.

The forms only shape input; ``submit_task`` decides what is valid, and its per-field messages
(the GPU spec parser's included) are put back next to the fields they are about.
"""

from __future__ import annotations

import json
from datetime import timedelta
from decimal import Decimal

from django import forms
from django.core.exceptions import PermissionDenied, ValidationError

from apps.clusters.models import Cluster
from apps.core.forms import SecretTextarea
from apps.queues.models import TaskQueue
from apps.tasks import schedule
from apps.tasks import validation as limits
from apps.tasks.choices import Framework, IDEType, TaskKind
from apps.tasks.models import Task
from apps.tasks.services import SUBMIT_FIELDS, submit_task
from apps.vdc import policy
from apps.vdc.choices import QueuePolicy
from apps.vdc.models import VDC, Project


class DurationInput(forms.CharField):
    """A duration written as ``2h``, ``1h30m``, ``90m`` or ``HH:MM[:SS]`` (``D HH:MM:SS`` for days)."""

    def to_python(self, value) -> timedelta | None:
        text = (super().to_python(value) or "").strip()
        if not text:
            return None
        try:
            return limits.parse_duration_text(text)
        except ValueError as exc:
            raise ValidationError(str(exc))

    def prepare_value(self, value):
        if isinstance(value, timedelta):
            total = int(value.total_seconds())
            return f"{total // 3600:02d}:{total % 3600 // 60:02d}:{total % 60:02d}"
        return value


def parse_env(text: str) -> dict[str, str]:
    """``KEY=VALUE`` lines into a dict; blank lines and ``#`` comments are skipped.

    Only the line format is checked here; the names and values meet ``Task.clean`` like the API's.
    """
    env: dict[str, str] = {}
    for number, line in enumerate(text.splitlines(), start=1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        key, sep, value = line.partition("=")
        if not sep or not key.strip():
            raise ValidationError(f"Line {number}: expected KEY=VALUE with a name like EPOCHS, got {line!r}.")
        env[key.strip()] = value.strip()
    return env


def parse_volumes(text: str) -> list[dict]:
    """``SOURCE:/mount/path[:ro]`` lines: a SOURCE starting with / is a host path, else a volume claim name."""
    volumes = []
    for number, line in enumerate(text.splitlines(), start=1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        parts = line.split(":")
        read_only = len(parts) == 3 and parts[2] == "ro"
        if len(parts) not in (2, 3) or (len(parts) == 3 and not read_only) or not parts[1].startswith("/"):
            raise ValidationError(
                f"Line {number}: expected SOURCE:/mount/path or SOURCE:/mount/path:ro "
                f"(SOURCE a /host/path or a volume claim name), got {line!r}."
            )
        source, mount = parts[0].strip(), parts[1].strip()
        if not source:
            raise ValidationError(f"Line {number}: expected a source before the colon, got {line!r}.")
        volume = {"name": f"vol-{len(volumes) + 1}", "mount_path": mount, "read_only": read_only}
        volume["host_path" if source.startswith("/") else "claim_name"] = source
        volumes.append(volume)
    return volumes


def parse_secret_refs(text: str) -> list[dict]:
    """``TARGET=SECRET`` lines into secret references: a TARGET starting with / is a file path, else a variable.

    Only the line format is checked here; ``submit_task`` checks the names, the paths and that the secrets exist.
    """
    refs = []
    for number, line in enumerate(text.splitlines(), start=1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        target, sep, secret = (part.strip() for part in line.partition("="))
        if not sep or not target or not secret:
            raise ValidationError(
                f"Line {number}: expected VARIABLE=SECRET or /file/path=SECRET (SECRET a secret of the project), "
                f"got {line!r}."
            )
        refs.append({"secret": secret, "file" if target.startswith("/") else "env": target})
    return refs


def _lines(pairs) -> str:
    return "\n".join(f"{key}={value}" for key, value in pairs)


def secret_ref_lines(refs: list[dict]) -> str:
    return _lines((ref.get("file") or ref.get("env") or ref["secret"], ref["secret"]) for ref in refs or [])


def volume_lines(volumes: list[dict]) -> str:
    lines = []
    for volume in volumes or []:
        source = volume.get("host_path") or volume.get("claim_name", "")
        lines.append(f"{source}:{volume.get('mount_path', '')}{':ro' if volume.get('read_only') else ''}")
    return "\n".join(lines)


class QueueChoiceField(forms.ModelChoiceField):
    def label_from_instance(self, obj: TaskQueue) -> str:
        closed = " - closed" if not obj.is_open else ""
        return f"{obj.vdc.name} / {obj.name} ({obj.get_priority_class_display().lower()}, {obj.policy}){closed}"


class ClusterChoiceField(forms.ModelChoiceField):
    def label_from_instance(self, obj: Cluster) -> str:
        return f"{obj.vdc.name} / {obj.name} ({obj.get_cluster_type_display()})"


class TaskForm(forms.Form):
    """Fields every kind shares; subclasses add their kind's settings and name the page's sections."""

    task_kind: str = ""
    kind_fields: tuple[str, ...] = ()
    kind_title = "Settings"
    basic_fields: tuple[str, ...] = ("name", "project")
    scheduling_fields = (
        "vdc",
        "preferred_cluster",
        "queue",
        "preemptible",
        "expected_duration",
        "wall_time",
        "gpu_spec",
        "cpu",
        "memory_gib",
        "instances",
    )
    advanced_fields = ("command", "env", "secret_env", "secret_refs", "volumes")

    name = forms.CharField(max_length=128)
    project = forms.ModelChoiceField(queryset=Project.objects.none())
    vdc = forms.ModelChoiceField(queryset=VDC.objects.none(), label="VDC (availability zone)")
    preferred_cluster = ClusterChoiceField(
        queryset=Cluster.objects.none(),
        required=False,
        label="Preferred cluster / pool",
        empty_label="Any cluster of the VDC",
        help_text="The scheduler tries it first; any fitting cluster will do.",
    )
    queue = QueueChoiceField(queryset=TaskQueue.objects.none())
    preemptible = forms.BooleanField(required=False, initial=True)
    expected_duration = DurationInput(
        required=False,
        help_text="An estimate, e.g. 2h, 1h30m or 02:00:00: it drives queue estimates and, in medium queues (where it "
        "is required), the guaranteed window. It never stops the job.",
    )
    wall_time = DurationInput(
        required=False,
        label="Wall-time limit",
        help_text="Optional: the job is stopped once it has run this long (empty: the queue's default, if any).",
    )
    gpu_spec = forms.CharField(
        max_length=128,
        required=False,
        label="GPUs",
        help_text="e.g. 1(A100), 2(A100|H100), 0.5(vgpu), 1(16G,50%), vram=16Gi,tflops-fp16=100; empty for none.",
    )
    cpu = forms.DecimalField(
        min_value=limits.MIN_CPU,
        max_value=limits.MAX_CPU,
        max_digits=8,
        decimal_places=2,
        initial=Decimal("1"),
        label="CPU cores",
    )
    memory_gib = forms.DecimalField(
        min_value=limits.MIN_MEMORY_GIB,
        max_value=limits.MAX_MEMORY_GIB,
        max_digits=10,
        decimal_places=2,
        initial=2,
        label="Memory (GiB)",
    )
    instances = forms.IntegerField(
        min_value=1, max_value=limits.MAX_INSTANCES, initial=1, help_text="Started all at once on one cluster (gang)."
    )
    image = forms.CharField(max_length=255, required=False)
    command = forms.CharField(
        required=False,
        widget=forms.Textarea(attrs={"rows": 3}),
        help_text="Runs in a shell. The settings above reach it as variables: $HCS_EPOCHS, $HCS_BATCH_SIZE, "
        "$HCS_MODEL_PATH, $HCS_CHECKPOINT_DIR, $HCS_PORT, $HCS_MAX_TOKENS, $HCS_TEMPERATURE ... (only those set).",
    )
    env = forms.CharField(
        required=False,
        label="Environment variables",
        widget=forms.Textarea(attrs={"rows": 3}),
        help_text="One KEY=VALUE per line.",
    )
    secret_env = forms.CharField(
        required=False,
        label="Secret variables",
        widget=SecretTextarea(attrs={"rows": 2}),
        help_text="One KEY=VALUE per line, for tokens and passwords: stored encrypted, given to the job, "
        "never shown again.",
    )
    secret_refs = forms.CharField(
        required=False,
        label="Project secrets",
        widget=forms.Textarea(attrs={"rows": 2}),
        help_text="One VARIABLE=SECRET or /file/path=SECRET per line (e.g. HF_TOKEN=HF_TOKEN, "
        "/run/secrets/registry=REGISTRY): the project's secret of that name, given to the job as a variable "
        "or an owner-read-only file. Only names are stored with the task.",
    )
    volumes = forms.CharField(
        required=False,
        widget=forms.Textarea(attrs={"rows": 2}),
        help_text="One SOURCE:/mount/path[:ro] per line; SOURCE is a /host/path or a volume claim name.",
    )
    # Fields of a task file this form has no input for (required_labels, scaling), kept as they were when a task
    # is submitted again (docs/tasks.md, "Task files").
    carried = forms.CharField(required=False, widget=forms.HiddenInput())

    def __init__(self, *args, user, **kwargs):
        super().__init__(*args, **kwargs)
        self.user = user
        if policy.has_platform_perm(user, policy.SUBMIT_TASK):
            self.fields["project"].queryset = policy.visible_projects(user)
        else:
            self.fields["project"].queryset = Project.objects.filter(
                pk__in=policy.member_project_ids(user, policy.WRITE_ROLES)
            )
        vdcs = policy.visible_vdcs(user).filter(enabled=True)
        self.fields["vdc"].queryset = vdcs
        self.fields["queue"].queryset = TaskQueue.objects.filter(vdc__in=vdcs).select_related("vdc")
        self.fields["preferred_cluster"].queryset = Cluster.objects.filter(vdc__in=vdcs, enabled=True).select_related(
            "vdc"
        )
        default = VDC.default()
        if default is not None:
            self.fields["vdc"].initial = default.pk

    def clean_env(self) -> dict[str, str]:
        return parse_env(self.cleaned_data.get("env") or "")

    def clean_secret_env(self) -> dict[str, str]:
        return parse_env(self.cleaned_data.get("secret_env") or "")

    def clean_secret_refs(self) -> list[dict]:
        return parse_secret_refs(self.cleaned_data.get("secret_refs") or "")

    def clean_volumes(self) -> list[dict]:
        return parse_volumes(self.cleaned_data.get("volumes") or "")

    def clean_carried(self) -> dict:
        text = self.cleaned_data.get("carried") or ""
        try:
            carried = json.loads(text) if text else {}
        except ValueError:
            carried = None
        if not isinstance(carried, dict) or not set(carried) <= self.carried_fields():
            raise ValidationError(f"Expected a JSON object of {', '.join(sorted(self.carried_fields()))}.")
        return carried

    def carried_fields(self) -> set[str]:
        """Submission fields this form has no input for."""
        return set(SUBMIT_FIELDS) - set(self.fields) - {"kind"}

    def initial_from_file(self, data: dict) -> dict:
        """The form's initial values from a task file's fields (the API's names and shapes): what "Submit again"
        and an uploaded task file show. Secret variable values are never put back into a page."""

        def pick(field: str, value):
            choices = self.fields[field].queryset
            if isinstance(value, int) and not isinstance(value, bool):
                return choices.filter(pk=value).values_list("pk", flat=True).first()
            if isinstance(value, str) and field == "queue":
                vdc = initial.get("vdc") or self.fields["vdc"].initial
                return choices.filter(name=value, vdc=vdc).values_list("pk", flat=True).first()
            if isinstance(value, str):
                return choices.filter(name=value).values_list("pk", flat=True).first()
            return None

        initial: dict = {}
        for field in ("project", "vdc", "queue"):
            if data.get(field) is not None:
                initial[field] = pick(field, data[field])
        preferred = data.get("preferred_clusters") or []
        if preferred:
            initial["preferred_cluster"] = pick("preferred_cluster", preferred[0])
        text = {
            "env": lambda v: _lines((v or {}).items()),
            "secret_refs": secret_ref_lines,
            "volumes": volume_lines,
            "autoscale_schedule": lambda v: "\n".join(
                schedule.format_entry(e) if isinstance(e, dict) else str(e) for e in v or ()
            ),
        }
        carried = {}
        for field, value in data.items():
            if field in ("project", "vdc", "queue", "preferred_clusters", "secret_env") or value is None:
                continue
            if field in text and field in self.fields:
                initial[field] = text[field](value)
            elif field in self.fields:
                initial[field] = value
            elif field in self.carried_fields():
                carried[field] = value
        if carried:
            initial["carried"] = json.dumps(carried, sort_keys=True)
        return {key: value for key, value in initial.items() if value is not None}

    def carried_summary(self) -> str:
        """The carried fields as the page names them, e.g. ``required_labels: {"zone": "east"}``."""
        value = self["carried"].value() or ""
        try:
            carried = json.loads(value) if value else {}
        except ValueError:
            return ""
        if not isinstance(carried, dict):
            return ""
        return "; ".join(f"{key}: {json.dumps(val)}" for key, val in sorted(carried.items()))

    def sections(self) -> list[tuple[str, list]]:
        """(title, bound fields) in page order."""
        return [
            ("Basic settings", [self[f] for f in self.basic_fields]),
            ("Resources and scheduling", [self[f] for f in self.scheduling_fields]),
            (self.kind_title, [self[f] for f in self.kind_fields]),
            ("Advanced", [self[f] for f in self.advanced_fields]),
        ]

    def submission_fields(self) -> dict:
        data = self.cleaned_data
        fields = {
            name: data[name]
            for name in (
                "name",
                "cpu",
                "memory_gib",
                "instances",
                "expected_duration",
                "wall_time",
                "preemptible",
                "image",
                "command",
                "env",
                "volumes",
                "secret_refs",
                *self.kind_fields,
            )
            if name in data
        }
        fields["gpu_spec"] = (data.get("gpu_spec") or "").strip()
        fields["kind"] = self.task_kind
        return {**(data.get("carried") or {}), **fields}

    def submit(self) -> Task | None:
        """Submit through the service; its errors land on the form's fields (None when there were any)."""
        data = self.cleaned_data
        cluster = data.get("preferred_cluster")
        if cluster is not None and cluster.vdc_id != data["vdc"].pk:
            self.add_error("preferred_cluster", f"Expected a cluster of VDC {data['vdc']}; {cluster.name} is not.")
            return None
        try:
            return submit_task(
                self.user,
                project=data["project"],
                queue=data["queue"],
                vdc=data["vdc"],
                preferred_clusters=[cluster] if cluster else (),
                secret_env=data.get("secret_env") or {},
                **self.submission_fields(),
            )
        except PermissionDenied as exc:
            self.add_error("project", str(exc))
        except ValidationError as exc:
            for field, messages in exc.message_dict.items():
                target = field if field in self.fields else None
                self.add_error(target, messages if target else [f"{field}: {m}" for m in messages])
        return None


class DevEnvForm(TaskForm):
    task_kind = TaskKind.DEV_ENV
    kind_title = "Idle autostop"
    basic_fields = ("name", "project", "ide_type", "image")
    kind_fields = ("idle_stop_percent", "idle_stop_minutes")

    ide_type = forms.ChoiceField(choices=IDEType.choices, label="IDE type")
    idle_stop_percent = forms.IntegerField(
        min_value=1,
        max_value=100,
        required=False,
        label="Idle below GPU %",
        help_text="GPU utilisation under which the environment counts as idle (empty: the project's default).",
    )
    idle_stop_minutes = forms.IntegerField(
        min_value=0,
        max_value=limits.MAX_IDLE_STOP_MINUTES,
        required=False,
        label="Stop after idle minutes",
        help_text="Stopped once idle this long, with a warning 10 min before, as a stop by hand stops it "
        "(nothing is deleted). 0: never; empty: the project's default.",
    )

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.fields["image"].required = True
        self.fields["image"].initial = "jupyter/pytorch-notebook:latest"
        self.fields["instances"].widget = forms.HiddenInput()

    def sections(self) -> list[tuple[str, list]]:
        return [s for s in super().sections() if s[1]]

    def submission_fields(self) -> dict:
        return {**super().submission_fields(), "ide_type": self.cleaned_data["ide_type"]}


class TrainingForm(TaskForm):
    task_kind = TaskKind.TRAINING
    kind_title = "Training settings"
    basic_fields = ("name", "project", "kind", "framework", "model_path", "image")
    kind_fields = ("epochs", "batch_size", "checkpoint_path", "tensorboard_dir", "max_retries")
    scheduling_fields = (*TaskForm.scheduling_fields, "elastic_min", "elastic_max")

    kind = forms.ChoiceField(
        choices=[(TaskKind.TRAINING, TaskKind.TRAINING.label), (TaskKind.FINE_TUNING, TaskKind.FINE_TUNING.label)],
        label="Job type",
    )
    framework = forms.ChoiceField(choices=Framework.choices)
    model_path = forms.CharField(max_length=255, required=False, help_text="e.g. /models/llama-7b or s3://bucket/m")
    epochs = forms.IntegerField(min_value=1, max_value=limits.MAX_EPOCHS, required=False)
    batch_size = forms.IntegerField(min_value=1, max_value=limits.MAX_BATCH_SIZE, required=False)
    checkpoint_path = forms.CharField(
        max_length=255,
        required=False,
        help_text="Your job finds its checkpoint directory in $HCS_CHECKPOINT_DIR (here, or /hcs/checkpoint when "
        "empty). It survives preemption and requeues on the same cluster: save there and resume from it.",
    )
    tensorboard_dir = forms.CharField(
        max_length=255,
        required=False,
        label="TensorBoard log dir",
        help_text="Write TensorBoard logs here ($HCS_TENSORBOARD_DIR) and serve TensorBoard on $HCS_TENSORBOARD_PORT "
        "(6006); the task page links it while the job runs.",
    )
    max_retries = forms.IntegerField(min_value=0, max_value=limits.MAX_RETRIES, initial=0, label="Retries on failure")
    elastic_min = forms.IntegerField(
        min_value=1,
        max_value=limits.MAX_INSTANCES,
        required=False,
        label="Elastic: fewest ranks",
        help_text="With the most ranks below, the job starts with as few as this and grows when cards free up "
        "(on clusters that resize jobs); empty for a fixed size.",
    )
    elastic_max = forms.IntegerField(
        min_value=1,
        max_value=limits.MAX_INSTANCES,
        required=False,
        label="Elastic: most ranks",
        help_text="The job never runs more ranks than this.",
    )

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.fields["instances"].help_text = "Distributed ranks (DDP), started all at once on one cluster."

    def submission_fields(self) -> dict:
        data = self.cleaned_data
        extra = {"kind": data["kind"], "framework": data["framework"], "model_path": data.get("model_path", "")}
        extra.update({name: data[name] for name in ("elastic_min", "elastic_max") if data.get(name) is not None})
        return {**super().submission_fields(), **extra}


class InferenceForm(TaskForm):
    task_kind = TaskKind.INFERENCE
    kind_title = "Inference settings"
    basic_fields = ("name", "project", "model_path", "port", "image")
    kind_fields = (
        "readiness_path",
        "max_tokens",
        "temperature",
        "autoscale_min",
        "autoscale_max",
        "autoscale_cpu_percent",
        "autoscale_gpu_percent",
        "autoscale_memory_percent",
        "autoscale_rps",
        "autoscale_concurrency",
        "autoscale_latency_ms",
        "autoscale_predictive",
        "autoscale_schedule",
        "scale_to_zero_after_s",
    )

    model_path = forms.CharField(max_length=255, help_text="e.g. /models/qwen-7b-chat")
    port = forms.IntegerField(min_value=1, max_value=65535, initial=8000, label="API port")
    max_tokens = forms.IntegerField(min_value=1, max_value=limits.MAX_TOKENS, required=False, initial=2048)
    temperature = forms.DecimalField(min_value=0, max_value=2, decimal_places=2, required=False, initial="0.7")
    autoscale_min = forms.IntegerField(
        min_value=1, max_value=limits.MAX_INSTANCES, required=False, label="Autoscaling: min replicas"
    )
    autoscale_max = forms.IntegerField(
        min_value=1, max_value=limits.MAX_INSTANCES, required=False, label="Autoscaling: max replicas"
    )
    autoscale_cpu_percent = forms.IntegerField(
        min_value=1, max_value=100, required=False, label="Autoscaling: target CPU %"
    )
    autoscale_gpu_percent = forms.IntegerField(
        min_value=1, max_value=100, required=False, label="Autoscaling: target GPU %"
    )
    autoscale_memory_percent = forms.IntegerField(
        min_value=1, max_value=100, required=False, label="Autoscaling: target memory %"
    )
    autoscale_rps = forms.IntegerField(
        min_value=1,
        max_value=limits.MAX_RPS,
        required=False,
        label="Autoscaling: target requests/s per replica",
        help_text="Requests per second one replica should serve, counted at the portal's Connect proxy.",
    )
    autoscale_concurrency = forms.IntegerField(
        min_value=1,
        max_value=limits.MAX_CONCURRENCY,
        required=False,
        label="Autoscaling: target requests in flight per replica",
        help_text="Requests one replica should work on at a time (concurrency), timed at the portal's Connect "
        "proxy; suits slow requests such as streamed completions.",
    )
    autoscale_latency_ms = forms.IntegerField(
        min_value=1,
        max_value=limits.MAX_LATENCY_MS,
        required=False,
        label="Autoscaling: target latency (ms)",
        help_text="Mean time a request should take, timed at the portal's Connect proxy; more replicas while "
        "requests take longer (set it above what an idle replica takes).",
    )
    autoscale_predictive = forms.BooleanField(
        required=False,
        label="Autoscaling: predictive",
        help_text="Also scale ahead of the request rate forecast from the service's history (needs a requests/s "
        "target; never scales down on a forecast alone).",
    )
    autoscale_schedule = forms.CharField(
        required=False,
        widget=forms.Textarea(attrs={"rows": 3, "placeholder": "Mon-Fri 08:00-20:00 4 Europe/Berlin"}),
        label="Autoscaling: scheduled minimums",
        help_text="One entry a line: days, from-to (HH:MM), at least this many replicas, and a time zone (UTC "
        "when left out), e.g. Mon-Fri 08:00-20:00 4 Europe/Berlin. Within min..max replicas.",
    )
    scale_to_zero_after_s = forms.IntegerField(
        min_value=limits.MIN_SCALE_TO_ZERO_S,
        max_value=limits.MAX_SCALE_TO_ZERO_S,
        required=False,
        label="Scale to zero after (s)",
        help_text="Release the cards after this many seconds without a request through Connect; the next request "
        "wakes the service and waits for it (its cold start). Empty: never.",
    )
    readiness_path = forms.CharField(
        max_length=255,
        required=False,
        label="Readiness path",
        help_text="e.g. /health: a replica counts as ready, and gets requests, once this answers 2xx on the API port.",
    )

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.fields["instances"].label = "Replicas"
        self.fields["instances"].help_text = "Instances behind the service (load balanced)."
        self.fields["image"].initial = "vllm/vllm-openai:latest"

    def clean_autoscale_schedule(self) -> list[dict]:
        entries = []
        for number, line in enumerate((self.cleaned_data.get("autoscale_schedule") or "").splitlines(), start=1):
            if not line.strip():
                continue
            try:
                entries.append(schedule.parse_line(line))
            except ValueError as exc:
                raise ValidationError(f"Line {number}: {exc}") from None
        return entries

    def submission_fields(self) -> dict:
        data = self.cleaned_data
        return {**super().submission_fields(), "model_path": data["model_path"], "port": data["port"]}


class QueuePolicyForm(forms.Form):
    policy = forms.ChoiceField(choices=QueuePolicy.choices)
