"""POST /api/v1/billing/price-preview/: the hourly list price of a request before it is submitted."""

from __future__ import annotations

from decimal import Decimal

from django.core.exceptions import ValidationError as DjangoValidationError
from django.http import Http404
from drf_spectacular.utils import OpenApiResponse, extend_schema
from rest_framework import serializers
from rest_framework.permissions import IsAuthenticated
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from apps.billing.services import hourly_price_of_request, price_book
from apps.core.api.schema import ErrorDetailSerializer
from apps.vdc.models import VDC
from apps.vdc.policy import visible_projects, visible_vdcs


class PricePreviewRequestSerializer(serializers.Serializer):
    vdc = serializers.CharField(required=False, help_text="VDC id or name; the default VDC when omitted")
    project = serializers.IntegerField(required=False, help_text="Optional: the project that would submit")
    cpu = serializers.DecimalField(max_digits=8, decimal_places=2, min_value=Decimal(0), default=Decimal(1))
    memory_gib = serializers.DecimalField(max_digits=10, decimal_places=2, min_value=Decimal(0), default=Decimal(1))
    gpu_spec = serializers.CharField(required=False, allow_blank=True, default="", max_length=128)
    instances = serializers.IntegerField(min_value=1, max_value=10_000, default=1)


class PricePreviewSerializer(serializers.Serializer):
    vdc = serializers.CharField()
    hourly_price = serializers.DecimalField(max_digits=16, decimal_places=4, allow_null=True)
    currency = serializers.CharField(allow_null=True)
    instances = serializers.IntegerField()


class PricePreviewView(APIView):
    """The hourly list price (before discounts) of cpu, memory, a GPU spec and instances in a VDC.

    ``hourly_price`` is null when no price applies. A VDC or project you cannot see answers 404.
    """

    permission_classes = [IsAuthenticated]

    @extend_schema(
        request=PricePreviewRequestSerializer,
        responses={
            200: PricePreviewSerializer,
            404: OpenApiResponse(
                ErrorDetailSerializer, description="No VDC or project you can see by that id or name."
            ),
        },
    )
    def post(self, request: Request) -> Response:
        data = PricePreviewRequestSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        values = data.validated_data
        vdcs = visible_vdcs(request.user)
        if "vdc" in values:
            key = values["vdc"]
            # isdecimal, not isdigit: "²" is a digit that int() refuses.
            vdc = vdcs.filter(pk=int(key)).first() if key.isdecimal() else vdcs.filter(name=key).first()
        else:
            vdc = VDC.default()
            vdc = vdc if vdc is not None and vdcs.filter(pk=vdc.pk).exists() else None
        if vdc is None:
            raise Http404("No such VDC.")
        if "project" in values and not visible_projects(request.user).filter(pk=values["project"]).exists():
            raise Http404("No such project.")
        try:
            price = hourly_price_of_request(
                vdc, values["cpu"], values["memory_gib"], values["gpu_spec"], values["instances"]
            )
        except DjangoValidationError as exc:
            raise serializers.ValidationError({"gpu_spec": exc.messages})
        body = {
            "vdc": vdc.name,
            "hourly_price": price,
            "currency": price_book(vdc).currency,
            "instances": values["instances"],
        }
        return Response(PricePreviewSerializer(body).data)
