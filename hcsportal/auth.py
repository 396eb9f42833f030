"""Login lockout on every door (django-axes): the login page, the admin's and the API's token login.

After ``AXES_FAILURE_LIMIT`` failed logins for one username from one address, that username is locked out
from that address for ``AXES_COOLOFF_TIME``; after ``HCS_LOGIN_ADDRESS_FAILURE_LIMIT`` failed logins from one
address, whatever the usernames, every login from that address is. People get a page that says so (429); API
clients get a 429 with a ``detail`` and a ``Retry-After`` header.

The address is the web server's client address (``REMOTE_ADDR``): which proxies may set it through
X-Forwarded-For is the web server's decision (``FORWARDED_ALLOW_IPS``), never a header read here.
"""

from __future__ import annotations

from axes import utils as axes_utils
from axes.handlers.database import AxesDatabaseHandler
from axes.helpers import get_client_ip_address
from axes.models import AccessAttempt
from django.conf import settings
from django.db.models import Sum
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django.utils import timezone
from drf_spectacular.utils import OpenApiResponse, extend_schema
from rest_framework import exceptions
from rest_framework.authtoken.models import Token
from rest_framework.authtoken.serializers import AuthTokenSerializer
from rest_framework.authtoken.views import ObtainAuthToken
from rest_framework.response import Response

from apps.core.api.schema import ErrorDetailSerializer


def client_address(request: HttpRequest) -> str:
    """``AXES_CLIENT_IP_CALLABLE``: the address the web server gives the request, never a forwarding header."""
    return request.META.get("REMOTE_ADDR", "")


def address_failures(request: HttpRequest) -> int:
    """Failed logins from the request's address within the cool-off, summed over every username."""
    since = timezone.now() - settings.AXES_COOLOFF_TIME
    attempts = AccessAttempt.objects.filter(ip_address=client_address(request), attempt_time__gte=since)
    return attempts.aggregate(total=Sum("failures_since_start"))["total"] or 0


def address_locked_out(request: HttpRequest) -> bool:
    """Whether the request's address has failed ``HCS_LOGIN_ADDRESS_FAILURE_LIMIT`` logins within the cool-off."""
    return address_failures(request) >= settings.HCS_LOGIN_ADDRESS_FAILURE_LIMIT


class LoginLockoutHandler(AxesDatabaseHandler):
    """``AXES_HANDLER``: axes' database handler, which locks a username out from an address, plus a limit on
    failed logins per address whatever the username (one address trying many usernames)."""

    def is_locked(self, request, credentials: dict | None = None) -> bool:
        if super().is_locked(request, credentials):
            return True
        return settings.AXES_LOCK_OUT_AT_FAILURE and address_locked_out(request)


def lockout_message(request: HttpRequest) -> str:
    """What a locked-out user is told, with the limit and the cool-off in force."""
    minutes = int(settings.AXES_COOLOFF_TIME.total_seconds() // 60)
    if address_locked_out(request):
        return (
            f"Too many failed logins from your address: after {settings.HCS_LOGIN_ADDRESS_FAILURE_LIMIT} failures, "
            f"whatever the usernames, logins from it are refused for {minutes} minutes. Try again later, or ask a "
            "platform admin to unlock it."
        )
    return (
        f"Too many failed logins: after {settings.AXES_FAILURE_LIMIT} failures this username is locked out "
        f"from your address for {minutes} minutes. Try again later, or ask a platform admin to unlock it."
    )


def locked_out_page(request: HttpRequest, original_response=None, credentials=None) -> HttpResponse:
    """``AXES_LOCKOUT_CALLABLE``: the answer of the login page and the admin's login to a locked-out user."""
    return render(request, "registration/locked_out.html", {"message": lockout_message(request)}, status=429)


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
                raise exceptions.Throttled(
                    wait=settings.AXES_COOLOFF_TIME.total_seconds(), detail=lockout_message(request)
                )
            raise exceptions.ValidationError(serializer.errors)
        user = serializer.validated_data["user"]
        # A token login sends no user_logged_in (that would start a session), so clear the failures here,
        # as a page login does.
        if settings.AXES_ENABLED and settings.AXES_RESET_ON_SUCCESS:
            axes_utils.reset(ip=get_client_ip_address(request), username=user.get_username())
        token, _ = Token.objects.get_or_create(user=user)
        return Response({"token": token.key})


obtain_auth_token = ObtainAuthTokenView.as_view()
