"""Admin forms of the clusters app: write-only credentials, labels, device links and aliases as text.

They have no Meta: the ModelAdmin that uses one supplies the model and the fields of its fieldsets.
"""

from __future__ import annotations

from django import forms
from django.core.exceptions import ValidationError

from apps.clusters.choices import LinkType, Sharing
from apps.clusters.models import Cluster
from apps.clusters.partitions import (
    MAX_TIME_SLICE_REPLICAS,
    SharingError,
    check_device_sharing,
    parse_mig_layout,
)
from apps.core.forms import CommaListField, KeyValueField, LinesField, SecretTextarea

# The keys apps.clusters.backends reads; the Slurm JWT is stored under "token" like the Kubernetes token.
SECRET_FIELDS = ("token", "user", "kubeconfig", "ca_cert")
VERIFY_CHOICES = (
    ("", "Keep as stored"),
    ("true", "Verify"),
    ("false", "Do not verify (throw-away test clusters only)"),
)


class ClusterAdminForm(forms.ModelForm):
    """Cluster settings plus write-only credentials, merged key by key into what is stored.

    Secrets are never rendered, not even after a failed save, and the encrypted value is not a form field.
    """

    labels = KeyValueField(example="region=north")
    allowed_host_paths = LinesField(
        label="Allowed host paths",
        help_text="One node directory per line, e.g. /data: tasks may mount it or anything below it as a host "
        "path volume. Empty: no host paths.",
    )
    webhook_namespaces = LinesField(
        label="Webhook namespaces",
        help_text="Kubernetes: one namespace per line, e.g. team-a: the admission webhook injects the vendor "
        "runtime into every pod created there. Empty: none.",
    )
    token = forms.CharField(
        required=False,
        label="Token / JWT",
        widget=forms.PasswordInput(render_value=False),
        help_text="Kubernetes service-account bearer token, or the slurmrestd JWT.",
    )
    user = forms.CharField(
        required=False,
        widget=forms.PasswordInput(render_value=False),
        help_text="Slurm: the user slurmrestd acts as.",
    )
    kubeconfig = forms.CharField(
        required=False,
        widget=SecretTextarea(attrs={"rows": 4, "cols": 60}),
        help_text="Kubernetes: a whole kubeconfig (YAML); it wins over endpoint + token.",
    )
    ca_cert = forms.CharField(
        required=False,
        label="CA certificate",
        widget=SecretTextarea(attrs={"rows": 4, "cols": 60}),
        help_text="Kubernetes: the cluster CA as PEM text.",
    )
    verify_ssl = forms.ChoiceField(required=False, label="Verify TLS", choices=VERIFY_CHOICES)
    other_credentials = KeyValueField(
        example="output_dir=/scratch/hcs",
        label="Other keys",
        widget=SecretTextarea(attrs={"rows": 2, "cols": 60}),
    )
    clear_credentials = forms.BooleanField(
        required=False, help_text="Remove every stored key (cannot be combined with new values)."
    )

    def clean_other_credentials(self) -> dict[str, str]:
        other = self.cleaned_data["other_credentials"]
        taken = sorted(set(other) & {*SECRET_FIELDS, "verify_ssl"})
        if taken:
            raise ValidationError(f"Use the field of its own for {', '.join(taken)}.")
        return other

    def clean(self):
        cleaned = super().clean()
        if cleaned.get("clear_credentials") and self.new_credentials():
            raise ValidationError("Expected either new credentials or 'clear credentials', not both.")
        return cleaned

    def new_credentials(self) -> dict:
        """The credential keys this submission sets."""
        data = self.cleaned_data
        new = {key: value for key in SECRET_FIELDS if (value := data.get(key))}
        new.update(data.get("other_credentials") or {})
        if data.get("verify_ssl"):
            new["verify_ssl"] = data["verify_ssl"] == "true"
        return new

    def save(self, commit: bool = True) -> Cluster:
        cluster = super().save(commit=False)
        new = self.new_credentials()
        if self.cleaned_data.get("clear_credentials"):
            cluster.set_credentials({})
        elif new:
            try:
                stored = cluster.get_credentials()
            except ValueError:
                stored = {}  # unreadable under the current key, so useless: the new keys replace it
            cluster.set_credentials({**stored, **new})
        if commit:
            cluster.save()
            self._save_m2m()
        return cluster


