"""Issue a node-agent token for a cluster and print it once."""

from django.core.management.base import BaseCommand, CommandError

from apps.clusters.models import Cluster
from apps.clusters.services import issue_agent_token


class Command(BaseCommand):
    help = "Create a node-agent token for CLUSTER (name) and print the secret; only its hash is stored."

    def add_arguments(self, parser):
        parser.add_argument("cluster")
        parser.add_argument("--name", default="agent")

    def handle(self, *args, cluster: str, name: str, **options):
        found = list(Cluster.objects.filter(name=cluster))
        if len(found) != 1:
            known = ", ".join(Cluster.objects.values_list("name", flat=True)) or "none"
            raise CommandError(f"Expected the name of one cluster ({known}), got {cluster!r}.")
        self.stdout.write(issue_agent_token(found[0], name))
