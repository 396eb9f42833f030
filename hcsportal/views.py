"""Site-wide error views: a URL under /api/ that matches nothing answers JSON like the rest of the API."""

from __future__ import annotations

from django.http import HttpRequest, HttpResponse, JsonResponse
from django.views.defaults import page_not_found


def not_found(request: HttpRequest, exception: Exception) -> HttpResponse:
    """``{"detail": "Not found."}`` for API clients, the portal's page for people."""
    if request.path.startswith("/api/"):
        return JsonResponse({"detail": "Not found."}, status=404)
    return page_not_found(request, exception)
