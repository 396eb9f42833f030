from django.apps import AppConfig


class CoreConfig(AppConfig):
    """The shared kit every app may import (admin helpers, filterset base, form fields, API mixins, crypto, charts);
    it imports no other app of the portal."""

    name = "apps.core"
    verbose_name = "Shared kit"
