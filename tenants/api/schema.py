"""The API's error body and the schema class that declares it on every operation.

Every error the API returns has one shape::

    {"error": {"code": "invalid", "message": "...", "fields": {"quantity": ["..."]}}}

The schema class adds the error responses an operation can produce (from its view's
authentication, permissions, path parameters, body and throttles) next to the ones the view
declares, so a client generator sees every status code without each view listing them.
"""

from __future__ import annotations

from django.core.validators import RegexValidator
from drf_spectacular.openapi import AutoSchema
from rest_framework import serializers
from rest_framework.permissions import AllowAny


class ErrorBodySerializer(serializers.Serializer):
    code = serializers.CharField(
        help_text="Stable machine-readable code, e.g. 'invalid', 'not_found', 'refused'."
    )
    message = serializers.CharField(help_text="What went wrong and what to do about it.")
    fields = serializers.DictField(
        child=serializers.ListField(child=serializers.CharField()),
        help_text="Messages per request field; nested fields are joined with dots ('limits.a100').",
    )


class ErrorSerializer(serializers.Serializer):
    error = ErrorBodySerializer()


ERROR_DESCRIPTIONS = {
    "400": "The request is malformed; `error.fields` says what to fix in which field.",
    "401": "No credentials, or the token is unknown or revoked.",
    "403": "Authenticated, but not allowed to do this (role, tenant membership, CSRF).",
    "404": "No such object here (another tenant's object is also reported missing).",
    "409": "Refused by the market or the ledger in the current state (round closed, not "
    "enough credits, over budget...); `error.message` says why.",
    "415": "The body must be JSON (Content-Type: application/json).",
    "429": "Rate limit reached; retry after the number of seconds in Retry-After.",
}
WRITE_METHODS = {"POST", "PUT", "PATCH"}


# DRF's CharField refuses NUL characters (PostgreSQL cannot store them); say so in the schema.
NO_NUL_PATTERN = r"^[^\u0000]*$"


class GpumarketAutoSchema(AutoSchema):
    def _map_serializer_field(self, field, direction, bypass_extensions=False):
        """Request fields as DRF validates them: no NUL in text, no empty required dicts."""
        schema = super()._map_serializer_field(field, direction, bypass_extensions)
        if direction == "request":
            if isinstance(field, serializers.CharField) and schema.get("type") == "string":
                # A RegexField's own pattern, which also excludes NUL; else the NUL rule.
                patterns = [
                    v.regex.pattern for v in field.validators if isinstance(v, RegexValidator)
                ]
                schema.setdefault("pattern", patterns[0] if patterns else NO_NUL_PATTERN)
                if not field.allow_blank:
                    schema.setdefault("minLength", 1)
            if isinstance(field, serializers.DictField) and not field.allow_empty:
                schema["minProperties"] = 1
        return schema

    def _error_codes(self, operation: dict) -> set[str]:
        view = self.view
        codes: set[str] = set()
        permissions = view.get_permissions()
        if not all(isinstance(p, AllowAny) for p in permissions):
            codes |= {"401", "403"}
        if "{" in self.path or getattr(view, "tenant_scoped", False):
            codes.add("404")
        has_query = any(p.get("in") == "query" for p in operation.get("parameters", []))
        if self.method in WRITE_METHODS or has_query:
            codes.add("400")
        if self.method in WRITE_METHODS:
            codes |= {"409", "415"}
        if view.get_throttles():
            codes.add("429")
        return codes

    def get_operation(self, path, path_regex, path_prefix, method, registry):
        operation = super().get_operation(path, path_regex, path_prefix, method, registry)
        if operation is None:
            return None
        error_ref = self.resolve_serializer(ErrorSerializer, "response").ref
        responses = operation.setdefault("responses", {})
        for code in sorted(self._error_codes(operation)):
            if code in responses:
                continue
            responses[code] = {
                "description": ERROR_DESCRIPTIONS[code],
                "content": {"application/json": {"schema": error_ref}},
            }
            if code == "429":
                responses[code]["headers"] = {
                    "Retry-After": {
                        "schema": {"type": "integer"},
                        "description": "Seconds to wait.",
                    }
                }
        return operation
