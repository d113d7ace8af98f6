"""Market endpoints: tiers and rounds (shared by all tenants), bids and allocations (the
caller's tenant only). Writes go through the same services as the web pages."""

from __future__ import annotations

import re

from django.http import Http404
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import mixins, permissions, status, viewsets
from rest_framework.decorators import action
from rest_framework.response import Response

from core.api import JSONParser, query_filters
from core.errors import DomainError
from core.money import SECONDS_PER_HOUR
from market.api.serializers import (
    AllocationFilterSerializer,
    AllocationSerializer,
    BidCreateSerializer,
    BidEditSerializer,
    BidFilterSerializer,
    BidSerializer,
    LaunchQuerySerializer,
    LaunchSerializer,
    OrderAllocationQuerySerializer,
    OrderCreateSerializer,
    OrderEditSerializer,
    OrderFilterSerializer,
    OrderSerializer,
    RoundFilterSerializer,
    RoundSerializer,
    TierSerializer,
)
from market.errors import RoundMissing
from market.forms import order_error_field
from market.models import Allocation, Bid, Order
from market.selectors import (
    allocations_for_tenant,
    allocations_with_tier,
    bids_for_tenant,
    bids_with_limits,
    order_allocation_current,
    orders_for_tenant,
    orders_with_limits,
    policy_active_get,
    rounds_all,
    rounds_filter,
    rounds_open,
    tiers_all,
)
from market.services.bids import bid_cancel, bid_edit, bid_place
from market.services.launch import allocation_launch
from market.services.orders.lifecycle import (
    order_cancel,
    order_create,
    order_edit,
    order_pause,
    order_resume,
)
from tenants.access import access_object
from tenants.api.base import Pagination, TenantScopedViewSet
from tenants.api.errors import Missing, Refused
from tenants.models import Campaign


class TierViewSet(viewsets.ReadOnlyModelViewSet):
    """Tiers on offer, with the reserve price and share cap of the active policy."""

    serializer_class = TierSerializer
    permission_classes = [permissions.IsAuthenticated]
    lookup_field = "slug"
    # Only what a slug can hold: anything else (a NUL byte, say) is a 404 from the router, not
    # a database error.
    lookup_value_regex = r"[-a-zA-Z0-9_]+"
    pagination_class = Pagination

    def get_queryset(self):
        return tiers_all()

    def get_serializer_context(self):
        context = super().get_serializer_context()
        context["policy"] = policy_active_get()
        return context


class RoundViewSet(viewsets.ReadOnlyModelViewSet):
    """Rounds, newest window first: the open one, and history with clearing prices."""

    serializer_class = RoundSerializer
    permission_classes = [permissions.IsAuthenticated]
    pagination_class = Pagination

    def get_queryset(self):
        if self.action != "list":
            return rounds_all()
        return rounds_filter(**query_filters(self.request, RoundFilterSerializer))

    @extend_schema(parameters=[RoundFilterSerializer], summary="Rounds, newest first")
    def list(self, request, *args, **kwargs):
        return super().list(request, *args, **kwargs)

    @extend_schema(responses=RoundSerializer(many=True), summary="Rounds open for bids now")
    @action(detail=False, pagination_class=None)
    def open(self, request):
        return Response(RoundSerializer(rounds_open(), many=True).data)


SLUG = re.compile(r"^[-a-z0-9_]{1,40}$")


def limits_checked(limits: dict) -> dict[str, int]:
    """Limits whose keys can name a tier; anything else is refused like an unknown tier."""
    bad = sorted(key for key in limits if not SLUG.match(key))
    if bad:
        raise Refused(
            f"unknown tier {', '.join(map(repr, bad))}: tier slugs are lower-case letters, "
            "digits and hyphens; GET /api/v1/tiers lists them",
            fields={"limits": [f"unknown tier {key}" for key in bad]},
        )
    return dict(limits)


ORDER_IDEMPOTENCY_HEADER = OpenApiParameter(
    name="Idempotency-Key",
    location=OpenApiParameter.HEADER,
    required=False,
    type=str,
    description="Up to 80 characters. Retrying a POST with the same key returns the order the "
    "first attempt created instead of creating a second one.",
)
IDEMPOTENCY_HEADER = OpenApiParameter(
    name="Idempotency-Key",
    location=OpenApiParameter.HEADER,
    required=False,
    type=str,
    description="Up to 80 characters. Retrying a POST with the same key returns the bid the "
    "first attempt placed instead of placing (and escrowing) a second one.",
)


class BidViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, TenantScopedViewSet):
    """The tenant's bids. Place, edit and cancel use the market services, so the escrow,
    the budget check and the audit event are exactly those of the web pages."""

    queryset = Bid.objects.all()
    serializer_class = BidSerializer
    parser_classes = [JSONParser]
    http_method_names = ["get", "post", "patch", "head", "options"]
    throttle_scopes = {"bids": {"create", "partial_update", "cancel"}}

    def base_queryset(self):
        return bids_with_limits()

    def get_queryset(self):
        if self.action != "list" or getattr(self, "swagger_fake_view", False):
            return super().get_queryset()
        filters = query_filters(self.request, BidFilterSerializer)
        return bids_for_tenant(
            tenant=self.tenant, status=filters.get("status"), round_id=filters.get("round")
        )

    def _answer(self, bid: Bid) -> Response:
        fresh = access_object(self.base_queryset(), tenant=self.tenant, pk=bid.pk)
        return Response(BidSerializer(fresh).data)

    @extend_schema(parameters=[BidFilterSerializer], summary="The tenant's bids")
    def list(self, request, *args, **kwargs):
        return super().list(request, *args, **kwargs)

    @extend_schema(
        request=BidCreateSerializer,
        responses={201: BidSerializer},
        parameters=[IDEMPOTENCY_HEADER],
        summary="Place a bid (holds its maximum cost in escrow)",
    )
    def create(self, request):
        serializer = BidCreateSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        data = serializer.validated_data
        limits = limits_checked(data["limits"])
        try:
            bid = bid_place(
                user=request.user,
                tenant=self.tenant,
                round=data["round"],  # read once, locked, by bid_place
                quantity=data["quantity"],
                min_quantity=data["min_quantity"],
                limits=limits,
                campaign=self._campaign(data["campaign"]),
                idempotency_key=request.headers.get("Idempotency-Key") or None,
                note=data["note"],
            )
        except RoundMissing as exc:
            raise Missing(
                f"There is no round {data['round']}.", fields={"round": ["no such round"]}
            ) from exc
        # The bid in hand is what was written, and its limits are those asked for: bid_place
        # stores them as given or refuses (a replayed key with other limits included).
        answer = BidSerializer(bid, context={"placed_limits": limits})
        return Response(answer.data, status=status.HTTP_201_CREATED)

    def _campaign(self, campaign_id: int | None) -> Campaign | None:
        if campaign_id is None:
            return None
        try:
            return access_object(Campaign.objects.all(), tenant=self.tenant, pk=campaign_id)
        except Http404 as exc:
            raise Missing(
                f"Your team has no campaign {campaign_id}.",
                fields={"campaign": ["no such campaign"]},
            ) from exc

    @extend_schema(
        request=BidEditSerializer,
        responses={200: BidSerializer},
        summary="Change an open bid (escrow follows the new terms)",
    )
    def partial_update(self, request, pk=None):
        bid = self.get_object()
        serializer = BidEditSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        data = serializer.validated_data
        bid = bid_edit(
            user=request.user,
            tenant=self.tenant,
            bid_id=bid.pk,
            quantity=data.get("quantity"),
            min_quantity=data.get("min_quantity"),
            limits=limits_checked(data["limits"]) if "limits" in data else None,
        )
        return self._answer(bid)

    @extend_schema(
        request=None,
        responses={200: BidSerializer},
        summary="Cancel an open bid (its escrow goes back to available)",
    )
    @action(detail=True, methods=["post"])
    def cancel(self, request, pk=None):
        bid = self.get_object()
        bid = bid_cancel(user=request.user, tenant=self.tenant, bid_id=bid.pk)
        return self._answer(bid)


class AllocationViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, TenantScopedViewSet):
    """GPUs the tenant won. Pace for a running job: /allocations/{id}/pace."""

    queryset = Allocation.objects.all()
    serializer_class = AllocationSerializer

    def base_queryset(self):
        return allocations_with_tier()

    def get_queryset(self):
        if self.action != "list" or getattr(self, "swagger_fake_view", False):
            return super().get_queryset()
        filters = query_filters(self.request, AllocationFilterSerializer)
        return allocations_for_tenant(
            tenant=self.tenant, status=filters.get("status"), round_id=filters.get("round")
        )

    @extend_schema(parameters=[AllocationFilterSerializer], summary="The tenant's allocations")
    def list(self, request, *args, **kwargs):
        return super().list(request, *args, **kwargs)

    @extend_schema(
        parameters=[LaunchQuerySerializer],
        responses={200: LaunchSerializer},
        summary="What work on a node needs to run on this allocation: its GPUs there, and the "
        "environment (with the launch token) to start it with",
    )
    @action(detail=True, methods=["get"])
    def launch(self, request, pk=None):
        allocation = self.get_object()
        query = query_filters(request, LaunchQuerySerializer)
        launch = allocation_launch(allocation=allocation, node=query["node"])
        return Response(
            LaunchSerializer(
                {
                    "allocation": launch.allocation,
                    "node": launch.node,
                    "gpus": list(launch.indices),
                    "uuids": list(launch.uuids),
                    "env": launch.env,
                }
            ).data
        )


def _gpu_seconds(hours: float | None) -> int | None:
    return None if hours is None else round(hours * SECONDS_PER_HOUR)


def _order_refused(exc: DomainError) -> Refused:
    """A service's refusal of an order's terms, with the request field it names."""
    field = order_error_field(str(exc))
    return Refused(str(exc), fields={field: [str(exc)]} if field else None)


class OrderViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, TenantScopedViewSet):
    """The tenant's standing orders: each bids every round until it is done, cancelled, out
    of its ceiling or past its deadline. Writes use the same services as the web pages."""

    queryset = Order.objects.all()
    serializer_class = OrderSerializer
    parser_classes = [JSONParser]
    http_method_names = ["get", "post", "patch", "head", "options"]
    throttle_scopes = {"bids": {"create", "partial_update", "pause", "resume", "cancel"}}

    _campaign = BidViewSet._campaign  # the tenant's campaign, or 404 naming the field

    def base_queryset(self):
        return orders_with_limits()

    def get_queryset(self):
        if self.action != "list" or getattr(self, "swagger_fake_view", False):
            return super().get_queryset()
        filters = query_filters(self.request, OrderFilterSerializer)
        return orders_for_tenant(tenant=self.tenant, status=filters.get("status"))

    def _answer(self, order: Order, code: int = status.HTTP_200_OK) -> Response:
        fresh = access_object(self.base_queryset(), tenant=self.tenant, pk=order.pk)
        return Response(OrderSerializer(fresh).data, status=code)

    @extend_schema(parameters=[OrderFilterSerializer], summary="The tenant's standing orders")
    def list(self, request, *args, **kwargs):
        return super().list(request, *args, **kwargs)

    @extend_schema(
        request=OrderCreateSerializer,
        parameters=[ORDER_IDEMPOTENCY_HEADER],
        responses={201: OrderSerializer},
        summary="Create a standing order (it bids from the round open now on)",
    )
    def create(self, request):
        named = request.data.get("campaign") if isinstance(request.data, dict) else None
        if type(named) is int and named > 0:
            # A body naming another team's campaign is refused whole, whatever else it holds.
            self._campaign(named)
        serializer = OrderCreateSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        data = serializer.validated_data
        campaign = self._campaign(data["campaign"])
        try:
            order = order_create(
                user=request.user,
                tenant=self.tenant,
                name=data["name"],
                values=limits_checked(data["values"]),
                gpus=data["gpus"],
                min_gpus=data["min_gpus"],
                gpu_seconds_wanted=_gpu_seconds(data["gpu_hours"]),
                ceiling=data["ceiling"],
                deadline=data["deadline"],
                restart_seconds=data["restart_minutes"] * 60,
                campaign=campaign,
                command=data["command"],
                slurm_job=data["slurm_job"],
                preemptible=data["preemptible"],
                idempotency_key=request.headers.get("Idempotency-Key") or None,
            )
        except DomainError as exc:
            raise _order_refused(exc) from exc
        return self._answer(order, status.HTTP_201_CREATED)

    @extend_schema(
        request=OrderEditSerializer,
        responses={200: OrderSerializer},
        summary="Change a live order (its bid in the open round follows the new terms)",
    )
    def partial_update(self, request, pk=None):
        order = self.get_object()
        serializer = OrderEditSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        data = serializer.validated_data
        terms = {
            k: data[k] for k in ("name", "gpus", "min_gpus", "ceiling", "deadline") if k in data
        }
        if "values" in data:
            terms["values"] = limits_checked(data["values"])
        if "gpu_hours" in data:
            terms["gpu_seconds_wanted"] = _gpu_seconds(data["gpu_hours"])
        if "restart_minutes" in data:
            terms["restart_seconds"] = data["restart_minutes"] * 60
        try:
            order = order_edit(user=request.user, tenant=self.tenant, order_id=order.pk, **terms)
        except DomainError as exc:
            raise _order_refused(exc) from exc
        return self._answer(order)

    def _status(self, service) -> Response:
        order = self.get_object()
        return self._answer(service(user=self.request.user, tenant=self.tenant, order_id=order.pk))

    @extend_schema(request=None, responses={200: OrderSerializer}, summary="Stop bidding")
    @action(detail=True, methods=["post"])
    def pause(self, request, pk=None):
        return self._status(order_pause)

    @extend_schema(request=None, responses={200: OrderSerializer}, summary="Bid again")
    @action(detail=True, methods=["post"])
    def resume(self, request, pk=None):
        return self._status(order_resume)

    @extend_schema(
        request=None, responses={200: OrderSerializer}, summary="End the order: no more bids"
    )
    @action(detail=True, methods=["post"])
    def cancel(self, request, pk=None):
        return self._status(order_cancel)

    @extend_schema(
        parameters=[OrderAllocationQuerySerializer],
        responses={200: AllocationSerializer},
        summary="The allocation the order's work runs on now, on a node if given (404 when "
        "it holds none)",
    )
    @action(detail=True, methods=["get"])
    def allocation(self, request, pk=None):
        order = self.get_object()
        node = query_filters(request, OrderAllocationQuerySerializer).get("node")
        allocation = order_allocation_current(order=order, node=node)
        if allocation is None:
            where = f" on {node}" if node else ""
            raise Missing(
                f"Order {order.pk} holds no GPUs{where} now ({order.get_status_display().lower()}"
                "): its work runs when it wins a round."
            )
        return Response(AllocationSerializer(allocation).data)
