"""What every tenant-scoped API view shares: JSON only, paginated, rows through tenants.access."""

from __future__ import annotations

from django.db.models import Model, QuerySet
from rest_framework import permissions, viewsets
from rest_framework.settings import api_settings
from rest_framework.throttling import SimpleRateThrottle

from core.api import JSONParser, StrictLimitOffsetPagination
from core.ratelimit import CACHE_ERRORS, rate_count, rate_limit_fail_open
from tenants.access import access_object, membership_of, scoped
from tenants.models import ApiToken, Tenant


class IsTenantMember(permissions.BasePermission):
    message = (
        "This account is not a member of any tenant, so it has no tenant data; ask a platform "
        "admin to add it to a team."
    )

    def has_permission(self, request, view) -> bool:
        return membership_of(request.user) is not None


class Pagination(StrictLimitOffsetPagination):
    default_limit = 50
    max_limit = 500


class ScopedThrottle(SimpleRateThrottle):
    """A rate per API token (per user for browser sessions) for one scope of actions: at
    most N requests in each window of the rate's period, counted by ``core.ratelimit``.

    The rate is read from REST_FRAMEWORK["DEFAULT_THROTTLE_RATES"][scope] on every request,
    not when the class is defined, so settings changes (and tests) take effect.
    """

    scope = ""

    def __init__(self, scope: str = "") -> None:
        if scope:
            self.scope = scope
        super().__init__()
        self.left = 0

    def get_rate(self) -> str | None:
        return api_settings.DEFAULT_THROTTLE_RATES.get(self.scope)

    def allow_request(self, request, view) -> bool:
        if self.rate is None:
            return True
        try:
            count, self.left = rate_count(
                key=self.get_cache_key(request, view), seconds=self.duration
            )
        except CACHE_ERRORS as exc:
            rate_limit_fail_open(scope=self.scope, error=exc)
            return True
        return count <= self.num_requests

    def wait(self) -> int:
        """Seconds until the window ends and the count starts again."""
        return self.left

    def get_cache_key(self, request, view) -> str:
        if isinstance(request.auth, ApiToken):
            ident = f"token:{request.auth.pk}"
        elif request.user and request.user.is_authenticated:
            ident = f"user:{request.user.pk}"
        else:
            ident = f"ip:{self.get_ident(request)}"
        return self.cache_format % {"scope": self.scope, "ident": ident}


class TenantScopedViewSet(viewsets.GenericViewSet):
    """Rows of the caller's tenant only: lists through ``scoped``, objects through
    ``access_object`` (another tenant's id is a 404, exactly like a missing one)."""

    permission_classes = [permissions.IsAuthenticated, IsTenantMember]
    parser_classes = [JSONParser]
    pagination_class = Pagination
    # Read by the schema class: every operation here can answer 404 (no tenant, no row).
    tenant_scoped = True
    # Field that points at the tenant, for scoped()/access_object().
    tenant_field = "tenant"
    # Scope name -> actions it limits, e.g. {"bids": {"create", "cancel"}}.
    throttle_scopes: dict[str, set[str]] = {}

    @property
    def tenant(self) -> Tenant:
        return membership_of(self.request.user).tenant

    def base_queryset(self) -> QuerySet:
        return self.queryset.all()

    def get_queryset(self) -> QuerySet:
        if getattr(self, "swagger_fake_view", False):
            return self.queryset.none()
        return scoped(self.base_queryset(), tenant=self.tenant, field=self.tenant_field)

    def get_object(self) -> Model:
        obj = access_object(
            self.base_queryset(), tenant=self.tenant, pk=self.kwargs["pk"], field=self.tenant_field
        )
        self.check_object_permissions(self.request, obj)
        return obj

    def get_throttles(self):
        return [
            ScopedThrottle(scope)
            for scope, actions in self.throttle_scopes.items()
            if getattr(self, "action", None) in actions
        ]
