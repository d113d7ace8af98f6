"""The API's exception handler (REST_FRAMEWORK["EXCEPTION_HANDLER"]).

It lives in market because market is the highest app whose domain errors the API turns into
4xx answers: MarketError and TenantError both become ``refused`` (400) with their message.
"""

from __future__ import annotations

from rest_framework.response import Response
from rest_framework.views import set_rollback

from market.errors import MarketError
from tenants.api.errors import Refused, error_response, to_api_exception
from tenants.errors import TenantError


def api_exception_handler(exc: Exception, context: dict) -> Response | None:
    if isinstance(exc, MarketError | TenantError):
        exc = Refused(str(exc), fields=getattr(exc, "fields", None))
    api_exc = to_api_exception(exc)
    if api_exc is None:
        return None  # a bug: let Django answer 500 and log it
    # As DRF's own handler does: a request-wide transaction (ATOMIC_REQUESTS) must not commit.
    set_rollback()
    return error_response(api_exc)
