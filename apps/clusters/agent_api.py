"""The endpoint node agents post their reports to, authenticated by a cluster's agent token."""

from __future__ import annotations

from django.contrib.auth.models import AnonymousUser
from drf_spectacular.utils import extend_schema, inline_serializer
from rest_framework import authentication, exceptions, permissions, serializers, status
from rest_framework.response import Response
from rest_framework.views import APIView

from apps.clusters.catalog import MIG_SLICES
from apps.clusters.choices import LinkType, Vendor
from apps.clusters.models import AgentToken
from apps.clusters.services import agent_token, apply_node_report


class AgentTokenAuthentication(authentication.BaseAuthentication):
    """``Authorization: Agent <secret>``; ``request.auth`` becomes the :class:`AgentToken`."""

    keyword = "Agent"

    def authenticate(self, request):
        header = authentication.get_authorization_header(request).decode(errors="replace").split()
        if not header or header[0] != self.keyword:
            return None
        if len(header) != 2:
            raise exceptions.AuthenticationFailed("Expected 'Authorization: Agent <token>'.")
        token = agent_token(header[1])
        if token is None:
            raise exceptions.AuthenticationFailed("Unknown or revoked agent token.")
        return AnonymousUser(), token

    def authenticate_header(self, request):
        return self.keyword


class IsNodeAgent(permissions.BasePermission):
    """A node-scoped agent token; an old cluster-wide one (no node) is refused with what to do instead."""

    message = (
        "This agent token is cluster-wide, issued before agent tokens were scoped to one node, and no longer "
        "accepted: issue one per node (manage.py issue_agent_token <cluster> <node>) and restart that node's "
        "agent with it."
    )

    def has_permission(self, request, view):
        return isinstance(request.auth, AgentToken) and bool(request.auth.node_name)


# Bounds well above any real machine and inside what the Node and Device columns hold.
MAX_CPU = 100_000
MAX_MEMORY_GIB = 10_000_000
MAX_VRAM_GIB = 100_000
MAX_ERROR_COUNT = 1_000_000_000
MAX_DEVICES = 256
MAX_LINKS = 64
MAX_REASONS = 20
MAX_BANDWIDTH_GBPS = 100_000


class LinkReportSerializer(serializers.Serializer):
    peer = serializers.IntegerField(min_value=0, max_value=255)
    type = serializers.ChoiceField(choices=LinkType.choices)
    bandwidth_gbps = serializers.FloatField(min_value=0, max_value=100_000, required=False)


class MigInstanceReportSerializer(serializers.Serializer):
    """One MIG instance of a card in MIG mode, as NVML lists it."""

    profile = serializers.RegexField(r"^[1-9]g\.\d{1,4}gb\Z", max_length=16)
    uuid = serializers.CharField(max_length=96, allow_blank=True, default="")
    gpu_instance_id = serializers.IntegerField(min_value=0, max_value=255, allow_null=True, default=None)


