from django.apps import AppConfig


class VdcConfig(AppConfig):
    name = "apps.vdc"
    verbose_name = "Virtual data centers"
