"""Settlement (the cleared outcome becomes allocations and ledger transfers) and failure
(every hold released). Each runs in one transaction on a round claimed under its row lock."""

from __future__ import annotations

from collections import defaultdict
from datetime import datetime

from django.contrib.auth.models import AbstractBaseUser
from django.db import transaction

import audit.services as audit
from market.errors import MarketError
from market.models import Allocation, Bid, BidLimit, Round, Tier
from market.services._common import cost_floor, now_or, round_notices_send
from market.services.bids import window_seconds
from tenants.ledger import credits, credits_charge, credits_release
from tenants.models import Notification

SYSTEM = "system"


def _round_locked(round_id: int) -> Round:
    return Round.objects.select_for_update(of=("self",)).select_related("policy").get(pk=round_id)


def _open_bids_locked(rnd: Round) -> list[Bid]:
    return list(
        Bid.objects.select_for_update(of=("self",))
        .filter(round=rnd, status=Bid.Status.OPEN)
        .select_related("tenant", "campaign")
        .order_by("pk")
    )


@transaction.atomic
def round_settle(*, round_id: int, now: datetime | None = None) -> Round:
    """Turn a cleared round into allocations and money, all in this one transaction.

    Each winner pays, per tier, gpus x min(tier price, its limit) x window hours (rounded down)
    from its escrow; the rest of its escrow, and a loser's whole escrow, goes back to available.
    Idempotent: a round that is not ``cleared`` (already settled, failed, ...) is returned as is.
    The ledger calls carry ``settle:<round>:<bid>:...`` idempotency keys as a second guard.
    """
    now = now_or(now)
    rnd = _round_locked(round_id)
    if rnd.status != Round.Status.CLEARED:
        return rnd
    bids = _open_bids_locked(rnd)
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


@transaction.atomic
def round_fail(
    *,
    round: Round,  # the domain's word, though it shadows the builtin here
    reason: str,
    actor: AbstractBaseUser | str | None = SYSTEM,
) -> Round:
    """Mark a round that has not settled as failed: every open bid's escrow goes back to
    available (bid status ``refunded``) and the reason is kept on the round, audited and
    sent to admins and to each tenant that had a bid in it. Idempotent."""
    reason = (reason or "").strip()
    if not reason:
        raise MarketError("a failed round needs a reason")
    rnd = _round_locked(round.pk)
    if rnd.status == Round.Status.FAILED:
        return rnd
    if rnd.status not in (Round.Status.OPEN, Round.Status.CLOSED, Round.Status.CLEARED):
        raise MarketError(
            f"round {rnd.pk} is {rnd.status}; only a round that has not settled can fail"
        )
    bids = _open_bids_locked(rnd)
    refunded: dict[int, int] = defaultdict(int)
    for bid in bids:
        if bid.escrow:
            credits_release(
                tenant=bid.tenant,
                amount=bid.escrow,
                actor=None,
                reason=f"round {rnd.pk} failed",
                reference=f"bid:{bid.pk}",
                campaign=bid.campaign,
                idempotency_key=f"fail:{rnd.pk}:{bid.pk}",
            )
            refunded[bid.tenant_id] += bid.escrow
        bid.status, bid.escrow = Bid.Status.REFUNDED, 0
    Bid.objects.bulk_update(bids, ["status", "escrow"])
    before = rnd.status
    rnd.status = Round.Status.FAILED
    rnd.failure_reason = reason[:500]
    rnd.save(update_fields=["status", "failure_reason"])
    tenants = {bid.tenant_id: bid.tenant for bid in bids}
    round_notices_send(
        rnd=rnd,
        kind="round_failed",
        admin_level=Notification.Level.CRITICAL,
        admin_message=f"Round {rnd.pk} failed and every bid in it was refunded: {reason}",
        tenant_messages={
            tenant: (
                f"Round {rnd.pk} failed; {credits(refunded[tenant.pk])} credits of escrow were "
                f"released back to your balance. Reason: {reason}"
            )
            for tenant in tenants.values()
        },
    )
    audit.record(
        actor=actor,
        action="round.fail",
        target=rnd,
        before={"status": before},
        after={
            "status": rnd.status,
            "reason": rnd.failure_reason,
            "bids_refunded": len(bids),
            "released": sum(refunded.values()),
        },
    )
    return rnd
