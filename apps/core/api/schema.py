"""The OpenAPI schema class of the API: every operation documents the error answers it can give.

drf-spectacular documents only the success answer of an operation. The API also answers 400 (bad input or
a refused rule), 401 (no or bad credentials), 403 (a role that may not), 404 (nothing you may see, or a
page past the end of a list), 409 (a delete blocked by objects that still use it, or by tasks holding it) and
415 (a body of a type it does not parse); clients and the schemathesis run in the tests rely on the schema
saying so.
"""

from __future__ import annotations

from drf_spectacular.openapi import AutoSchema
from drf_spectacular.plumbing import ResolvedComponent
from rest_framework import serializers

from apps.core.api.common import ProtectedDestroyMixin


class ErrorDetailSerializer(serializers.Serializer):
    """The body of a 401, 403, 404, 409 or 415 answer (and of a 400 for a body that could not be parsed)."""

    detail = serializers.CharField()


VALIDATION_ERROR = ResolvedComponent(
    name="ValidationError",
    type=ResolvedComponent.SCHEMA,
    object="ValidationError",
    schema={
        "type": "object",
        "description": "Messages by field name (a list of strings, nested for nested fields); errors that concern "
        "no single field are under non_field_errors, and a body that could not be parsed gives detail.",
        "additionalProperties": {},
    },
)
DESCRIPTIONS = {
    "400": "Bad input or a rule refused it; nothing was written.",
    "401": "No or invalid credentials.",
    "403": "Your role may not do this (or, with session authentication, no CSRF token).",
    "404": "No such object, or none you may see; for a list, a page past its end.",
    "409": "Not deleted: other objects still use it, or a task still holds it (a card, or a card of a node); the "
    "detail says which.",
    "415": "The body's Content-Type is none the API parses (JSON, form or multipart).",
}


class ErrorDocumentingAutoSchema(AutoSchema):
    """drf-spectacular's AutoSchema plus the 400 / 401 / 403 / 404 / 409 / 415 answers each operation can give.

    An operation that declares an answer itself (``@extend_schema(responses=...)``) keeps it.
    """

    def _get_response_bodies(self, direction="response"):
        responses = super()._get_response_bodies(direction)
        if direction != "response":
            return responses
        for code in self._error_codes():
            if code in responses:
                continue
            if code == "400":
                self.registry.register_on_missing(VALIDATION_ERROR)
                body = self._get_response_for_code(VALIDATION_ERROR.ref, code, direction=direction)
            else:
                body = self._get_response_for_code(ErrorDetailSerializer, code, direction=direction)
            responses[code] = {**body, "description": DESCRIPTIONS[code]}
        return responses

    def _error_codes(self) -> list[str]:
        codes = ["401", "403"]
        takes_body = self.method in ("POST", "PUT", "PATCH") and self.get_request_serializer() is not None
        # A view that validates its query string says so with ``validates_query = True``; so does one action of a
        # viewset, on its method.
        action = getattr(self.view, getattr(self.view, "action", None) or "", None)
        if (
            takes_body
            or self.method == "DELETE"
            or self._is_list_view()
            or getattr(self.view, "validates_query", False)
            or getattr(action, "validates_query", False)
        ):
            codes.append("400")
        if takes_body:
            codes.append("415")
        if "{" in self.path or self._is_list_view():
            codes.append("404")
        if self.method == "DELETE" and isinstance(self.view, ProtectedDestroyMixin):
            codes.append("409")
        return sorted(codes)
