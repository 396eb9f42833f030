from django.apps import AppConfig


class ClustersConfig(AppConfig):
    name = "apps.clusters"
    verbose_name = "Clusters and devices"

    def ready(self) -> None:
        from django.db.models.signals import post_delete, post_save  # noqa: PLC0415

        from apps.clusters.models import GPUModel  # noqa: PLC0415 - models load after the app registry
        from apps.clusters.services import forget_catalog  # noqa: PLC0415

        post_save.connect(forget_catalog, sender=GPUModel, dispatch_uid="forget-catalog-on-save")
        post_delete.connect(forget_catalog, sender=GPUModel, dispatch_uid="forget-catalog-on-delete")
