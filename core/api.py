"""Query parameters for every API list: strict limit/offset pagination, and filter parsing;
and the API's JSON parser.

Both refuse malformed values instead of ignoring them.

DRF's LimitOffsetPagination falls back to its defaults on ``?limit=0.5`` or ``?offset=-3``;
a client that sent them has a bug it should hear about. This module lives in core, below
every app, so every app's API can use it.
"""

from __future__ import annotations

from rest_framework import exceptions, parsers, serializers
from rest_framework.exceptions import ParseError, ValidationError
from rest_framework.pagination import LimitOffsetPagination

# The largest primary key the database holds (BigAutoField). An id past it names no row; left
# to the database it raised instead of answering "not found".
MAX_ID = 2**63 - 1


class StrictLimitOffsetPagination(LimitOffsetPagination):
    default_limit = 50
    max_limit = 500

    def _whole(self, request, name: str, minimum: int, maximum: int | None) -> int | None:
        raw = request.query_params.get(name)
        if raw is None:
            return None
        try:
            value = int(raw)
        except ValueError:
            value = None
        if value is None or value < minimum or (maximum is not None and value > maximum):
            bound = f" and at most {maximum}" if maximum is not None else ""
            raise ValidationError({name: [f"must be a whole number of at least {minimum}{bound}"]})
        return value

    def get_limit(self, request) -> int:
        limit = self._whole(request, self.limit_query_param, 1, self.max_limit)
        return self.default_limit if limit is None else limit

    def get_offset(self, request) -> int:
        offset = self._whole(request, self.offset_query_param, 0, None)
        return offset or 0

    def get_schema_operation_parameters(self, view):
        parameters = super().get_schema_operation_parameters(view)
        for parameter in parameters:
            schema = parameter["schema"]
            if parameter["name"] == self.limit_query_param:
                schema.update(minimum=1, maximum=self.max_limit, default=self.default_limit)
            elif parameter["name"] == self.offset_query_param:
                schema.update(minimum=0, default=0)
        return parameters


def query_filters(request, serializer_class) -> dict:
    """Validated query parameters (400 with field messages if they are malformed).

    A plain dict, not the QueryDict: DRF reads an empty form value as "not given", but in a
    query string ``?status=`` is a mistake the client should hear about. A parameter given
    twice is refused for the same reason.
    """
    repeated = sorted(k for k, values in request.query_params.lists() if len(values) > 1)
    if repeated:
        raise exceptions.ValidationError({k: ["give this parameter once"] for k in repeated})
    serializer = serializer_class(data=request.query_params.dict())
    serializer.is_valid(raise_exception=True)
    return serializer.validated_data


class JSONParser(parsers.JSONParser):
    """DRF's JSON parser, with JSON nested past Python's recursion limit refused as a 400
    (the stock parser lets the RecursionError through as a 500)."""

    def parse(self, stream, media_type=None, parser_context=None):
        try:
            return super().parse(stream, media_type, parser_context)
        except RecursionError:
            raise ParseError("JSON parse error - the body is nested too deeply") from None


class StrictIntegerField(serializers.IntegerField):
    """An integer in a JSON body: a JSON integer only. DRF's IntegerField also takes "3",
    3.0 and true, which the API documents as refused."""

    default_error_messages = {
        "invalid": "must be a whole number written as a JSON integer (not a string or a float)."
    }

    def to_internal_value(self, data):
        if type(data) is not int:
            self.fail("invalid")
        return super().to_internal_value(data)


class StrictFloatField(serializers.FloatField):
    """A number in a JSON body: a JSON number only (DRF's FloatField also takes "1.5")."""

    default_error_messages = {
        "invalid": "must be a number written as a JSON number (not a string)."
    }

    def to_internal_value(self, data):
        if isinstance(data, bool) or not isinstance(data, int | float):
            self.fail("invalid")
        return super().to_internal_value(data)


class StrictCharField(serializers.CharField):
    """Text in a JSON body: a JSON string only (DRF's CharField also takes 5 and true)."""

    default_error_messages = {"invalid": "must be a JSON string."}

    def to_internal_value(self, data):
        if not isinstance(data, str):
            self.fail("invalid")
        return super().to_internal_value(data)


class StrictRegexField(serializers.RegexField):
    """A JSON string matching a pattern (DRF's RegexField also takes numbers)."""

    def to_internal_value(self, data):
        if not isinstance(data, str):
            self.fail("invalid")
        return super().to_internal_value(data)
