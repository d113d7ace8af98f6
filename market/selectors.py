"""Reads for pages, the API and other apps. Tenant-owned rows are always scoped to a tenant."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from datetime import UTC, date, datetime
from typing import Any

from django.db.models import Count, Prefetch, QuerySet, Sum
from django.db.models.functions import TruncDate
from django.utils import timezone

from market.bid_guidance import TierGuide
from market.forecast_selectors import demand_on_tier
from market.foresight import Foresight, foresee
from market.models import Allocation, Bid, BidLimit, Order, OrderLimit, PolicyVersion, Round, Tier
from tenants.access import access_object, scoped
from tenants.models import Campaign, Tenant, Transfer

CLEARED = (Round.Status.CLEARED, Round.Status.SETTLED, Round.Status.FINISHED)


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


def rounds_all() -> QuerySet[Round]:
    """Every round, newest window first."""
    return Round.objects.select_related("policy", "shadow_policy").order_by("-starts_at")


def rounds_filter(
    *, status: str | None = None, since: datetime | None = None, until: datetime | None = None
) -> QuerySet[Round]:
    """Rounds, newest window first, narrowed by status and by a window start in
    [``since``, ``until``)."""
    qs = rounds_all()
    if status is not None:
        qs = qs.filter(status=status)
    if since is not None:
        qs = qs.filter(starts_at__gte=since)
    if until is not None:
        qs = qs.filter(starts_at__lt=until)
    return qs


def rounds_recent(*, limit: int = 20) -> QuerySet[Round]:
    return rounds_all()[:limit]


def rounds_open() -> QuerySet[Round]:
    """Rounds open for bids, soonest closing first."""
    return (
        Round.objects.select_related("policy")
        .filter(status=Round.Status.OPEN)
        .order_by("closes_at")
    )


def round_last_cleared() -> Round | None:
    """The newest round that has cleared (cleared, settled or finished)."""
    return (
        Round.objects.filter(status__in=CLEARED)
        .select_related("policy")
        .order_by("-starts_at")
        .first()
    )


def round_demand(*, rnd: Round) -> dict[str, list[tuple[int, float]]]:
    """Per tier slug, each bid's (limit price, GPUs) as the round's clearing saw it: the bids
    it cleared (not cancelled, not left out over a hard cap or for want of a node), on the
    tiers it offered, a multi-tier bid split over them (``demand_on_tier``, the forecast's
    rule too), and each team's demand on a tier cut at the most its share cap lets it hold
    there, its highest limits first.
    """
    diagnostics = rnd.diagnostics or {}
    left_out = {
        int(pk)
        for key in ("left_out_by_hard_cap", "left_out_by_placement")
        for pk in diagnostics.get(key) or {}
    }
    offered = set(rnd.capacities or {})
    rows = [
        row
        for row in BidLimit.objects.filter(bid__round=rnd)
        .exclude(bid__status=Bid.Status.CANCELLED)
        .exclude(bid_id__in=left_out)
        .order_by("-price", "bid_id")
        .values_list("bid_id", "bid__tenant_id", "tier__slug", "price", "bid__quantity")
        if not offered or row[2] in offered
    ]
    tiers_per_bid: dict[int, int] = defaultdict(int)
    for bid_id, *_ in rows:
        tiers_per_bid[bid_id] += 1
    held: dict[tuple[int, str], float] = defaultdict(float)
    demand: dict[str, list[tuple[int, float]]] = defaultdict(list)
    for bid_id, tenant_id, slug, price, quantity in rows:
        wanted = demand_on_tier(quantity, tiers_per_bid[bid_id])
        most = rnd.policy.max_share_for(slug) * int((rnd.capacities or {}).get(slug, 0)) // 100
        if offered and rnd.policy.max_share_for(slug) < 100:
            wanted = min(wanted, max(most - held[tenant_id, slug], 0))
        held[tenant_id, slug] += wanted
        if wanted > 0:
            demand[slug].append((price, wanted))
    return dict(demand)


def round_allocations(*, rnd: Round) -> list[Allocation]:
    return list(
        Allocation.objects.filter(round=rnd)
        .select_related("tenant", "tier")
        .order_by("tier__slug", "tenant__name")
    )


def round_bid_counts(*, rnd: Round) -> dict[str, int]:
    """{bid status: how many of the round's bids have it}, every status present."""
    counts = dict(
        Bid.objects.filter(round=rnd).values_list("status").annotate(n=Count("pk")).order_by()
    )
    return {status: counts.get(status, 0) for status in Bid.Status.values}


def tiers_all() -> QuerySet[Tier]:
    return Tier.objects.order_by("slug")


def _limits() -> Prefetch:
    return Prefetch(
        "limits", queryset=BidLimit.objects.select_related("tier").order_by("tier__slug")
    )


def _with_limits(qs: QuerySet[Bid]) -> QuerySet[Bid]:
    return qs.select_related("round", "author", "campaign").prefetch_related(_limits())


def bids_with_limits() -> QuerySet[Bid]:
    """Every bid with its round, author, campaign and limits; scope it to a tenant before use
    (the API's tenant-scoped viewsets do)."""
    return _with_limits(Bid.objects.all())


def allocations_with_tier() -> QuerySet[Allocation]:
    """Every allocation with its tier, newest first; scope it to a tenant before use."""
    return Allocation.objects.select_related("tier").order_by("-starts_at", "-id")


def allocations_for_tenant(
    *, tenant: Tenant, round_id: int | None = None, status: str | None = None
) -> QuerySet[Allocation]:
    """The tenant's allocations with their tiers, newest first."""
    qs = scoped(allocations_with_tier(), tenant=tenant)
    if status is not None:
        qs = qs.filter(status=status)
    if round_id is not None:
        qs = qs.filter(round_id=round_id)
    return qs


def bids_for_tenant(
    *, tenant: Tenant, round_id: int | None = None, status: str | None = None
) -> QuerySet[Bid]:
    qs = scoped(Bid.objects.all(), tenant=tenant)
    if round_id is not None:
        qs = qs.filter(round_id=round_id)
    if status is not None:
        qs = qs.filter(status=status)
    return _with_limits(qs).order_by("-created_at", "-id")


def bids_with_allocations(*, tenant: Tenant) -> QuerySet[Bid]:
    """The tenant's bids, newest first, each with its allocations and their tiers."""
    return bids_for_tenant(tenant=tenant).prefetch_related("allocations__tier")


def bid_get(*, tenant: Tenant, bid_id: object) -> Bid:
    """The tenant's bid, or Http404 (another tenant's bid looks missing)."""
    return access_object(_with_limits(Bid.objects.all()), tenant=tenant, pk=bid_id)


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


def policy_active_get() -> PolicyVersion | None:
    """The active policy version, or None on a fresh platform. The one read of it: the market
    services create the default version (``policy_active``) when the first round opens."""
    return PolicyVersion.objects.filter(status=PolicyVersion.Status.ACTIVE).first()


def campaigns_current(*, tenant: Tenant, at: datetime | None = None) -> QuerySet[Campaign]:
    """The tenant's campaigns running at ``at`` (now by default)."""
    at = at or timezone.now()
    return scoped(Campaign.objects, tenant=tenant).filter(starts_at__lte=at, ends_at__gt=at)


SPEND_SIGN = {Transfer.Kind.CHARGE: 1, Transfer.Kind.REFUND: -1}


def tenant_spend_by_day(*, tenant: Tenant, since: date) -> dict[date, int]:
    """Milli-credits charged less refunded, per UTC day from ``since`` on."""
    rows = (
        scoped(Transfer.objects, tenant=tenant)
        .filter(
            kind__in=list(SPEND_SIGN),
            created_at__gte=datetime.combine(since, datetime.min.time(), tzinfo=UTC),
        )
        .annotate(day=TruncDate("created_at", tzinfo=UTC))
        .values("day", "kind")
        .annotate(total=Sum("amount"))
    )
    per_day: dict[date, int] = defaultdict(int)
    for row in rows:
        per_day[row["day"]] += SPEND_SIGN[row["kind"]] * row["total"]
    return dict(per_day)


def tenant_charges(*, tenant: Tenant, limit: int = 50) -> QuerySet[Transfer]:
    """The tenant's newest charges and refunds."""
    return (
        scoped(Transfer.objects, tenant=tenant)
        .filter(kind__in=list(SPEND_SIGN))
        .select_related("campaign")[:limit]
    )


def tier_guides(*, rnd: Round) -> list[TierGuide]:
    """The facts the bid form shows beside each tier offered to ``rnd``."""
    policy = rnd.policy
    last = (
        Round.objects.filter(status=Round.Status.SETTLED)
        .exclude(pk=rnd.pk)
        .order_by("-starts_at")
        .values_list("prices", flat=True)
        .first()
    ) or {}
    guides = []
    for tier in tiers_offered():
        pct = policy.max_share_for(tier.slug)
        guides.append(
            TierGuide(
                slug=tier.slug,
                name=tier.name,
                offered=tier.offered,
                reserve=policy.reserve_for(tier.slug),
                last_price=int(last[tier.slug]) if tier.slug in last else None,
                share_pct=pct,
                share_gpus=tier.offered * pct // 100,
            )
        )
    return guides


# Standing orders ---------------------------------------------------------------------------

FORESIGHT_ROUNDS = 48


def _with_order_limits(qs: QuerySet[Order]) -> QuerySet[Order]:
    return qs.select_related("campaign", "author").prefetch_related(
        Prefetch(
            "limits", queryset=OrderLimit.objects.select_related("tier").order_by("tier__slug")
        )
    )


def orders_with_limits() -> QuerySet[Order]:
    """Every order with its campaign, author and values; scope it to a tenant before use."""
    return _with_order_limits(Order.objects.all())


def orders_for_tenant(*, tenant: Tenant, status: str | None = None) -> QuerySet[Order]:
    qs = scoped(Order.objects.all(), tenant=tenant)
    if status is not None:
        qs = qs.filter(status=status)
    return _with_order_limits(qs).order_by("-created_at", "-id")


def order_get(*, tenant: Tenant, order_id: object) -> Order:
    """The tenant's order, or Http404 (another tenant's order looks missing)."""
    return access_object(_with_order_limits(Order.objects.all()), tenant=tenant, pk=order_id)


def order_bids(*, order: Order, limit: int = 50) -> list[Bid]:
    """The order's bids, newest round first, each with its round, limits and allocations:
    one per round it bid in, with the outcome and its reason once settled (a cancelled one
    with why it was cancelled, see ``bids_why``)."""
    return bids_why(
        list(
            Bid.objects.filter(order=order)
            .select_related("round")
            .prefetch_related(_limits(), Prefetch("allocations", queryset=_allocations_tier()))
            .order_by("-round__starts_at", "-id")[:limit]
        )
    )


def bids_why(bids: list[Bid]) -> list[Bid]:
    """Give each bid ``why``: its outcome's reason, or for a cancelled bid (which settlement
    never reaches) the reason it was cancelled, from its ``bid.cancel`` audit event: a hard
    cap, its author, an order's edit. One query; returns ``bids``."""
    cancelled = [b.pk for b in bids if b.status == Bid.Status.CANCELLED and not b.outcome_reason]
    reasons: dict[str, str] = {}
    if cancelled:
        from audit.models import AuditEvent

        for object_id, after in AuditEvent.objects.filter(
            action="bid.cancel", object_id__in=[str(pk) for pk in cancelled]
        ).values_list("object_id", "after"):
            reasons[object_id] = str((after or {}).get("reason") or "")
    for bid in bids:
        if bid.outcome_reason or bid.status != Bid.Status.CANCELLED:
            bid.why = bid.outcome_reason
        else:
            why = reasons.get(str(bid.pk))
            bid.why = (
                f"Cancelled: {why}; the escrow went back to available."
                if why
                else "Cancelled; the escrow went back to available."
            )
    return bids


def _allocations_tier() -> QuerySet[Allocation]:
    return Allocation.objects.select_related("tier").order_by("tier__slug")


def order_allocation_current(
    *, order: Order, node: str | None = None, at: datetime | None = None
) -> Allocation | None:
    """The allocation the order's work runs on now (active, its window containing ``at``);
    with ``node``, the one placed on that node."""
    at = at or timezone.now()
    current = (
        Allocation.objects.filter(
            bid__order=order,
            status=Allocation.Status.ACTIVE,
            starts_at__lte=at,
            ends_at__gt=at,
        )
        .select_related("tier")
        .order_by("-starts_at", "id")
    )
    for allocation in current:
        if node is None or any(gpu["node"] == node for gpu in allocation.placement or []):
            return allocation
    return None


def order_foresight(*, order: Order, now: datetime | None = None) -> Foresight:
    """What the last rounds' clearing prices say of the order's chances, ETA and, with a
    deadline, the value it needs (market/foresight.py)."""
    now = now or timezone.now()
    if not order.live:
        return Foresight(0, None, None, None, f"the order is {order.get_status_display().lower()}")
    policy = policy_active_get()
    window = (policy.round_minutes if policy else 60) * 60
    values = {limit.tier.slug: limit.price for limit in order.limits.all()}
    remaining = None
    if order.gpu_seconds_wanted is not None:
        remaining = max(order.gpu_seconds_wanted - order.gpu_seconds, 0)
    return foresee(
        prices=[row["prices"] for row in price_history(limit=FORESIGHT_ROUNDS)],
        values=values,
        gpus=order.gpus,
        remaining_gpu_seconds=remaining,
        window_seconds=window,
        now=now,
        deadline=order.deadline,
    )


@dataclass(frozen=True)
class HardCapBlock:
    """A team whose bids a hard cap left out of the latest cleared round."""

    tenant: Tenant
    round: Round
    left_out: int  # bids left out
    bids: int  # bids it had in the round
    held: int  # milli-credits the left-out bids held in escrow when placed


def hard_cap_blocked_teams() -> list[HardCapBlock]:
    """The teams a hard cap left bids of out of the latest cleared round, by name."""
    rnd = (
        Round.objects.filter(status__in=CLEARED, cleared_at__isnull=False)
        .order_by("-cleared_at", "-pk")
        .first()
    )
    if rnd is None:
        return []
    left_out = {int(pk) for pk in (rnd.diagnostics or {}).get("left_out_by_hard_cap") or {}}
    if not left_out:
        return []
    per_tenant: dict[int, list[int]] = defaultdict(lambda: [0, 0, 0])
    held = dict(
        Transfer.objects.filter(
            kind=Transfer.Kind.HOLD, reference__in=[f"bid:{pk}" for pk in left_out]
        )
        .values_list("reference")
        .annotate(total=Sum("amount"))
        .order_by()
    )
    for pk, tenant_id in Bid.objects.filter(round=rnd).values_list("pk", "tenant_id"):
        row = per_tenant[tenant_id]
        row[1] += 1
        if pk in left_out:
            row[0] += 1
            row[2] += int(held.get(f"bid:{pk}") or 0)
    tenants = Tenant.objects.filter(pk__in=[t for t, r in per_tenant.items() if r[0]])
    return [
        HardCapBlock(
            tenant=t,
            round=rnd,
            left_out=per_tenant[t.pk][0],
            bids=per_tenant[t.pk][1],
            held=per_tenant[t.pk][2],
        )
        for t in tenants.order_by("name")
    ]
