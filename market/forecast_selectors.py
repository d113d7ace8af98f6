"""The database read behind the demand forecast (the maths is in market/forecast.py)."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime

from django.db.models import Sum

from market.models import Bid, BidLimit, Round, Tier

# Rounds whose bids are final: settlement has run, so no bid can be cancelled or edited any more.
HISTORY_STATUSES = (Round.Status.SETTLED, Round.Status.FINISHED)


@dataclass(frozen=True)
class TierHistory:
    """One tier over the same rounds, oldest first (all lists have one entry per round).

    ``demand``: GPUs asked for by bids that accepted the tier. ``capacity``: GPUs the round
    offered on it, ``price``: its clearing price in milli-credits per GPU-hour (None where the
    round did not offer the tier).
    """

    tier: str
    rounds: list[int]
    starts_at: list[datetime]
    demand: list[int]
    capacity: list[int | None]
    price: list[int | None]


def tier_demand_history(
    *, tier_slugs: Iterable[str] | None = None, rounds: int = 96
) -> dict[str, TierHistory]:
    """Demand, capacity and price per tier over the last ``rounds`` settled or finished rounds.

    Demand of a round on a tier is the sum of the quantities of the round's bids that have a
    limit on that tier, cancelled bids excluded. A bid that accepts several tiers counts in
    full on each of them (it says how many GPUs would be wanted if that tier were the only
    one), so demand summed over tiers can exceed what was asked for in total. A round with no
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
    asked: dict[tuple[int, str], int] = {
        (round_id, slug): total
        for round_id, slug, total in BidLimit.objects.filter(
            bid__round_id__in=[r[0] for r in window], tier__slug__in=slugs
        )
        .exclude(bid__status=Bid.Status.CANCELLED)
        .values_list("bid__round_id", "tier__slug")
        .annotate(total=Sum("bid__quantity"))
        .order_by()
    }
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
