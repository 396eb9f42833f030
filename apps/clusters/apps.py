from django.apps import AppConfig


class ClustersConfig(AppConfig):
    name = "apps.clusters"
    verbose_name = "Clusters and devices"

    def ready(self) -> None:
        # Models load after the app registry.
        from django.db.models.signals import post_delete, post_save, pre_delete

        from apps.clusters.models import Device, GPUModel
        from apps.clusters.services import forget_catalog, refuse_deleting_held_card

        post_save.connect(forget_catalog, sender=GPUModel, dispatch_uid="forget-catalog-on-save")
        post_delete.connect(forget_catalog, sender=GPUModel, dispatch_uid="forget-catalog-on-delete")
        pre_delete.connect(refuse_deleting_held_card, sender=Device, dispatch_uid="refuse-deleting-held-card")
