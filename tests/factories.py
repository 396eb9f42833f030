"""factory_boy factories for the domain models; tests declare only what they care about."""

from datetime import timedelta
from decimal import Decimal

import factory
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Permission

from apps.clusters.models import Cluster, Device, GPUModel, Node
from apps.queues.models import TaskQueue
from apps.tasks.choices import ACTIVE
from apps.tasks.models import Task
from apps.vdc.models import VDC, Membership, Project, ProjectQuota


class UserFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = get_user_model()
        django_get_or_create = ("username",)

    username = factory.Sequence(lambda n: f"user{n}")
    email = factory.LazyAttribute(lambda u: f"{u.username}@example.org")
    password = factory.django.Password("pw-for-tests-1")


def staff_user(username: str, *perms: str):
    """A staff user (not a superuser) holding exactly ``perms`` ("app_label.codename"), granted directly."""
    user = UserFactory(username=username, is_staff=True)
    for perm in perms:
        app_label, codename = perm.split(".")
        user.user_permissions.add(Permission.objects.get(content_type__app_label=app_label, codename=codename))
    return user


class VDCFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = VDC

    name = factory.Sequence(lambda n: f"vdc-{n}")


class ClusterFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = Cluster

    vdc = factory.SubFactory(VDCFactory)
    name = factory.Sequence(lambda n: f"cluster-{n}")
    cluster_type = "local"
    status = "healthy"  # as after its first health check (a new cluster is "unknown" until then)


class NodeFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = Node

    cluster = factory.SubFactory(ClusterFactory)
    name = factory.Sequence(lambda n: f"node-{n}")
    cpu = Decimal("64")
    memory_gib = Decimal("512")


class DeviceFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = Device

    node = factory.SubFactory(NodeFactory)
    index = factory.Sequence(lambda n: n % 8)
    gpu_model = factory.LazyFunction(lambda: GPUModel.objects.get(name="A100-80G"))
    vram_gib = factory.LazyAttribute(lambda d: d.gpu_model.vram_gib)


class ProjectFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = Project

    name = factory.Sequence(lambda n: f"project-{n}")


class MembershipFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = Membership

    project = factory.SubFactory(ProjectFactory)
    user = factory.SubFactory(UserFactory)
    role = "member"


class ProjectQuotaFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = ProjectQuota

    project = factory.SubFactory(ProjectFactory)
    vdc = factory.SubFactory(VDCFactory)
    guaranteed_cpu = Decimal("16")
    limit_cpu = Decimal("64")
    guaranteed_memory_gib = Decimal("64")
    limit_memory_gib = Decimal("256")
    guaranteed_gpu = Decimal("2")
    limit_gpu = Decimal("8")


class TaskQueueFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = TaskQueue

    vdc = factory.SubFactory(VDCFactory)
    name = factory.Sequence(lambda n: f"queue-{n}")
    priority_class = "high"


class TaskFactory(factory.django.DjangoModelFactory):
    """A task row made directly (bypassing submission rules), for lists and fixtures."""

    class Meta:
        model = Task

    name = factory.Sequence(lambda n: f"task-{n}")
    project = factory.SubFactory(ProjectFactory)
    owner = factory.SubFactory(UserFactory)
    vdc = factory.SubFactory(VDCFactory)
    queue = factory.SubFactory(TaskQueueFactory, vdc=factory.SelfAttribute("..vdc"))
    kind = "training"
    gpu_spec = "1(A100)"
    command = "echo hello"
    expected_duration = timedelta(hours=1)
    cpu = Decimal("1")
    memory_gib = Decimal("1")
    instances = 1
    replicas = 0
    # An active row made directly holds what the lifecycle would have written for its instances (the ledger).
    held_cpu = factory.LazyAttribute(lambda t: t.cpu * (t.replicas or t.instances) if t.status in ACTIVE else 0)
    held_memory_gib = factory.LazyAttribute(
        lambda t: t.memory_gib * (t.replicas or t.instances) if t.status in ACTIVE else 0
    )
    status = "queued"


def node_with_every_model(cluster, name: str = "every-model-node", cards: int = 4):
    """A node holding ``cards`` cards of every catalog model, so any valid GPU spec could run on ``cluster``."""
    node = NodeFactory(cluster=cluster, name=name, cpu=Decimal("64"), memory_gib=Decimal("512"))
    index = 0
    for model in GPUModel.objects.order_by("name"):
        for _ in range(cards):
            DeviceFactory(node=node, index=index, gpu_model=model)
            index += 1
    return node
