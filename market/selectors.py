"""Reads for pages, the API and other apps. Tenant-owned rows are always scoped to a tenant."""

from __future__ import annotations

from collections import defaultdict
from datetime import datetime
from typing import Any

from django.db.models import Prefetch, QuerySet, Sum
from django.utils import timezone

from market.models import Allocation, Bid, BidLimit, PolicyVersion, Round, Tier
from tenants.access import access_object, scoped
from tenants.models import Tenant


def tiers_offered() -> QuerySet[Tier]:
    return Tier.objects.filter(active=True).order_by("slug")


def round_open_current(*, now: datetime | None = None) -> Round | None:
    """The round open for bidding now, if any (the tick keeps one open)."""
    now = now or timezone.now()
    return (
        Round.objects.filter(status=Round.Status.OPEN, closes_at__gt=now)
        .select_related("policy", "shadow_policy")
        .first()
    )


def rounds_recent(*, limit: int = 20) -> QuerySet[Round]:
    return Round.objects.select_related("policy", "shadow_policy").order_by("-starts_at")[:limit]


def round_get(*, round_id: object) -> Round:
    """A round by id (rounds are public to every signed-in user); Round.DoesNotExist if missing."""
    return Round.objects.select_related("policy", "shadow_policy").get(pk=round_id)


def _with_limits(qs: QuerySet[Bid]) -> QuerySet[Bid]:
    return qs.select_related("round", "author", "campaign").prefetch_related(
        Prefetch("limits", queryset=BidLimit.objects.select_related("tier").order_by("tier__slug"))
    )


def bids_for_tenant(
    *, tenant: Tenant, round_id: int | None = None, status: str | None = None
) -> QuerySet[Bid]:
    qs = scoped(Bid.objects.all(), tenant=tenant)
    if round_id is not None:
        qs = qs.filter(round_id=round_id)
    if status is not None:
        qs = qs.filter(status=status)
    return _with_limits(qs).order_by("-created_at", "-id")


def bid_get(*, tenant: Tenant, bid_id: object) -> Bid:
    """The tenant's bid, or Http404 (another tenant's bid looks missing)."""
    return access_object(_with_limits(Bid.objects.all()), tenant=tenant, pk=bid_id)


def bid_limits(bid: Bid) -> dict[str, int]:
    """{tier slug: milli-credits per GPU-hour} (uses the prefetch from the selectors above)."""
    return {limit.tier.slug: limit.price for limit in bid.limits.all()}


def allocations_for_tenant(*, tenant: Tenant, status: str | None = None) -> QuerySet[Allocation]:
    qs = scoped(Allocation.objects.all(), tenant=tenant).select_related("tier", "round", "bid")
    if status is not None:
        qs = qs.filter(status=status)
    return qs.order_by("-starts_at", "-id")


def allocations_running(*, at: datetime | None = None) -> QuerySet[Allocation]:
    """Allocations whose window contains ``at`` and that are not finished or revoked: the
    desired state the enforcement loop compares with what the GPUs are doing."""
    at = at or timezone.now()
    return (
        Allocation.objects.filter(
            starts_at__lte=at,
            ends_at__gt=at,
            status__in=[Allocation.Status.ACTIVE, Allocation.Status.PAUSED],
        )
        .select_related("tenant", "tier", "round")
        .order_by("pk")
    )


def round_results(*, rnd: Round) -> dict[str, Any]:
    """Per tier: capacity offered, price, GPUs allocated and demand (GPUs bid); plus revenue."""
    allocated: dict[str, int] = defaultdict(int)
    for slug, gpus in Allocation.objects.filter(round=rnd).values_list("tier__slug", "gpus"):
        allocated[slug] += gpus
    demand: dict[str, int] = defaultdict(int)
    for slug, quantity in (
        BidLimit.objects.filter(bid__round=rnd)
        .exclude(bid__status=Bid.Status.CANCELLED)
        .values_list("tier__slug", "bid__quantity")
    ):
        demand[slug] += quantity
    slugs = sorted(set(rnd.capacities) | set(rnd.prices) | set(demand))
    return {
        "tiers": [
            {
                "tier": slug,
                "capacity": rnd.capacities.get(slug),
                "price": rnd.prices.get(slug),
                "allocated": allocated.get(slug, 0),
                "demand": demand.get(slug, 0),
            }
            for slug in slugs
        ],
        "revenue": rnd.revenue,
        "diagnostics": rnd.diagnostics,
        "shadow": rnd.shadow_result,
    }


def price_history(*, limit: int = 50) -> list[dict[str, Any]]:
    """Recent cleared prices, oldest first: [{"round", "starts_at", "prices": {slug: price}}]."""
    rows = (
        Round.objects.filter(
            status__in=[Round.Status.SETTLED, Round.Status.FINISHED, Round.Status.CLEARED]
        )
        .order_by("-starts_at")
        .values("pk", "starts_at", "prices")[:limit]
    )
    return [
        {"round": r["pk"], "starts_at": r["starts_at"], "prices": r["prices"]}
        for r in reversed(rows)
    ]


def tenant_spend(*, tenant: Tenant, since: datetime | None = None) -> int:
    """Milli-credits charged to the tenant by settled allocations (since ``since``)."""
    qs = scoped(Allocation.objects.exclude(status=Allocation.Status.REVOKED), tenant=tenant)
    if since is not None:
        qs = qs.filter(starts_at__gte=since)
    return qs.aggregate(total=Sum("charge"))["total"] or 0


def policy_active_get() -> PolicyVersion | None:
    """The active policy version, or None on a fresh platform. The one read of it: the market
    services create the default version (``policy_active``) when the first round opens."""
    return PolicyVersion.objects.filter(status=PolicyVersion.Status.ACTIVE).first()
