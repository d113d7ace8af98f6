"""``Authorization: Bearer gm_...`` for the REST API."""

from __future__ import annotations

from drf_spectacular.extensions import OpenApiAuthenticationExtension
from rest_framework.authentication import BaseAuthentication, get_authorization_header
from rest_framework.exceptions import AuthenticationFailed, PermissionDenied
from rest_framework.permissions import SAFE_METHODS

from core.auth import is_auditor
from tenants.services.tokens import token_authenticate


class ApiTokenAuthentication(BaseAuthentication):
    """Acts as the token's user (and so in that user's tenant). The token is looked up on
    every request, so a revoked token is refused from the next request on."""

    keyword = b"bearer"

    def authenticate(self, request):
        parts = get_authorization_header(request).split()
        if not parts or parts[0].lower() != self.keyword:
            return None
        if len(parts) != 2:
            raise AuthenticationFailed(
                "The Authorization header must be 'Bearer <token>', with the token as one word."
            )
        try:
            raw = parts[1].decode("ascii")
        except UnicodeDecodeError as exc:
            raise AuthenticationFailed("The token contains characters a token never has.") from exc
        token = token_authenticate(raw=raw)
        if token is None:
            raise AuthenticationFailed(
                "This API token is not valid or has been revoked; create a new one on the "
                "API tokens page."
            )
        if not token.user.is_active:
            raise AuthenticationFailed("The account this token belongs to is disabled.")
        if request.method not in SAFE_METHODS and is_auditor(token.user):
            # The session's auditors are stopped before the view (governance's middleware);
            # a token is only known here. Answered by the token lookup: no extra statement.
            # The refusal leaves the request anonymous; the middleware audits it as this user.
            request._request.refused_user = token.user
            raise PermissionDenied("The auditor role reads; it changes nothing.")
        return token.user, token

    def authenticate_header(self, request) -> str:
        # Makes DRF answer 401 (with this challenge) instead of 403 when no credentials came.
        return 'Bearer realm="api"'


class ApiTokenScheme(OpenApiAuthenticationExtension):
    target_class = "tenants.api.authentication.ApiTokenAuthentication"
    name = "tokenAuth"

    def get_security_definition(self, auto_schema):
        return {
            "type": "http",
            "scheme": "bearer",
            "description": "A personal API token (gm_...), created on the API tokens page.",
        }
