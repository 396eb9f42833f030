"""Helpers the API of every app shares: service errors as DRF errors, model rules in serializers, id-or-name fields."""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from django.core.exceptions import ValidationError as DjangoValidationError
from django.db import transaction
from django.db.models import ProtectedError, QuerySet
from drf_spectacular.extensions import OpenApiSerializerFieldExtension
from rest_framework import serializers, status
from rest_framework.exceptions import APIException


@contextmanager
def service_errors() -> Iterator[None]:
    """Turn a service's Django ValidationError into a DRF 400 with the same field messages.

    Django's PermissionDenied needs no help: DRF already answers it with 403 and its message.
    """
    try:
        yield
    except DjangoValidationError as exc:
        raise serializers.ValidationError(serializers.as_serializer_error(exc))


class ModelCleanMixin:
    """Run the model's ``clean()`` on the would-be instance, so the API gives the same messages as forms and admin.

    Field shapes are checked by the serializer fields first; only the model's cross-field rules run here.
    """

    def validate(self, attrs: dict) -> dict:
        attrs = super().validate(attrs)
        model = self.Meta.model
        concrete = {f.name for f in model._meta.concrete_fields}
        candidate = copy.copy(self.instance) if self.instance is not None else model()
        for name, value in attrs.items():
            if name in concrete:
                setattr(candidate, name, value)
        with service_errors():
            candidate.clean()
        return attrs


class IdOrNameRelatedField(serializers.RelatedField):
    """A related object given by id (a JSON integer) or by name (a string); shown as its id.

    ``scope(user)`` limits the choices to what the requesting user may see, so an invisible object reads
    as "does not exist".
    """

    default_error_messages = {
        "does_not_exist": "No {model} with {kind} {value!r} that you can see.",
        "incorrect_type": "Expected an id (integer) or a name (string), got {data_type}.",
    }

    def __init__(self, scope: Callable[[object], QuerySet] | None = None, slug_field: str = "name", **kwargs):
        self.scope = scope
        self.slug_field = slug_field
        super().__init__(**kwargs)

    def get_queryset(self) -> QuerySet:
        queryset = super().get_queryset()
        request = self.context.get("request")
        if self.scope is not None and request is not None:
            queryset = queryset & self.scope(request.user)
        return queryset

    def to_internal_value(self, data):
        queryset = self.get_queryset()
        name = queryset.model._meta.verbose_name
        if isinstance(data, bool) or not isinstance(data, int | str):
            self.fail("incorrect_type", data_type=type(data).__name__)
        kind, lookup = ("id", {"pk": data}) if isinstance(data, int) else ("name", {self.slug_field: data})
        # No name holds NUL (the database cannot even compare one).
        found = None if "\x00" in str(data) else queryset.filter(**lookup).first()
        if found is None:
            self.fail("does_not_exist", model=name, kind=kind, value=data)
        return found

    def to_representation(self, value) -> int:
        return value.pk


class ScopedPrimaryKeyRelatedField(serializers.PrimaryKeyRelatedField):
    """A related object by id among those ``scope(user)`` gives the requesting user.

    The scope is applied only when a value is read, so serializers that merely show objects build no queryset.
    """

    def __init__(self, scope: Callable[[object], QuerySet], **kwargs):
        self.scope = scope
        super().__init__(**kwargs)

    def get_queryset(self) -> QuerySet:
        request = self.context.get("request")
        return self.scope(request.user) if request is not None else super().get_queryset()


class CachedFieldsMixin:
    """A serializer whose fields are built once per class; each instance gets a copy.

    Building a model serializer's fields walks the model (milliseconds for a wide model, on every request);
    copying the built ones is what DRF does for declared fields anyway. Only for serializers whose fields do
    not depend on the request or the instance.
    """

    def get_fields(self) -> dict:
        cls = type(self)
        template = cls.__dict__.get("_fields_template")
        if template is None:
            template = super().get_fields()
            cls._fields_template = template
        return copy.deepcopy(template)


class SlugField(serializers.SlugRelatedField):
    """A related object by a text key (e.g. a username); text with NUL is "does not exist", not a server error."""

    def to_internal_value(self, data):
        if isinstance(data, str) and "\x00" in data:
            self.fail("does_not_exist", slug_name=self.slug_field, value=data.replace("\x00", ""))
        return super().to_internal_value(data)


class Conflict(APIException):
    status_code = status.HTTP_409_CONFLICT
    default_detail = "The object is still in use."
    default_code = "conflict"


class DeletionRefused(ProtectedError):
    """A deletion a rule refuses (raised from a ``pre_delete`` receiver), with a message for people saying why: a
    card a job holds (docs/rules.md#cards). The API answers it with 409 and that message."""


class ProtectedDestroyMixin:
    """Answer 409 with what still uses the object, instead of a server error, when a PROTECT relation or a
    deletion rule (``DeletionRefused``, also raised for the rows a deletion cascades to) blocks delete."""

    def perform_destroy(self, instance) -> None:
        try:
            # In a savepoint: a refused deletion breaks the transaction it ran in, which the request goes on using.
            with transaction.atomic():
                instance.delete()
        except DeletionRefused as exc:
            raise Conflict(f"Cannot delete {instance}: {exc.args[0]}")
        except ProtectedError as exc:
            used_by = sorted({str(obj._meta.verbose_name_plural) for obj in exc.protected_objects})
            raise Conflict(f"Cannot delete {instance}: still used by {', '.join(used_by)}.")


class IdOrNameSchema(OpenApiSerializerFieldExtension):
    """In the schema, an id-or-name field takes an integer or a string in requests and answers an integer id."""

    target_class = IdOrNameRelatedField
    match_subclasses = True

    def map_serializer_field(self, auto_schema, direction):
        if direction == "response":
            return {"type": "integer"}
        return {"oneOf": [{"type": "integer"}, {"type": "string"}], "description": "An id (integer) or a name (string)"}
