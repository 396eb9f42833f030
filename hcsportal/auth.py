"""Login lockout on every door (django-axes): the login page, the admin's and the API's token login.

After ``AXES_FAILURE_LIMIT`` failed logins for one username from one address, that username is locked out
from that address for ``AXES_COOLOFF_TIME``. People get a page that says so (429); API clients get a 429
with a ``detail`` and a ``Retry-After`` header.
"""

from __future__ import annotations

from axes import utils as axes_utils
from axes.helpers import get_client_ip_address
from django.conf import settings
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from drf_spectacular.utils import OpenApiResponse, extend_schema
from rest_framework import exceptions
from rest_framework.authtoken.models import Token
from rest_framework.authtoken.serializers import AuthTokenSerializer
from rest_framework.authtoken.views import ObtainAuthToken
from rest_framework.response import Response

from apps.vdc.api.schema import ErrorDetailSerializer


def lockout_message() -> str:
    """What a locked-out user is told, with the limit and the cool-off in force."""
    minutes = int(settings.AXES_COOLOFF_TIME.total_seconds() // 60)
    return (
        f"Too many failed logins: after {settings.AXES_FAILURE_LIMIT} failures this username is locked out "
        f"from your address for {minutes} minutes. Try again later, or ask a platform admin to unlock it."
    )


def locked_out_page(request: HttpRequest, original_response=None, credentials=None) -> HttpResponse:
    """``AXES_LOCKOUT_CALLABLE``: the answer of the login page and the admin's login to a locked-out user."""
    return render(request, "registration/locked_out.html", {"message": lockout_message()}, status=429)


class ObtainAuthTokenView(ObtainAuthToken):
    """DRF's token login, with a clear 429 instead of "Unable to log in" while the username is locked out."""

    @extend_schema(
        description="A token for a username and password. After too many failed logins for a username from one "
        "address, that username is locked out from there for a while (429, with Retry-After).",
        responses={
            200: AuthTokenSerializer,
            429: OpenApiResponse(ErrorDetailSerializer, description="Too many failed logins: locked out for now."),
        },
    )
    def post(self, request, *args, **kwargs):
        serializer = self.get_serializer(data=request.data)
        if not serializer.is_valid():
            # axes marks the request it saw fail (DRF's, here) once the failure limit is reached.
            if getattr(request, "axes_locked_out", False):
                raise exceptions.Throttled(wait=settings.AXES_COOLOFF_TIME.total_seconds(), detail=lockout_message())
            raise exceptions.ValidationError(serializer.errors)
        user = serializer.validated_data["user"]
        # A token login sends no user_logged_in (that would start a session), so clear the failures here,
        # as a page login does.
        if settings.AXES_ENABLED and settings.AXES_RESET_ON_SUCCESS:
            axes_utils.reset(ip=get_client_ip_address(request), username=user.get_username())
        token, _ = Token.objects.get_or_create(user=user)
        return Response({"token": token.key})


obtain_auth_token = ObtainAuthTokenView.as_view()
