"""The ingest endpoint (node agents), the enforcement actions a tenant may see, and the pace
signal of a tenant's allocation.

Ingest is a plain Django view, not a DRF one: it carries the fleet's whole sample stream,
its body is parsed once by our own strict parser, and it authenticates nodes, not users.
"""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.http import HttpRequest, JsonResponse
from django.views.decorators.csrf import csrf_exempt
from drf_spectacular.utils import extend_schema
from rest_framework import permissions, serializers
from rest_framework.generics import ListAPIView
from rest_framework.response import Response
from rest_framework.views import APIView

from core.ratelimit import CACHE_ERRORS, rate_count, rate_limit_fail_open
from market.models import Allocation
from market.services.slurm_reservations import reservation_name
from telemetry import selectors, services
from telemetry.errors import TelemetryError
from telemetry.models import EnforcementAction
from telemetry.pace import ORDER, allocation_pace
from telemetry.payload import payload_load
from tenants.access import access_object, require_tenant
from tenants.api.base import IsTenantMember, Pagination, ScopedThrottle


def _refusal(exc: TelemetryError) -> JsonResponse:
    response = JsonResponse({"errors": exc.errors}, status=exc.status)
    if exc.status == 401:
        response["WWW-Authenticate"] = 'Bearer realm="gpumarket-telemetry"'
    return response


def directive_to_wire(action: EnforcementAction) -> dict[str, Any]:
    wire = {
        "id": action.pk,
        "action": action.action,
        "gpu": action.gpu.uuid,
        "pid": action.pid,
        "allocation": action.allocation_ref,
        "slurm_job": action.slurm_job or None,
        "pod": action.pod or None,
        "namespace": None,
        "grace_seconds": action.grace_seconds,
        "reason": action.reason,
    }
    if action.action == EnforcementAction.Action.SUSPEND:
        wire["checkpoint_signal"] = settings.GPUMARKET_CHECKPOINT_SIGNAL
    if (
        action.action == EnforcementAction.Action.RESUME
        and action.slurm_job
        and settings.GPUMARKET_SLURM_RESERVATIONS
        and action.allocation is not None
        and action.allocation.placement
    ):
        # Settlement reserved the node for this allocation: a released job runs in it.
        wire["slurm_reservation"] = reservation_name(action.allocation)
    return wire


def _rate_exceeded(*, node_id: int) -> int:
    """Count this node's batch in the current minute (shared cache); seconds to wait, or 0."""
    count, left = rate_count(key=f"ingest-rate:{node_id}", seconds=60)
    return left if count > settings.GPUMARKET_INGEST_RATE_PER_MINUTE else 0


@csrf_exempt
def ingest(request: HttpRequest) -> JsonResponse:
    """POST a batch (docs/telemetry-protocol.md) with ``Authorization: Bearer <node token>``."""
    if request.method != "POST":
        response = JsonResponse({"errors": {"method": ["use POST"]}}, status=405)
        response["Allow"] = "POST"
        return response
    try:
        node = services.node_authenticate(authorization=request.headers.get("Authorization", ""))
    except TelemetryError as exc:
        return _refusal(exc)
    try:
        retry_after = _rate_exceeded(node_id=node.pk)
    except CACHE_ERRORS as exc:
        rate_limit_fail_open(scope="ingest", error=exc)
        retry_after = 0
    if retry_after:
        response = JsonResponse(
            {
                "errors": {
                    "rate": [
                        f"more than {settings.GPUMARKET_INGEST_RATE_PER_MINUTE} batches "
                        "a minute from this node; retry later"
                    ]
                }
            },
            status=429,
        )
        response["Retry-After"] = str(retry_after)
        return response
    content_type = request.content_type or ""
    if content_type != "application/json":
        return _refused(
            node,
            TelemetryError(
                "wrong content type",
                errors={"content_type": [f"must be application/json, got {content_type!r}"]},
                status=415,
            ),
        )
    limit = settings.GPUMARKET_INGEST_MAX_BYTES
    too_big = {
        "body": [f"is larger than {limit} bytes; send fewer samples per batch"],
    }
    try:
        declared = int(request.META.get("CONTENT_LENGTH") or 0)
    except ValueError:
        declared = 0
    if declared > limit:
        return _refused(node, TelemetryError("too big", errors=too_big, status=413))
    # Read the stream directly: request.body would apply DATA_UPLOAD_MAX_MEMORY_SIZE, a limit
    # meant for form posts, not for telemetry batches.
    body = request.read(limit + 1)
    if len(body) > limit:
        return _refused(node, TelemetryError("too big", errors=too_big, status=413))
    try:
        result = services.samples_ingest(node=node, payload=payload_load(body))
    except TelemetryError as exc:
        return _refused(node, exc)
    return JsonResponse(
        {
            "stored": result.stored,
            "duplicate": result.duplicate,
            "directives": [directive_to_wire(a) for a in result.directives],
            "refused": result.refused,
            "power_caps": result.power_caps,
        }
    )