class DeviceReportSerializer(serializers.Serializer):
    index = serializers.IntegerField(min_value=0, max_value=255)
    uuid = serializers.CharField(max_length=96, allow_blank=True)
    name = serializers.CharField(max_length=128)
    vram_total_gib = serializers.FloatField(min_value=0, max_value=MAX_VRAM_GIB)
    vram_used_gib = serializers.FloatField(min_value=0, max_value=MAX_VRAM_GIB)
    utilization = serializers.IntegerField(min_value=0, max_value=100)
    temperature_c = serializers.IntegerField(min_value=-100, max_value=200, allow_null=True, required=False)
    ecc_uncorrected = serializers.IntegerField(min_value=0, max_value=MAX_ERROR_COUNT, default=0)
    ecc_corrected = serializers.IntegerField(min_value=0, max_value=MAX_ERROR_COUNT, default=0)
    xid_errors = serializers.IntegerField(min_value=0, max_value=MAX_ERROR_COUNT, default=0)
    pci_bus_id = serializers.CharField(max_length=32, allow_blank=True, default="")
    numa_node = serializers.IntegerField(min_value=-1, max_value=1024, allow_null=True, required=False)
    links = LinkReportSerializer(many=True, default=list, max_length=MAX_LINKS)
    health_score = serializers.IntegerField(min_value=0, max_value=100, default=100)
    # Fingerprint and vendor-neutral health (optional: agents before the vendor detectors send none).
    vendor = serializers.ChoiceField(choices=Vendor.choices, required=False, allow_blank=True, default="")
    driver_version = serializers.CharField(max_length=64, allow_blank=True, default="")
    runtime_version = serializers.CharField(max_length=64, allow_blank=True, default="")
    health_status = serializers.ChoiceField(choices=["", "ok", "warning", "critical"], default="")
    health_reasons = serializers.ListField(
        child=serializers.CharField(max_length=200), max_length=MAX_REASONS, default=list
    )
    memory_bandwidth_gbps = serializers.FloatField(
        min_value=0, max_value=MAX_BANDWIDTH_GBPS, allow_null=True, required=False, default=None
    )
    # MIG (NVIDIA): whether the card is in MIG mode and the instances configured on it (docs/engine.md).
    mig_mode = serializers.BooleanField(default=False)
    mig = MigInstanceReportSerializer(many=True, default=list, max_length=MIG_SLICES)

    def validate(self, attrs: dict) -> dict:
        ids = [m["gpu_instance_id"] for m in attrs["mig"] if m["gpu_instance_id"] is not None]
        if len(ids) != len(set(ids)):
            raise serializers.ValidationError({"mig": "Expected each MIG GPU instance id once."})
        return attrs


class NodeReportSerializer(serializers.Serializer):
    """A node agent's report; every number is bounded and each device index, UUID and PCI bus id appears once."""

    node = serializers.CharField(max_length=128)
    cpu = serializers.IntegerField(min_value=0, max_value=MAX_CPU)
    memory_gib = serializers.FloatField(min_value=0, max_value=MAX_MEMORY_GIB)
    driver = serializers.CharField(allow_blank=True, default="", max_length=128)
    devices = DeviceReportSerializer(many=True, default=list, max_length=MAX_DEVICES)
    message = serializers.CharField(allow_blank=True, default="", max_length=2000)
    runtime = serializers.CharField(allow_blank=True, default="", max_length=128)
    detectors = serializers.ListField(child=serializers.CharField(max_length=32), max_length=16, default=list)

    def validate_devices(self, devices: list[dict]) -> list[dict]:
        # A card is known by its UUID (else its PCI bus id): two cards of one report may not share either.
        for field, what in (("index", "device index"), ("uuid", "device UUID"), ("pci_bus_id", "PCI bus id")):
            values = [device[field] for device in devices if device.get(field) not in (None, "")]
            repeated = sorted({value for value in values if values.count(value) > 1})
            if repeated:
                raise serializers.ValidationError(
                    f"Expected each {what} once, got {', '.join(map(str, repeated))} more than once."
                )
        return devices


class AgentReportView(APIView):
    """POST a node report (see ``apps.clusters.detectors.NodeReport``); the node and its devices are upserted.

    Each device is fingerprinted against its catalog model; the answer's ``message`` names new models to rate
    and mismatches that lowered a device's health.
    """

    authentication_classes = [AgentTokenAuthentication]
    permission_classes = [IsNodeAgent]

    @extend_schema(
        request=NodeReportSerializer,
        responses={
            202: inline_serializer(
                "AgentReportAccepted",
                {
                    "node": serializers.IntegerField(),
                    "devices": serializers.IntegerField(),
                    "message": serializers.CharField(),
                },
            )
        },
    )
    def post(self, request):
        serializer = NodeReportSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        token: AgentToken = request.auth
        reported = serializer.validated_data["node"]
        if reported != token.node_name:
            raise exceptions.PermissionDenied(
                f"This agent token reports for node {token.node_name!r} of cluster {token.cluster.name!r} only, "
                f"not {reported!r}: give each node's agent its own token (manage.py issue_agent_token "
                f"{token.cluster.name} {reported})."
            )
        node = apply_node_report(token.cluster, serializer.validated_data)
        body = {"node": node.pk, "devices": node.devices.cards().count(), "message": node.agent_message}
        return Response(body, status=status.HTTP_202_ACCEPTED)
