"""The admin renders a field's help text as HTML: a placeholder written <root> vanished as an unknown tag."""

from __future__ import annotations

import re

from django.apps import apps

PLACEHOLDER = re.compile(r"<(?!/?(a|code|strong|em|br)\b)[A-Za-z][^>]*>")


def test_no_model_help_text_holds_something_the_browser_would_take_for_a_tag():
    found = [
        f"{model._meta.label}.{field.name}: {field.help_text}"
        for model in apps.get_models()
        for field in model._meta.get_fields()
        if PLACEHOLDER.search(str(getattr(field, "help_text", "") or ""))
    ]
    assert not found, found
