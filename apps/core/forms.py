"""Form fields the admin uses instead of raw JSON: key=value lines, comma lists, lines, write-only secrets."""

from __future__ import annotations

from django import forms
from django.core.exceptions import ValidationError
from django.forms.fields import InvalidJSONInput

from apps.core import jsondocs


class KeyValueField(forms.CharField):
    """A dict of strings edited as one ``key=value`` per line (labels, environment variables)."""

    widget = forms.Textarea(attrs={"rows": 3, "cols": 60})

    def __init__(self, *, example: str = "gpu=a100", **kwargs) -> None:
        kwargs.setdefault("required", False)
        kwargs.setdefault("help_text", f"One key=value per line, e.g. {example}")
        self.example = example
        super().__init__(**kwargs)

    def prepare_value(self, value):
        if isinstance(value, dict):
            return "\n".join(f"{key}={val}" for key, val in value.items())
        return value

    def to_python(self, value) -> dict[str, str]:
        text = super().to_python(value)
        result: dict[str, str] = {}
        for number, line in enumerate(text.splitlines(), start=1):
            line = line.strip()
            if not line:
                continue
            key, sep, val = line.partition("=")
            if not sep or not key.strip():
                raise ValidationError(f"Line {number}: expected key=value (e.g. {self.example}), got {line!r}.")
            if key.strip() in result:
                raise ValidationError(f"Line {number}: key {key.strip()!r} appears twice.")
            result[key.strip()] = val.strip()
        return result

    def has_changed(self, initial, data) -> bool:
        try:
            return self.to_python(data) != (initial or {})
        except ValidationError:
            return True


class CommaListField(forms.CharField):
    """A list of strings edited as comma-separated text (GPU model aliases)."""

    def __init__(self, **kwargs) -> None:
        kwargs.setdefault("required", False)
        super().__init__(**kwargs)

    def prepare_value(self, value):
        if isinstance(value, list | tuple):
            return ", ".join(value)
        return value

    def to_python(self, value) -> list[str]:
        text = super().to_python(value)
        items = [item.strip() for item in text.split(",")]
        return list(dict.fromkeys(item for item in items if item))

    def has_changed(self, initial, data) -> bool:
        return self.to_python(data) != list(initial or [])


class LinesField(forms.CharField):
    """A list of strings edited as one per line (approved host path prefixes)."""

    widget = forms.Textarea(attrs={"rows": 3, "cols": 60})

    def __init__(self, **kwargs) -> None:
        kwargs.setdefault("required", False)
        super().__init__(**kwargs)

    def prepare_value(self, value):
        if isinstance(value, list | tuple):
            return "\n".join(str(item) for item in value)
        return value

    def to_python(self, value) -> list[str]:
        lines = (line.strip() for line in super().to_python(value).splitlines())
        return list(dict.fromkeys(line for line in lines if line))

    def has_changed(self, initial, data) -> bool:
        return self.to_python(data) != list(initial or [])


class JSONDocumentField(forms.JSONField):
    """A JSON form field whose documents nest at most ``jsondocs.MAX_DEPTH`` deep (deeper: a form error)."""

    def to_python(self, value):
        try:
            converted = super().to_python(value)
        except RecursionError:
            converted = None
            too_deep = True
        else:
            too_deep = jsondocs.depth_exceeds(converted)
        if too_deep:
            raise ValidationError(str(jsondocs.TooDeep()), code="invalid")
        return converted

    def bound_data(self, data, initial):
        try:
            return super().bound_data(data, initial)
        except RecursionError:
            return InvalidJSONInput(data)


class SecretTextarea(forms.Textarea):
    """A textarea that never renders a value, not even the one just submitted: for secrets."""

    def format_value(self, value) -> None:
        return None
