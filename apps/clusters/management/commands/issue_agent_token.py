"""Issue a node-agent token for one node of a cluster and print it once."""

from django.core.management.base import BaseCommand, CommandError

from apps.clusters.models import Cluster
from apps.clusters.services import issue_agent_token


class Command(BaseCommand):
    help = (
        "Create a node-agent token for NODE of CLUSTER (names) and print the secret; only its hash is stored. "
        "The token reports for that node only (the name the agent reports, by default its host name)."
    )

    def add_arguments(self, parser):
        parser.add_argument("cluster")
        parser.add_argument("node", help="the node's name as its agent reports it (node_agent --node, or host name)")
        parser.add_argument("--name", default="", help="what the token is for (default: the node's name)")

    def handle(self, *args, cluster: str, node: str, name: str, **options):
        found = list(Cluster.objects.filter(name=cluster))
        if len(found) != 1:
            known = ", ".join(Cluster.objects.values_list("name", flat=True)) or "none"
            raise CommandError(f"Expected the name of one cluster ({known}), got {cluster!r}.")
        try:
            self.stdout.write(issue_agent_token(found[0], node, name))
        except ValueError as exc:
            raise CommandError(str(exc)) from None
