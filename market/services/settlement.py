"""Settlement: the cleared outcome becomes allocations and ledger transfers, in one
transaction on a round claimed under its row lock (failing a round is in services/void.py)."""

from __future__ import annotations

from collections import defaultdict
from datetime import datetime

from django.db import transaction

import audit.services as audit
from market.errors import MarketError
from market.models import Allocation, Bid, BidLimit, Round, Tier
from market.services._common import bids_locked, cost_floor, now_or, round_locked
from market.services.bids import window_seconds
from tenants.ledger import credits_charge, credits_release

SYSTEM = "system"


@transaction.atomic
def round_settle(*, round_id: int, now: datetime | None = None) -> Round:
    """Turn a cleared round into allocations and money, all in this one transaction.

    Each winner pays, per tier, gpus x min(tier price, its limit) x window hours (rounded down)
    from its escrow; the rest of its escrow, and a loser's whole escrow, goes back to available.
    Idempotent: a round that is not ``cleared`` (already settled, failed, ...) is returned as is.
    The ledger calls carry ``settle:<round>:<bid>:...`` idempotency keys as a second guard.
    """
    now = now_or(now)
    rnd = round_locked(round_id)
    if rnd.status != Round.Status.CLEARED:
        return rnd
    bids = bids_locked(rnd, status=Bid.Status.OPEN)
    seconds = window_seconds(rnd)
    limits: dict[tuple[int, str], int] = {
        (bid_id, slug): price
        for bid_id, slug, price in BidLimit.objects.filter(bid__round=rnd).values_list(
            "bid_id", "tier__slug", "price"
        )
    }
    tiers = Tier.objects.in_bulk(list(rnd.prices), field_name="slug")
    awards: dict[int, list[tuple[str, int]]] = defaultdict(list)
    for bid_id, slug, gpus in rnd.awards:
        awards[int(bid_id)].append((slug, int(gpus)))

    allocations: list[Allocation] = []
    revenue = winners = 0
    per_tier: dict[str, dict[str, int]] = defaultdict(lambda: {"gpus": 0, "charge": 0})
    for bid in bids:
        charge_total = 0
        for slug, gpus in sorted(awards.get(bid.pk, [])):
            limit = limits.get((bid.pk, slug))
            if limit is None:
                raise MarketError(
                    f"round {rnd.pk}: the solver gave bid {bid.pk} tier {slug}, which it did not bid on"
                )
            price = min(int(rnd.prices[slug]), limit)
            charge = cost_floor(gpus=gpus, price=price, seconds=seconds)
            charge_total += charge
            per_tier[slug]["gpus"] += gpus
            per_tier[slug]["charge"] += charge
            allocations.append(
                Allocation(
                    tenant_id=bid.tenant_id,
                    round=rnd,
                    bid=bid,
                    tier=tiers[slug],
                    gpus=gpus,
                    price=price,
                    charge=charge,
                    starts_at=rnd.starts_at,
                    ends_at=rnd.ends_at,
                )
            )
        if charge_total > bid.escrow:
            raise MarketError(
                f"round {rnd.pk}: bid {bid.pk} would be charged {charge_total} but holds only {bid.escrow}"
            )
        ledger = {
            "tenant": bid.tenant,
            "actor": None,
            "reference": f"bid:{bid.pk}",
            "campaign": bid.campaign,
        }
        if charge_total:
            credits_charge(
                amount=charge_total,
                reason=f"round {rnd.pk}: {bid.pk} won",
                idempotency_key=f"settle:{rnd.pk}:{bid.pk}:charge",
                **ledger,
            )
        rest = bid.escrow - charge_total
        if rest:
            credits_release(
                amount=rest,
                reason=f"round {rnd.pk}: escrow not spent by bid {bid.pk}",
                idempotency_key=f"settle:{rnd.pk}:{bid.pk}:release",
                **ledger,
            )
        won = bid.pk in awards
        winners += won
        bid.status = Bid.Status.WON if won else Bid.Status.LOST
        bid.escrow = 0
        bid.updated_at = now
        revenue += charge_total
    Allocation.objects.bulk_create(allocations)
    Bid.objects.bulk_update(bids, ["status", "escrow", "updated_at"])
    rnd.revenue = revenue
    rnd.status = Round.Status.SETTLED
    rnd.settled_at = now
    rnd.save(update_fields=["revenue", "status", "settled_at"])
    audit.record(
        actor=SYSTEM,
        action="round.settle",
        target=rnd,
        before={"status": Round.Status.CLEARED},
        after={
            "status": rnd.status,
            "revenue": revenue,
            "bids": len(bids),
            "winners": winners,
            "allocations": len(allocations),
            "prices": rnd.prices,
            "tiers": dict(per_tier),
        },
    )
    return rnd
