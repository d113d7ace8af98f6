"""Tenant endpoints: who am I, balance, ledger, budgets, campaigns, notifications."""

from __future__ import annotations

from django.views.decorators.csrf import csrf_exempt
from drf_spectacular.utils import extend_schema
from rest_framework import exceptions, mixins, permissions
from rest_framework.renderers import JSONRenderer
from rest_framework.response import Response
from rest_framework.views import APIView

from core.api import query_filters
from tenants.access import membership_of, require_tenant
from tenants.api.base import IsTenantMember, TenantScopedViewSet
from tenants.api.errors import error_response
from tenants.api.serializers import (
    BalanceSerializer,
    BudgetSerializer,
    CampaignSerializer,
    LedgerFilterSerializer,
    MeSerializer,
    NotificationFilterSerializer,
    NotificationSerializer,
    TransferSerializer,
)
from tenants.budgets import budget_usage
from tenants.ledger import balance_get
from tenants.models import ApiToken, Budget, Campaign, Notification, Transfer
from tenants.selectors import budgets_of, campaigns_of, ledger_transfers, notifications_of


class MeView(APIView):
    permission_classes = [permissions.IsAuthenticated]

    @extend_schema(responses=MeSerializer, summary="The caller: user, tenant, role, token")
    def get(self, request):
        membership = membership_of(request.user)
        data = {
            "username": request.user.get_username(),
            "is_staff": request.user.is_staff,
            "tenant": membership.tenant if membership else None,
            "role": membership.role if membership else None,
            "token": request.auth.name if isinstance(request.auth, ApiToken) else None,
        }
        return Response(MeSerializer(data).data)


class BalanceView(APIView):
    permission_classes = [permissions.IsAuthenticated, IsTenantMember]
    tenant_scoped = True

    @extend_schema(responses=BalanceSerializer, summary="The tenant's balance (credits)")
    def get(self, request):
        balance = balance_get(tenant=require_tenant(request.user))
        return Response(
            BalanceSerializer(
                {"available": balance.available, "escrow": balance.escrow, "total": balance.total}
            ).data
        )


class LedgerViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, TenantScopedViewSet):
    """The tenant's transfers, newest first."""

    queryset = Transfer.objects.all()
    serializer_class = TransferSerializer

    def base_queryset(self):
        return ledger_transfers(tenant=self.tenant)

    def get_queryset(self):
        if self.action != "list" or getattr(self, "swagger_fake_view", False):
            return super().get_queryset()
        filters = query_filters(self.request, LedgerFilterSerializer)
        return ledger_transfers(tenant=self.tenant, **filters)

    @extend_schema(parameters=[LedgerFilterSerializer], summary="The tenant's ledger transfers")
    def list(self, request, *args, **kwargs):
        return super().list(request, *args, **kwargs)


class BudgetViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, TenantScopedViewSet):
    """The tenant's budgets with their usage in the current window."""

    queryset = Budget.objects.all()
    serializer_class = BudgetSerializer

    def base_queryset(self):
        return budgets_of(tenant=self.tenant)

    def get_serializer(self, instance=None, *args, **kwargs):
        budgets = instance if isinstance(instance, list) else [instance] if instance else []
        for budget in budgets:
            budget.usage = budget_usage(budget=budget)
        return super().get_serializer(instance, *args, **kwargs)


class CampaignViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, TenantScopedViewSet):
    queryset = Campaign.objects.all()
    serializer_class = CampaignSerializer

    def base_queryset(self):
        return campaigns_of(tenant=self.tenant)


class NotificationViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, TenantScopedViewSet):
    queryset = Notification.objects.all()
    serializer_class = NotificationSerializer

    def base_queryset(self):
        return notifications_of(tenant=self.tenant)

    def get_queryset(self):
        if self.action != "list" or getattr(self, "swagger_fake_view", False):
            return super().get_queryset()
        unread = bool(query_filters(self.request, NotificationFilterSerializer).get("unread"))
        return notifications_of(tenant=self.tenant, unread=unread)

    @extend_schema(parameters=[NotificationFilterSerializer], summary="The tenant's notifications")
    def list(self, request, *args, **kwargs):
        return super().list(request, *args, **kwargs)


# It changes nothing, and CSRF's HTML 403 would hide the JSON 404 from a mistyped write.
@csrf_exempt
def api_not_found(request, *args, **kwargs):
    """Any /api/ path no route matches: a JSON 404 a client can parse, not an HTML page."""
    path = request.path
    hint = (
        " API paths have no trailing slash."
        if path.startswith("/api/v1/") and path.endswith("/")
        else ""
    )
    response = error_response(exceptions.NotFound(f"No API endpoint at {path}.{hint}"))
    response.accepted_renderer = JSONRenderer()
    response.accepted_media_type = "application/json"
    response.renderer_context = {}
    return response.render()
