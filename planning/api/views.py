"""Planning endpoints: a team's planned campaigns (members read, managers declare) and
capacity scenarios (platform admins). Writes go through the same services as the pages."""

from __future__ import annotations

from django.shortcuts import get_object_or_404
from drf_spectacular.utils import extend_schema
from rest_framework import mixins, permissions, status, viewsets
from rest_framework.decorators import action
from rest_framework.exceptions import PermissionDenied
from rest_framework.response import Response

from core.api import JSONParser, StrictLimitOffsetPagination
from planning.api.serializers import (
    PlannedCampaignCreateSerializer,
    PlannedCampaignSerializer,
    ScenarioCreateSerializer,
    ScenarioSerializer,
)
from planning.errors import PlanningError
from planning.models import PlannedCampaign, Scenario
from planning.selectors import planned_campaign_get
from planning.services.campaigns import planned_campaign_declare, planned_campaign_withdraw
from planning.services.scenarios import scenario_create
from tenants.api.base import TenantScopedViewSet
from tenants.api.errors import Refused


def _document(data: dict) -> dict:
    """The validated body as the scenario document: fields not given stay out of it."""
    return {key: value for key, value in data.items() if value is not None}


class PlannedCampaignViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, TenantScopedViewSet):
    """The caller's team's planned campaigns, withdrawn ones included."""

    queryset = PlannedCampaign.objects.all()
    serializer_class = PlannedCampaignSerializer
    http_method_names = ["get", "post", "head", "options"]

    def base_queryset(self):
        return PlannedCampaign.objects.select_related("tenant").prefetch_related("tiers")

    def _manager(self) -> None:
        if not self.request.user.membership.is_manager:
            raise PermissionDenied("Only the team's managers declare or withdraw campaigns.")

    @extend_schema(
        request=PlannedCampaignCreateSerializer,
        responses={201: PlannedCampaignSerializer},
        summary="Declare a planned campaign (managers)",
    )
    def create(self, request):
        self._manager()
        serializer = PlannedCampaignCreateSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        try:
            campaign = planned_campaign_declare(
                tenant=self.tenant, actor=request.user, **serializer.validated_data
            )
        except PlanningError as exc:
            raise Refused(str(exc)) from exc
        fresh = planned_campaign_get(self.tenant, campaign.pk)
        return Response(PlannedCampaignSerializer(fresh).data, status=status.HTTP_201_CREATED)

    @extend_schema(request=None, responses={200: PlannedCampaignSerializer},
                   summary="Withdraw a planned campaign (managers)")  # fmt: skip
    @action(detail=True, methods=["post"])
    def withdraw(self, request, pk=None):
        campaign = self.get_object()
        self._manager()
        planned_campaign_withdraw(tenant=self.tenant, actor=request.user, campaign_id=campaign.pk)
        return Response(
            PlannedCampaignSerializer(planned_campaign_get(self.tenant, campaign.pk)).data
        )


class ScenarioViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, viewsets.GenericViewSet):
    """Capacity scenarios, newest first. Creating one queues its run; poll it for progress."""

    queryset = Scenario.objects.select_related("created_by")
    serializer_class = ScenarioSerializer
    permission_classes = [permissions.IsAdminUser]
    parser_classes = [JSONParser]
    pagination_class = StrictLimitOffsetPagination
    http_method_names = ["get", "post", "head", "options"]

    @extend_schema(
        request=ScenarioCreateSerializer,
        responses={201: ScenarioSerializer},
        summary="Keep a scenario and queue its run (platform admins)",
    )
    def create(self, request):
        serializer = ScenarioCreateSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        document = _document(dict(serializer.validated_data))
        document["changes"] = [_document(dict(c)) for c in document.get("changes", [])]
        document["options"] = [_document(dict(o)) for o in document.get("options", [])]
        if "targets" in document:
            document["targets"] = _document(dict(document["targets"]))
        try:
            scenario = scenario_create(actor=request.user, document=document)
        except PlanningError as exc:
            raise Refused(str(exc)) from exc
        scenario = get_object_or_404(self.get_queryset(), pk=scenario.pk)
        return Response(ScenarioSerializer(scenario).data, status=status.HTTP_201_CREATED)
