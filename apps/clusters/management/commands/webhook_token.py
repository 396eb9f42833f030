"""Issue the token a Kubernetes cluster's API server presents to the portal's admission webhook."""

from django.core.management.base import BaseCommand, CommandError

from apps.clusters.choices import ClusterType
from apps.clusters.models import Cluster
from apps.clusters.webhook import issue_webhook_token


class Command(BaseCommand):
    help = (
        "Give the Kubernetes cluster CLUSTER (name) a new admission-webhook token and print it once; "
        "the previous token stops working. Only its hash is stored."
    )

    def add_arguments(self, parser):
        parser.add_argument("cluster")

    def handle(self, *args, cluster: str, **options):
        found = list(Cluster.objects.filter(name=cluster, cluster_type=ClusterType.KUBERNETES))
        if len(found) != 1:
            known = Cluster.objects.filter(cluster_type=ClusterType.KUBERNETES).values_list("name", flat=True)
            raise CommandError(
                f"Expected the name of one Kubernetes cluster ({', '.join(known) or 'none'}), got {cluster!r}."
            )
        self.stdout.write(issue_webhook_token(found[0]))
