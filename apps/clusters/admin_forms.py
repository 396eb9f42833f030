"""Admin forms of the clusters app: write-only credentials, labels, device links and aliases as text.

They have no Meta: the ModelAdmin that uses one supplies the model and the fields of its fieldsets.
"""

from __future__ import annotations

from django import forms
from django.core.exceptions import ValidationError

from apps.clusters.choices import LinkType
from apps.clusters.models import Cluster
from apps.vdc.admin_forms import CommaListField, KeyValueField, SecretTextarea

CREDENTIAL_FIELDS = ("token", "kubeconfig", "jwt", "user")


class ClusterAdminForm(forms.ModelForm):
    """Cluster settings plus write-only credentials: filled fields replace the stored set, empty ones change nothing.

    Secrets are never rendered, not even after a failed save, and the encrypted value is not a form field.
    """

    labels = KeyValueField(example="region=north")
    token = forms.CharField(
        required=False,
        widget=forms.PasswordInput(render_value=False),
        help_text="Kubernetes service-account bearer token.",
    )
    kubeconfig = forms.CharField(
        required=False,
        widget=SecretTextarea(attrs={"rows": 4, "cols": 60}),
        help_text="A whole kubeconfig (YAML), instead of endpoint + token.",
    )
    jwt = forms.CharField(
        required=False, widget=forms.PasswordInput(render_value=False), help_text="Slurm REST API JWT."
    )
    user = forms.CharField(
        required=False,
        widget=forms.PasswordInput(render_value=False),
        help_text="Slurm user the REST API acts as.",
    )
    clear_credentials = forms.BooleanField(required=False, help_text="Remove the stored credentials.")

    def clean(self):
        cleaned = super().clean()
        if cleaned.get("clear_credentials") and self.new_credentials():
            raise ValidationError("Expected either new credentials or 'clear credentials', not both.")
        return cleaned

    def new_credentials(self) -> dict[str, str]:
        """The credential fields filled in this submission."""
        return {key: value for key in CREDENTIAL_FIELDS if (value := self.cleaned_data.get(key))}

    def save(self, commit: bool = True) -> Cluster:
        cluster = super().save(commit=False)
        new = self.new_credentials()
        if new or self.cleaned_data.get("clear_credentials"):
            cluster.set_credentials(new)
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


class NodeAdminForm(forms.ModelForm):
    labels = KeyValueField(example="zone=a")


class GPUModelAdminForm(forms.ModelForm):
    aliases = CommaListField(help_text="Other spellings users type, comma-separated, e.g. a100, a100-80g")
