"""The API's exception handler (REST_FRAMEWORK["EXCEPTION_HANDLER"]).

Every app's domain error (core.errors.DomainError: MarketError, TenantError, TelemetryError,
PlanningError) becomes ``refused`` (409) with its message, whichever app raised it: a service
may pass on a refusal from another app, and an app's view catching only its own error would
otherwise let it through as a 500 (tests/api/test_domain_errors.py).
"""

from __future__ import annotations

from rest_framework.response import Response
from rest_framework.views import set_rollback

from core.errors import DomainError
from tenants.api.errors import Refused, error_response, to_api_exception


def api_exception_handler(exc: Exception, context: dict) -> Response | None:
    if isinstance(exc, DomainError):
        exc = Refused(str(exc), fields=getattr(exc, "fields", None))
    api_exc = to_api_exception(exc)
    if api_exc is None:
        return None  # a bug: let Django answer 500 and log it
    # As DRF's own handler does: a request-wide transaction (ATOMIC_REQUESTS) must not commit.
    set_rollback()
    return error_response(api_exc)
