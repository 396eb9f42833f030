"""Admin forms of tasks: submission goes through the submission service, like every other door."""

from __future__ import annotations

from django import forms
from django.core.exceptions import NON_FIELD_ERRORS, PermissionDenied, ValidationError

from apps.core.forms import KeyValueField, SecretTextarea
from apps.tasks.models import Task
from apps.tasks.services import AUTOSCALE_FIELDS, SUBMIT_FIELDS, autoscale_errors, submit_task
from apps.vdc.models import VDC

ENV_EXAMPLE = "EPOCHS=3"
SECRET_ENV_EXAMPLE = "WANDB_API_KEY=..."
LABELS_EXAMPLE = "gpu=a100"


def _volumes(value):
    """An empty box of a list (volumes, secret references, scheduled minimums) means none, not JSON null."""
    return [] if value is None else value


class TaskChangeForm(forms.ModelForm):
    """The change form (model and fields come from the admin): environment and labels as key=value lines."""

    env = KeyValueField(example=ENV_EXAMPLE)
    required_labels = KeyValueField(example=LABELS_EXAMPLE, help_text="Clusters must carry these labels")

    def clean_volumes(self):
        return _volumes(self.cleaned_data.get("volumes"))

    def clean_autoscale_schedule(self):
        return _volumes(self.cleaned_data.get("autoscale_schedule"))

    def autoscale_changes(self) -> dict:
        """The autoscaling settings this form changes (the admin saves them through ``update_autoscaling``)."""
        # A JSON box counts as changed whenever it is posted: only a value other than the stored one is a change.
        return {
            f: self.cleaned_data[f]
            for f in AUTOSCALE_FIELDS
            if f in self.changed_data and f in self.cleaned_data and self.cleaned_data[f] != self.initial.get(f)
        }

    def clean(self):
        cleaned = super().clean()
        changes = self.autoscale_changes()
        if changes and self.instance.pk:
            original = Task.objects.select_related("queue", "vdc").get(pk=self.instance.pk)
            for field, message in autoscale_errors(original, changes).items():
                self.add_error(field if field in self.fields else None, message)
        return cleaned


class TaskSubmitForm(forms.ModelForm):
    """The admin's add form: valid means submitted through :func:`submit_task`, with its messages per field.

    The admin sets ``submitter`` (the logged-in admin, who becomes the owner) on the form class. The task is
    written by the service during validation and only when every check passed, so an invalid form writes nothing.
    """

    submitter = None

    vdc = forms.ModelChoiceField(
        VDC.objects.all(), required=False, help_text="Empty: the VDC of the queue", label="VDC"
    )
    env = KeyValueField(example=ENV_EXAMPLE)
    secret_variables = KeyValueField(
        example=SECRET_ENV_EXAMPLE,
        widget=SecretTextarea(attrs={"rows": 2, "cols": 60}),
        label="Secret variables",
        help_text="One NAME=value per line; stored encrypted, given to the job, never shown again (not even here).",
    )
    required_labels = KeyValueField(example=LABELS_EXAMPLE, help_text="Clusters must carry these labels")

    class Meta:
        model = Task
        fields = ("project", "vdc", "queue", "preferred_clusters", *SUBMIT_FIELDS)

    def clean_volumes(self):
        return _volumes(self.cleaned_data.get("volumes"))

    def clean_secret_refs(self):
        return _volumes(self.cleaned_data.get("secret_refs"))

    def clean_autoscale_schedule(self):
        return _volumes(self.cleaned_data.get("autoscale_schedule"))

    def clean(self):
        cleaned = super().clean()
        if self.errors:
            return cleaned
        fields = {name: cleaned[name] for name in SUBMIT_FIELDS if name in cleaned}
        try:
            self.instance = submit_task(
                self.submitter,
                project=cleaned["project"],
                queue=cleaned["queue"],
                vdc=cleaned.get("vdc"),
                preferred_clusters=cleaned.get("preferred_clusters") or (),
                secret_env=cleaned.get("secret_variables") or {},
                **fields,
            )
        except PermissionDenied as exc:
            self.add_error(None, str(exc))
        except ValidationError as exc:
            self._add_service_errors(exc)
        return cleaned

    def _add_service_errors(self, exc: ValidationError) -> None:
        if not hasattr(exc, "error_dict"):
            self.add_error(None, exc)
            return
        for field, messages in exc.message_dict.items():
            if field in self.fields:
                self.add_error(field, messages)
            else:
                label = "" if field == NON_FIELD_ERRORS else f"{field}: "
                self.add_error(None, [f"{label}{message}" for message in messages])

    def _post_clean(self) -> None:
        # The service validated (and saved) the task in clean(); the model's own checks would only repeat it.
        pass
