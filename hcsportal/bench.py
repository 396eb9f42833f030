"""The load benchmark's yardstick: a minimal authenticated DRF write of one row (``benchmarks/api_load.py``).

Routed only when ``HCS_BENCH_ENDPOINTS`` is on, which the benchmark sets for the server it starts; the
portal never serves it otherwise. It goes through the same middleware, token authentication, parsing and
rendering as every API call, so submit latency can be read against the framework's own floor.
"""

from __future__ import annotations

from drf_spectacular.utils import extend_schema, inline_serializer
from rest_framework import serializers, status
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from apps.tasks.choices import EventKind
from apps.tasks.models import TaskEvent
from apps.vdc.api.permissions import HasPlatformPermission


class OneRowSerializer(serializers.Serializer):
    task = serializers.IntegerField(min_value=1)


class OneRowView(APIView):
    """``POST bench/one-row/ {"task": id}``: one INSERT, an event on the task's timeline (platform admins)."""

    permission_classes = [HasPlatformPermission]
    platform_permission = "tasks.add_taskevent"

    @extend_schema(
        request=OneRowSerializer,
        responses={201: inline_serializer("OneRow", {"id": serializers.IntegerField()})},
    )
    def post(self, request: Request) -> Response:
        body = OneRowSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        event = TaskEvent.objects.create(
            task_id=body.validated_data["task"], kind=EventKind.STATUS, message="benchmark", actor=request.user
        )
        return Response({"id": event.pk}, status=status.HTTP_201_CREATED)
