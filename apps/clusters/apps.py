from django.apps import AppConfig


class ClustersConfig(AppConfig):
    name = "apps.clusters"
    verbose_name = "Clusters and devices"
