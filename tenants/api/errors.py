"""Turning exceptions into the API's one error shape (see tenants/api/schema.py)."""

from __future__ import annotations

from typing import Any

from django.core.exceptions import PermissionDenied as DjangoPermissionDenied
from django.core.exceptions import ValidationError as DjangoValidationError
from django.http import Http404
from rest_framework import exceptions, status
from rest_framework.response import Response


class Refused(exceptions.APIException):
    """A well-formed request the domain said no to (insufficient credits, round closed, over
    budget...): 409, because it conflicts with the current state, and retrying the same
    request may succeed once that state changes."""

    status_code = status.HTTP_409_CONFLICT
    default_code = "refused"
    default_detail = "The request was refused."

    def __init__(self, message: str, *, fields: dict[str, Any] | None = None) -> None:
        super().__init__(message, self.default_code)
        self.fields = fields or {}


class Missing(exceptions.NotFound):
    """An object named in the request (path or body) is not there for the caller; another
    tenant's object reads exactly the same."""

    def __init__(self, message: str, *, fields: dict[str, Any] | None = None) -> None:
        super().__init__(message, "not_found")
        self.fields = fields or {}


def _flatten(detail: Any, prefix: str = "") -> dict[str, list[str]]:
    if isinstance(detail, dict):
        out: dict[str, list[str]] = {}
        for key, value in detail.items():
            name = f"{prefix}.{key}" if prefix else str(key)
            for field, messages in _flatten(value, name).items():
                out.setdefault(field, []).extend(messages)
        return out
    if isinstance(detail, list):
        if all(not isinstance(item, dict | list) for item in detail):
            return {prefix or "non_field_errors": [str(item) for item in detail]}
        out = {}
        for index, item in enumerate(detail):
            name = f"{prefix}.{index}" if prefix else str(index)
            for field, messages in _flatten(item, name).items():
                out.setdefault(field, []).extend(messages)
        return out
    return {prefix or "non_field_errors": [str(detail)]}


def to_api_exception(exc: Exception) -> exceptions.APIException | None:
    """The DRF exception standing for a Django one; None for anything unexpected (-> 500)."""
    if isinstance(exc, exceptions.APIException):
        return exc
    if isinstance(exc, Http404):
        return exceptions.NotFound(str(exc) or None)
    if isinstance(exc, DjangoPermissionDenied):
        return exceptions.PermissionDenied(str(exc) or None)
    if isinstance(exc, DjangoValidationError):
        detail = exc.message_dict if hasattr(exc, "error_dict") else exc.messages
        return exceptions.ValidationError(detail)
    return None


def error_response(exc: exceptions.APIException) -> Response:
    headers: dict[str, str] = {}
    if getattr(exc, "auth_header", None):
        headers["WWW-Authenticate"] = exc.auth_header
    if getattr(exc, "wait", None) is not None:
        headers["Retry-After"] = str(int(exc.wait))
    fields: dict[str, list[str]] = {}
    if isinstance(exc, exceptions.ValidationError):
        code = "invalid"
        fields = _flatten(exc.detail)
        general = fields.get("non_field_errors", [])
        named = sorted(f for f in fields if f != "non_field_errors")
        if general and not named:
            message = " ".join(general)
        else:
            message = "Fix the field(s) " + ", ".join(named) + "; error.fields says how."
    else:
        code = exc.get_codes() if isinstance(exc.get_codes(), str) else exc.default_code
        message = str(exc.detail)
        extra = getattr(exc, "fields", None)
        if extra:
            fields = _flatten(extra)
    body = {"error": {"code": str(code), "message": message, "fields": fields}}
    return Response(body, status=exc.status_code, headers=headers)
