"""The audit log over the API: the whole log for platform admins and auditors, a team's
events for its managers (``audit.access``)."""

from __future__ import annotations

from django.core.exceptions import PermissionDenied as DjangoPermissionDenied
from drf_spectacular.utils import extend_schema
from rest_framework import exceptions, permissions, serializers, viewsets
from rest_framework.decorators import action
from rest_framework.response import Response

from audit.access import audit_scope
from audit.models import AuditEvent
from audit.selectors import chain_verify, events_filter, events_in_scope
from core.api import StrictLimitOffsetPagination, query_filters


class AuditEventSerializer(serializers.ModelSerializer):
    before = serializers.JSONField(allow_null=True)
    after = serializers.JSONField(allow_null=True)

    class Meta:
        model = AuditEvent
        fields = [
            "id",
            "seq",
            "created_at",
            "actor_label",
            "tenant",
            "action",
            "object_type",
            "object_id",
            "before",
            "after",
            "prev_hash",
            "hash",
        ]


class AuditFilterSerializer(serializers.Serializer):
    actor = serializers.CharField(
        required=False, max_length=150, help_text="Part of the actor's name."
    )
    tenant = serializers.IntegerField(required=False, min_value=1, help_text="Tenant id.")
    action = serializers.CharField(
        required=False, max_length=80, help_text="Part of the action, e.g. 'bid.'."
    )
    object_type = serializers.CharField(required=False, max_length=80)
    object_id = serializers.CharField(required=False, max_length=64)
    since = serializers.DateTimeField(required=False)
    until = serializers.DateTimeField(required=False)


class ChainReportSerializer(serializers.Serializer):
    checked = serializers.IntegerField()
    ok = serializers.BooleanField()
    first_bad_seq = serializers.IntegerField(allow_null=True)
    first_bad_id = serializers.IntegerField(allow_null=True)
    problem = serializers.CharField(allow_blank=True)
    checkpoints = serializers.IntegerField(help_text="Signed head checkpoints checked.")
    description = serializers.CharField()


class AuditPagination(StrictLimitOffsetPagination):
    default_limit = 100
    max_limit = 1000


class AuditEventViewSet(viewsets.ReadOnlyModelViewSet):
    """Every recorded decision, newest first; ``verify`` walks the hash chain."""

    queryset = AuditEvent.objects.all()
    serializer_class = AuditEventSerializer
    permission_classes = [permissions.IsAuthenticated]
    pagination_class = AuditPagination

    def _scope(self):
        try:
            return audit_scope(self.request.user)
        except DjangoPermissionDenied as exc:
            raise exceptions.PermissionDenied(str(exc)) from exc

    def get_queryset(self):
        if getattr(self, "swagger_fake_view", False):
            return AuditEvent.objects.none()
        scope = self._scope()
        if self.action != "list":
            return events_in_scope(scope=scope)
        data = query_filters(self.request, AuditFilterSerializer)
        return events_filter(
            actor=data.get("actor", ""),
            tenant_id=data.get("tenant") if scope.tenant_id is None else scope.tenant_id,
            action=data.get("action", ""),
            object_type=data.get("object_type", ""),
            object_id=data.get("object_id", ""),
            since=data.get("since"),
            until=data.get("until"),
        )

    @extend_schema(parameters=[AuditFilterSerializer], summary="Audit events, newest first")
    def list(self, request, *args, **kwargs):
        return super().list(request, *args, **kwargs)

    @extend_schema(responses=ChainReportSerializer, summary="Verify the whole hash chain")
    @action(detail=False, pagination_class=None)
    def verify(self, request):
        if not self._scope().may_verify:
            raise exceptions.PermissionDenied(
                "Verifying the whole chain is for administrators and auditors."
            )
        report = chain_verify()
        return Response(
            ChainReportSerializer(
                {
                    "checked": report.checked,
                    "ok": report.ok,
                    "first_bad_seq": report.first_bad_seq,
                    "first_bad_id": report.first_bad_id,
                    "problem": report.problem,
                    "checkpoints": report.checkpoints,
                    "description": report.describe(),
                }
            ).data
        )