class DeviceLinksField(forms.CharField):
    """Device links to peers edited as one ``peer type bandwidth`` per line, e.g. ``1 nvlink 600``."""

    widget = forms.Textarea(attrs={"rows": 3, "cols": 40})

    def __init__(self, **kwargs) -> None:
        kwargs.setdefault("required", False)
        kwargs.setdefault(
            "help_text",
            "One link per line: peer device index, type "
            f"({' / '.join(LinkType.values)}) and optional bandwidth in Gbit/s, e.g. 1 nvlink 600",
        )
        super().__init__(**kwargs)

    def prepare_value(self, value):
        if isinstance(value, list):
            return "\n".join(
                " ".join(str(part) for part in (link.get("peer"), link.get("type"), link.get("bandwidth_gbps")) if part)
                if isinstance(link, dict)
                else str(link)
                for link in value
            )
        return value

    def to_python(self, value) -> list[dict]:
        links = []
        for number, line in enumerate(super().to_python(value).splitlines(), start=1):
            parts = line.split()
            if not parts:
                continue
            if len(parts) not in (2, 3) or not parts[0].isdigit():
                raise ValidationError(
                    f"Line {number}: expected 'peer type [bandwidth]', e.g. 1 nvlink 600; got {line!r}."
                )
            link = {"peer": int(parts[0]), "type": parts[1].lower()}
            if len(parts) == 3:
                try:
                    bandwidth = float(parts[2])
                except ValueError:
                    raise ValidationError(f"Line {number}: expected a bandwidth in Gbit/s, got {parts[2]!r}.")
                link["bandwidth_gbps"] = int(bandwidth) if bandwidth.is_integer() else bandwidth
            links.append(link)
        return links

    def has_changed(self, initial, data) -> bool:
        try:
            return self.to_python(data) != (initial or [])
        except ValidationError:
            return True


class DeviceAdminForm(forms.ModelForm):
    links = DeviceLinksField()
    sharing_mode = forms.ChoiceField(
        label="Sharing",
        choices=Sharing.choices,
        initial=Sharing.WHOLE,
        help_text="MIG instances or time-sliced replicas are scheduled as units of their own (docs/engine.md)",
    )
    mig_layout = forms.CharField(
        label="MIG layout",
        required=False,
        help_text="MIG: the card's instances, e.g. 3g.40gb, 2g.20gb, 1g.10gb x2 (the node agent keeps it in step)",
    )
    replicas = forms.IntegerField(
        label="Time-sliced replicas",
        required=False,
        min_value=2,
        max_value=MAX_TIME_SLICE_REPLICAS,
        help_text="Time-slicing: as the NVIDIA device plugin's timeSlicing replicas (no memory isolation)",
    )

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        device = self.instance
        if device.pk:
            self.initial.setdefault("sharing_mode", device.sharing)
            self.initial.setdefault("replicas", device.time_slice_replicas)
            if device.sharing == Sharing.MIG:
                profiles = device.units.order_by("slot").values_list("gpu_model__name", flat=True)
                self.initial.setdefault("mig_layout", ", ".join(p[len(device.gpu_model.name) + 1 :] for p in profiles))

    def clean(self):
        data = super().clean()
        sharing = data.get("sharing_mode") or Sharing.WHOLE
        self.sharing_request = None
        if sharing == self.initial.get("sharing_mode", Sharing.WHOLE) and not (
            {"mig_layout", "replicas"} & set(self.changed_data)
        ):
            return data
        device = self.instance
        if device.pk is None or device.parent_id is not None or "gpu_model" in self.changed_data:
            raise ValidationError({"sharing_mode": "Expected an existing card, saved with its model, to partition."})
        request = {"sharing": sharing}
        try:
            if sharing == Sharing.MIG:
                request["mig"] = parse_mig_layout(data.get("mig_layout", ""))
            elif sharing == Sharing.TIME_SLICING:
                request["replicas"] = data.get("replicas")
            check_device_sharing(device, **request)
        except SharingError as exc:
            field = {Sharing.MIG: "mig_layout", Sharing.TIME_SLICING: "replicas"}.get(sharing, "sharing_mode")
            raise ValidationError({field: str(exc)})
        self.sharing_request = request
        return data


class NodeAdminForm(forms.ModelForm):
    labels = KeyValueField(example="zone=a")


class GPUModelAdminForm(forms.ModelForm):
    aliases = CommaListField(help_text="Other spellings users type, comma-separated, e.g. a100, a100-80g")


class CapacityReservationAdminForm(forms.ModelForm):
    """Checks the node list against the reservation (a many-to-many the model's clean cannot see)."""

    def _post_clean(self) -> None:
        super()._post_clean()  # the instance now has the form's values
        if not self.errors and "nodes" in self.cleaned_data:
            try:
                self.instance.clean_nodes(self.cleaned_data["nodes"])
            except ValidationError as exc:
                self._update_errors(exc)