def _refused(node, exc: TelemetryError) -> JsonResponse:
    """Refuse the batch of an authenticated node, and count it against the node."""
    if exc.status != 401:
        field, messages = next(iter(exc.errors.items()), ("body", [str(exc)]))
        services.batch_refusal_record(node=node, reason=f"{field}: {messages[0]}")
    return _refusal(exc)


class EnforcementActionSerializer(serializers.ModelSerializer):
    node = serializers.CharField(source="node.name")
    gpu = serializers.CharField(source="gpu.uuid")
    allocation = serializers.IntegerField(source="allocation_id", allow_null=True)

    class Meta:
        model = EnforcementAction
        fields = [
            "id",
            "action",
            "state",
            "reason",
            "detail",
            "node",
            "gpu",
            "pid",
            "allocation",
            "grace_seconds",
            "created_at",
            "delivered_at",
            "acknowledged_at",
        ]


class EnforcementActionList(ListAPIView):
    """The enforcement actions taken on the caller's tenant's work, newest first."""

    serializer_class = EnforcementActionSerializer
    pagination_class = Pagination
    # Read by the API schema: a caller without a tenant gets 404 (require_tenant).
    tenant_scoped = True

    def get_queryset(self):
        return selectors.actions_for_tenant(tenant=require_tenant(self.request.user))


class PaceSerializer(serializers.Serializer):
    allocation = serializers.IntegerField()
    mode = serializers.ChoiceField(choices=[m.value for m in ORDER])
    since = serializers.DateTimeField(
        allow_null=True,
        help_text="When the mode last changed (or the start of the history window).",
    )
    reasons = serializers.ListField(child=serializers.CharField())
    numbers = serializers.DictField(
        child=serializers.FloatField(),
        help_text="The measurements and thresholds behind the mode (percent, GPUs, seconds).",
    )


class AllocationPaceView(APIView):
    """GET /api/v1/allocations/{id}/pace: how hard the job on this allocation may push."""

    permission_classes = [permissions.IsAuthenticated, IsTenantMember]
    tenant_scoped = True
    queryset = Allocation.objects.select_related("tier")

    def get_throttles(self):
        return [ScopedThrottle("pace")]

    @extend_schema(
        responses=PaceSerializer,
        summary="Pace signal: light, moderate or heavy, with reasons",
        operation_id="allocations_pace",
        tags=["allocations"],
    )
    def get(self, request, pk: int):
        allocation = access_object(self.queryset.all(), tenant=require_tenant(request.user), pk=pk)
        reading = allocation_pace(allocation=allocation)
        return Response(
            PaceSerializer(
                {
                    "allocation": allocation.pk,
                    "mode": reading.mode.value,
                    "since": reading.since,
                    "reasons": reading.reasons,
                    "numbers": reading.numbers,
                }
            ).data
        )
