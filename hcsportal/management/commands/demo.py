"""Create (or refresh) the demo: a default VDC with a local cluster, three queues, two projects, three users."""

from __future__ import annotations

import os
import shutil
import subprocess
from datetime import timedelta
from decimal import Decimal
from pathlib import Path

import psutil
from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError
from django.db import transaction

from apps.billing.services import seed_demo_prices
from apps.clusters.choices import ClusterStatus
from apps.clusters.models import Cluster, Device, GPUModel, Node
from apps.clusters.services import import_slurm_nodes
from apps.control.health import check_cluster_health
from apps.queues.models import TaskQueue
from apps.vdc.models import VDC, Membership, Project, ProjectQuota
from hcsportal.env import env_bool

DEMO_USERS = [
    # username, password, is admin, {project: role}
    ("admin", "hcs-admin-demo", True, {}),
    ("alice", "hcs-alice-demo", False, {"vision": "owner", "nlp": "member"}),
    ("bob", "hcs-bob-demo", False, {"vision": "member", "nlp": "viewer"}),
]
DEMO_GPUS = ("A100-80G", 4)


class Command(BaseCommand):
    help = "Create the demo VDC, local cluster, queues, projects and users (idempotent); print the logins."

    def add_arguments(self, parser):
        parser.add_argument(
            "--with-slurm",
            action="store_true",
            default=env_bool("HCS_DEMO_SLURM", False),
            help="Start the dev Slurm cluster (scripts/dev_slurm.sh) and register it (also: HCS_DEMO_SLURM=1)",
        )

    def handle(self, *args, with_slurm: bool = False, **options):
        with transaction.atomic():
            vdc = self._vdc()
            self._local_cluster(vdc)
            self._queues(vdc)
            self._projects_and_users(vdc)
            seed_demo_prices()
        if with_slurm:
            self._slurm_cluster(VDC.objects.get(name="demo"))
        self.stdout.write(self.style.SUCCESS("Demo ready. Logins (user / password):"))
        for username, password, is_admin, roles in DEMO_USERS:
            what = "platform admin" if is_admin else ", ".join(f"{r} of {p}" for p, r in roles.items())
            self.stdout.write(f"  {username:<6} / {password:<14} {what}")

    def _vdc(self) -> VDC:
        vdc, _ = VDC.objects.get_or_create(
            name="demo",
            defaults={"description": "Demo VDC: one local cluster on this host", "is_default": True},
        )
        return vdc

    def _local_cluster(self, vdc: VDC) -> None:
        cluster, _ = Cluster.objects.get_or_create(
            vdc=vdc,
            name="local",
            defaults={"cluster_type": "local", "description": "Runs task commands as processes on the portal host"},
        )
        memory_gib = Decimal(psutil.virtual_memory().total) / Decimal(2**30)
        node, _ = Node.objects.update_or_create(
            cluster=cluster,
            name=os.uname().nodename or "localhost",
            defaults={"cpu": Decimal(os.cpu_count() or 1), "memory_gib": memory_gib.quantize(Decimal("0.01"))},
        )
        # Simulated cards so GPU tasks can be placed on a GPU-less demo host; the node agent replaces
        # them with real NVML devices where there are some.
        model = GPUModel.objects.get(name=DEMO_GPUS[0])
        for index in range(DEMO_GPUS[1]):
            Device.objects.get_or_create(
                node=node,
                index=index,
                defaults={
                    "gpu_model": model,
                    "vram_gib": model.vram_gib,
                    "uuid": f"demo-simulated-{index}",
                    "links": [
                        {"peer": p, "type": "nvlink", "bandwidth_gbps": 600} for p in range(DEMO_GPUS[1]) if p != index
                    ],
                },
            )
        if cluster.status == ClusterStatus.UNKNOWN:
            check_cluster_health(cluster)  # the demo's first tasks need not wait for the beat's first check

    def _slurm_cluster(self, vdc: VDC) -> None:
        """Start the dev Slurm cluster (installing Slurm when missing) and register it with its nodes."""
        self.stdout.write("Starting the dev Slurm cluster (scripts/dev_slurm.sh start) ...")
        script = settings.BASE_DIR / "scripts" / "dev_slurm.sh"
        result = subprocess.run(["bash", str(script), "start"], capture_output=True, text=True, check=False)
        if result.returncode != 0:
            raise CommandError(f"dev_slurm.sh start failed:\n{result.stderr[-2000:]}")
        env = dict(line.split("=", 1) for line in result.stdout.splitlines() if line.startswith("SLURM_"))
        # Training tasks keep their checkpoints here (docs/tasks.md); the jobs' user creates a directory per task.
        checkpoint_root = Path(env["SLURM_OUTPUT_DIR"]).parent / "checkpoints"
        checkpoint_root.mkdir(mode=0o755, exist_ok=True)
        shutil.chown(checkpoint_root, user=env["SLURM_USER"])
        cluster, _ = Cluster.objects.update_or_create(
            vdc=vdc,
            name="slurm-dev",
            defaults={
                "cluster_type": "slurm",
                "endpoint": env["SLURM_REST_URL"],
                "api_version": env["SLURM_API_VERSION"],
                "namespace": env["SLURM_PARTITION"],
                "description": "Dev Slurm cluster on this host (fake GPUs)",
                "labels": {"backend": "slurm", "slurm-gres.A100-80G": "a100", "slurm-gres.V100-32G": "v100"},
                "checkpoint_root": str(checkpoint_root),
            },
        )
        cluster.set_credentials(
            {
                "token": env["SLURM_JWT"],
                "user": env["SLURM_USER"],
                "output_dir": env["SLURM_OUTPUT_DIR"],
                "slurm_conf": env["SLURM_CONF"],
            }  # srun (the Web Console) finds the dev cluster through it
        )
        cluster.save()
        nodes = import_slurm_nodes(cluster)
        check_cluster_health(cluster)
        self.stdout.write(f"Registered Slurm cluster slurm-dev with {len(nodes)} nodes.")

    def _queues(self, vdc: VDC) -> None:
        for name, klass, policy in (("high", "high", "fifo"), ("medium", "medium", "drf"), ("low", "low", "backfill")):
            TaskQueue.objects.get_or_create(
                vdc=vdc,
                name=name,
                defaults={"priority_class": klass, "policy": policy, "min_window": timedelta(minutes=10)},
            )

    def _projects_and_users(self, vdc: VDC) -> None:
        User = get_user_model()
        projects = {}
        for name, gpu in (("vision", 2), ("nlp", 1)):
            projects[name], _ = Project.objects.get_or_create(name=name)
            ProjectQuota.objects.get_or_create(
                project=projects[name],
                vdc=vdc,
                defaults={
                    "guaranteed_cpu": 1,
                    "limit_cpu": 8,
                    "guaranteed_memory_gib": 2,
                    "limit_memory_gib": 16,
                    "guaranteed_gpu": gpu,
                    "limit_gpu": 4,
                    "max_concurrent_tasks": 10,
                },
            )
        for username, password, is_admin, roles in DEMO_USERS:
            user, created = User.objects.get_or_create(
                username=username, defaults={"is_staff": is_admin, "is_superuser": is_admin}
            )
            if created:
                user.set_password(password)
                user.save()
            for project, role in roles.items():
                Membership.objects.update_or_create(project=projects[project], user=user, defaults={"role": role})
