"""The endpoint node agents post their reports to, authenticated by a cluster's agent token."""

from __future__ import annotations

from django.contrib.auth.models import AnonymousUser
from drf_spectacular.utils import extend_schema, inline_serializer
from rest_framework import authentication, exceptions, permissions, serializers, status
from rest_framework.response import Response
from rest_framework.views import APIView

from apps.clusters.services import apply_node_report, cluster_for_agent_token


class AgentTokenAuthentication(authentication.BaseAuthentication):
    """``Authorization: Agent <secret>``; ``request.auth`` becomes the token's cluster."""

    keyword = "Agent"

    def authenticate(self, request):
        header = authentication.get_authorization_header(request).decode(errors="replace").split()
        if not header or header[0] != self.keyword:
            return None
        if len(header) != 2:
            raise exceptions.AuthenticationFailed("Expected 'Authorization: Agent <token>'.")
        cluster = cluster_for_agent_token(header[1])
        if cluster is None:
            raise exceptions.AuthenticationFailed("Unknown or revoked agent token.")
        return AnonymousUser(), cluster

    def authenticate_header(self, request):
        return self.keyword


class IsAgent(permissions.BasePermission):
    def has_permission(self, request, view):
        return request.auth is not None and hasattr(request.auth, "cluster_type")


class DeviceReportSerializer(serializers.Serializer):
    index = serializers.IntegerField(min_value=0, max_value=255)
    uuid = serializers.CharField(max_length=96, allow_blank=True)
    name = serializers.CharField(max_length=128)
    vram_total_gib = serializers.FloatField(min_value=0)
    vram_used_gib = serializers.FloatField(min_value=0)
    utilization = serializers.IntegerField(min_value=0, max_value=100)
    temperature_c = serializers.IntegerField(allow_null=True, required=False)
    ecc_uncorrected = serializers.IntegerField(min_value=0, default=0)
    ecc_corrected = serializers.IntegerField(min_value=0, default=0)
    xid_errors = serializers.IntegerField(min_value=0, default=0)
    pci_bus_id = serializers.CharField(max_length=32, allow_blank=True, default="")
    numa_node = serializers.IntegerField(allow_null=True, required=False)
    links = serializers.ListField(child=serializers.DictField(), default=list)
    health_score = serializers.IntegerField(min_value=0, max_value=100, default=100)


class NodeReportSerializer(serializers.Serializer):
    node = serializers.CharField(max_length=128)
    cpu = serializers.IntegerField(min_value=0)
    memory_gib = serializers.FloatField(min_value=0)
    driver = serializers.CharField(allow_blank=True, default="")
    devices = DeviceReportSerializer(many=True, default=list)
    message = serializers.CharField(allow_blank=True, default="")


class AgentReportView(APIView):
    """POST a node report (see ``apps.clusters.agent.NodeReport``); the node and its devices are upserted."""

    authentication_classes = [AgentTokenAuthentication]
    permission_classes = [IsAgent]

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
        },  # fmt: skip
    )
    def post(self, request):
        serializer = NodeReportSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        node = apply_node_report(request.auth, serializer.validated_data)
        body = {"node": node.pk, "devices": node.devices.count(), "message": node.agent_message}
        return Response(body, status=status.HTTP_202_ACCEPTED)
