"""The database read behind the demand forecast (the maths is in market/forecast.py)."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime

from market.models import Bid, BidLimit, Round, Tier

# Rounds whose bids are final: settlement has run, so no bid can be cancelled or edited any more.
HISTORY_STATUSES = (Round.Status.SETTLED, Round.Status.FINISHED)


@dataclass(frozen=True)
class TierHistory:
    """One tier over the same rounds, oldest first (all lists have one entry per round).

    ``demand``: GPUs asked for on the tier (a multi-tier bid split over its tiers). ``capacity``: GPUs the round
    offered on it, ``price``: its clearing price in milli-credits per GPU-hour (None where the
    round did not offer the tier).
    """

    tier: str
    rounds: list[int]
    starts_at: list[datetime]
    demand: list[float]
    capacity: list[int | None]
    price: list[int | None]


def demand_on_tier(quantity: int, tiers: int) -> float:
    """The one rule for a bid's demand on each tier it accepts, for the supply/demand chart
    and the demand forecast alike: a bid wants its GPUs once, not on every tier, so it counts
    its quantity divided by the number of the round's tiers it accepts on each of them, and
    demand over all tiers adds up to the GPUs asked for."""
    return quantity / max(tiers, 1)


def tier_demand_history(
    *, tier_slugs: Iterable[str] | None = None, rounds: int = 96
) -> dict[str, TierHistory]:
    """Demand, capacity and price per tier over the last ``rounds`` settled or finished rounds.

    Demand of a round on a tier is what the round's bids (cancelled bids excluded) asked for
    there, a bid that accepts several of the round's tiers split evenly over them
    (``demand_on_tier``), so demand summed over tiers is what was asked for. A round with no
    bid on a tier has demand 0 there. ``tier_slugs`` defaults to the active tiers. Two queries.
    """
    if rounds < 1:
        raise ValueError(f"rounds must be at least 1, got {rounds}")
    slugs = sorted(
        tier_slugs
        if tier_slugs is not None
        else Tier.objects.filter(active=True).values_list("slug", flat=True)
    )
    window = list(
        Round.objects.filter(status__in=HISTORY_STATUSES)
        .order_by("-starts_at")
        .values_list("pk", "starts_at", "capacities", "prices")[:rounds]
    )
    window.reverse()
    offered = {round_id: set(capacities or {}) for round_id, _, capacities, _ in window}
    rows = list(
        BidLimit.objects.filter(bid__round_id__in=list(offered))
        .exclude(bid__status=Bid.Status.CANCELLED)
        .values_list("bid_id", "bid__round_id", "tier__slug", "bid__quantity")
    )
    # A round stored before it recorded its capacities counts every tier a bid accepts.
    tiers_of: dict[int, int] = defaultdict(int)
    for bid_id, round_id, slug, _ in rows:
        if not offered[round_id] or slug in offered[round_id]:
            tiers_of[bid_id] += 1
    asked: dict[tuple[int, str], float] = defaultdict(float)
    for bid_id, round_id, slug, quantity in rows:
        if not offered[round_id] or slug in offered[round_id]:
            asked[round_id, slug] += demand_on_tier(quantity, tiers_of[bid_id])
    return {
        slug: TierHistory(
            tier=slug,
            rounds=[round_id for round_id, *_ in window],
            starts_at=[starts_at for _, starts_at, _, _ in window],
            demand=[asked.get((round_id, slug), 0) for round_id, *_ in window],
            capacity=[_int_or_none(capacities.get(slug)) for _, _, capacities, _ in window],
            price=[_int_or_none(prices.get(slug)) for _, _, _, prices in window],
        )
        for slug in slugs
    }


def _int_or_none(value: object) -> int | None:
    return None if value is None else int(value)
