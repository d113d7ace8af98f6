"""Change requests over the API: ``/api/v1/approvals``.

Staff and auditors read every request, a team's manager reads the team's (a researcher has
none); staff ask for
changes, managers ask for their team's credits, and staff other than the one who asked
approve or reject (``POST /approvals/{id}/approve`` and ``/reject``); the one who asked may
withdraw a request while it waits (``POST /approvals/{id}/withdraw``). A refusal by the rule
(one's own request, already decided, expired, or the change moved since) is 409 ``refused``.
"""

from __future__ import annotations

from typing import Any

from django.db.models import QuerySet
from drf_spectacular.utils import extend_schema
from rest_framework import exceptions, mixins, permissions, serializers, status, viewsets
from rest_framework.decorators import action
from rest_framework.response import Response

from core.api import JSONParser, StrictLimitOffsetPagination
from core.auth import is_auditor
from governance.models import ChangeRequest
from governance.selectors import requests_all, requests_of_team
from governance.services import change_approve, change_reject, change_request, change_withdraw
from tenants.access import manager_tenant_of
from tenants.api.money import CreditsInputField, credits_text

Kind = ChangeRequest.Kind
MONEY_FIELDS = ("amount", "cap")


class ChangeRequestSerializer(serializers.ModelSerializer):
    change = serializers.SerializerMethodField(
        help_text="What is asked for; amounts and caps in credits."
    )
    requested_by = serializers.SlugRelatedField(slug_field="username", read_only=True)
    decided_by = serializers.SlugRelatedField(
        slug_field="username", read_only=True, allow_null=True
    )

    class Meta:
        model = ChangeRequest
        fields = [
            "id",
            "kind",
            "status",
            "tenant",
            "summary",
            "justification",
            "change",
            "before",
            "requested_by",
            "created_at",
            "expires_at",
            "decided_by",
            "decided_at",
            "decision_note",
        ]

    def get_change(self, obj: ChangeRequest) -> dict[str, Any]:
        return {
            k: credits_text(v) if k in MONEY_FIELDS and isinstance(v, int) else v
            for k, v in obj.payload.items()
        }


class _Credits(CreditsInputField):
    most_credits = 10**9


class ChangeRequestCreateSerializer(serializers.Serializer):
    kind = serializers.ChoiceField(choices=Kind.choices)
    justification = serializers.CharField(max_length=1000)
    change = serializers.DictField(
        help_text=(
            "policy_activate: {version}; credit_grant: {tenant, amount, reason}; team_credits: "
            "{amount, reason}; tier_change: {tier, capacity, maintenance_gpus}; budget_raise: "
            "{tenant, window, mode, cap, campaign}; tenant_weight: {tenant, weight}. Amounts "
            'and caps are credits as strings ("12.5").'
        )
    )

    def validate_change(self, value: dict[str, Any]) -> dict[str, Any]:
        out = dict(value)
        for name in MONEY_FIELDS:
            if name in out:
                try:
                    out[name] = _Credits().to_internal_value(out[name])
                except serializers.ValidationError as exc:
                    raise serializers.ValidationError({name: exc.detail}) from exc
        return out


class DecisionSerializer(serializers.Serializer):
    note = serializers.CharField(max_length=500, required=False, allow_blank=True, default="")


class ApprovalsPagination(StrictLimitOffsetPagination):
    default_limit = 50
    max_limit = 500


class ChangeRequestViewSet(
    mixins.ListModelMixin, mixins.RetrieveModelMixin, viewsets.GenericViewSet
):
    serializer_class = ChangeRequestSerializer
    permission_classes = [permissions.IsAuthenticated]
    parser_classes = [JSONParser]
    pagination_class = ApprovalsPagination
    queryset = ChangeRequest.objects.none()

    def get_queryset(self) -> QuerySet[ChangeRequest]:
        if getattr(self, "swagger_fake_view", False):
            return ChangeRequest.objects.none()
        user = self.request.user
        if user.is_staff or is_auditor(user):
            return requests_all()
        team = manager_tenant_of(user)
        # A researcher has none: another team's request and a missing one read the same (404).
        return requests_of_team(tenant=team) if team else ChangeRequest.objects.none()

    @extend_schema(summary="Change requests, newest first")
    def list(self, request, *args, **kwargs):
        return super().list(request, *args, **kwargs)

    @extend_schema(
        request=ChangeRequestCreateSerializer,
        responses={201: ChangeRequestSerializer},
        summary="Ask for a change that a second person approves",
    )
    def create(self, request):
        if not (request.user.is_staff or manager_tenant_of(request.user)):
            raise exceptions.PermissionDenied(
                "Platform administrators ask for changes, and a team's managers for its credits."
            )
        serializer = ChangeRequestCreateSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        data = serializer.validated_data
        change = data["change"]
        if data["kind"] == Kind.TEAM_CREDITS:
            team = manager_tenant_of(request.user)
            if team is None:
                raise exceptions.PermissionDenied("Only a team's managers ask for its credits.")
            change["tenant"] = team.pk
        elif not request.user.is_staff:
            raise exceptions.PermissionDenied("Only platform administrators ask for this change.")
        req = change_request(
            kind=data["kind"],
            actor=request.user,
            justification=data["justification"],
            payload=change,
        )
        return Response(ChangeRequestSerializer(req).data, status=status.HTTP_201_CREATED)

    def _decide(self, request, pk, *, approve: bool) -> Response:
        self.get_object()  # a request the caller cannot see is a 404, as a missing one
        if not request.user.is_staff:
            raise exceptions.PermissionDenied("Only platform administrators decide changes.")
        serializer = DecisionSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        note = serializer.validated_data["note"]
        decide = change_approve if approve else change_reject
        req = decide(pk=int(pk), actor=request.user, note=note)
        return Response(ChangeRequestSerializer(req).data)

    @extend_schema(
        request=DecisionSerializer,
        responses={200: ChangeRequestSerializer},
        summary="Approve someone else's request (the change applies in the same transaction)",
    )
    @action(detail=True, methods=["post"])
    def approve(self, request, pk=None):
        return self._decide(request, pk, approve=True)

    @extend_schema(
        request=DecisionSerializer,
        responses={200: ChangeRequestSerializer},
        summary="Reject someone else's request (a note is required)",
    )
    @action(detail=True, methods=["post"])
    def reject(self, request, pk=None):
        return self._decide(request, pk, approve=False)

    @extend_schema(
        request=None,
        responses={200: ChangeRequestSerializer},
        summary="Withdraw your own request while it waits (it is never applied)",
    )
    @action(detail=True, methods=["post"])
    def withdraw(self, request, pk=None):
        self.get_object()  # a request the caller cannot see is a 404, as a missing one
        req = change_withdraw(pk=int(pk), actor=request.user)
        return Response(ChangeRequestSerializer(req).data)
