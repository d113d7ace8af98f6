"""Settlement: the cleared outcome becomes allocations and ledger transfers, in one
transaction on a round claimed under its row lock (failing a round is in services/void.py)."""

from __future__ import annotations

import logging
import secrets
from collections import defaultdict
from dataclasses import dataclass, field
from datetime import datetime

from celery import current_app
from django.conf import settings
from django.db import transaction

import audit.services as audit
from core.money import cost_floor
from core.rows import rows_insert, rows_update
from market.energy import JOULES_PER_KWH
from market.errors import MarketError
from market.models import Allocation, Bid, BidLimit, Round, Tier
from market.outcomes import RoundFacts, bid_reason
from market.services._common import bids_locked, now_or, round_locked
from market.services.bids import window_seconds
from market.services.orders.settling import orders_settle
from market.services.placement import as_json, round_placement
from tenants.ledger import (
    TransferOrder,
    balance_get,
    credits,
    credits_charge,
    credits_hold,
    hold_accounts_lock,
    transfer_execute_many,
)
from tenants.models import Notification, Transfer

SYSTEM = "system"


logger = logging.getLogger(__name__)
# Queued by name: the task module imports the services, never the other way round.
SLURM_RESERVE_TASK = "market.slurm_reservations_create"


@dataclass
class _Books:
    """What settling a round's bids adds up to: the rows to insert, the money to move, the
    figures for the audit event."""

    allocations: list[Allocation] = field(default_factory=list)
    orders: list[TransferOrder] = field(default_factory=list)  # every charge and release
    per_tier: dict[str, dict[str, int]] = field(
        default_factory=lambda: defaultdict(lambda: {"gpus": 0, "charge": 0})
    )
    revenue: int = 0
    winners: int = 0


@transaction.atomic
def round_settle(*, round_id: int, now: datetime | None = None, wait: bool = True) -> Round:
    """Turn a cleared round into allocations and money, all in this one transaction.

    Each winner pays, per tier, gpus x min(tier price, its limit) x window hours (rounded down)
    from its escrow; the rest of its escrow, and a loser's whole escrow, goes back to available.
    Idempotent: a round that is not ``cleared`` (already settled, failed, ...) is returned as is.
    The ledger calls carry ``settle:<round>:<bid>:...`` idempotency keys as a second guard.
    ``wait=False``: RoundBusy if another worker holds the round longer than a moment
    (``round_locked``).
    """
    now = now_or(now)
    rnd = round_locked(round_id, wait=wait)
    if rnd.status != Round.Status.CLEARED:
        return rnd
    bids = bids_locked(rnd, status=Bid.Status.OPEN)
    books = _bids_settle(rnd, bids=bids, now=now)
    preemptions = _books_write(rnd, bids=bids, books=books, now=now)
    _round_mark_settled(rnd, bids=bids, books=books, preemptions=preemptions, now=now)
    return rnd


def _bids_settle(rnd: Round, *, bids: list[Bid], now: datetime) -> _Books:
    """Price every bid's awards into allocations, its escrow into a charge and a release,
    and close the bid as won or lost with its reason (in memory; ``_books_write`` saves)."""
    seconds = window_seconds(rnd)
    limits, pays = _bid_limits(rnd)
    limits_of: dict[int, dict[str, int]] = defaultdict(dict)
    for (bid_id, slug), price in limits.items():
        limits_of[bid_id][slug] = price
    tiers = Tier.objects.in_bulk(list(rnd.prices), field_name="slug")
    awards = _awards_by_bid(rnd)
    facts = _facts(rnd, awards=awards, bids=bids)
    books = _Books()
    for bid in bids:
        charge = _bid_allocate(
            rnd,
            bid,
            awards=awards.get(bid.pk, []),
            limits=limits,
            pays=pays,
            tiers=tiers,
            seconds=seconds,
            books=books,
        )
        won = sum(gpus for _, gpus in awards.get(bid.pk, []))
        books.orders += _bid_transfers(rnd, bid, charge=charge, won=won)
        books.winners += bid.pk in awards
        _bid_close(bid, awards=awards, limits_of=limits_of, facts=facts, now=now)
        books.revenue += charge
    return books


def _bid_limits(rnd: Round) -> tuple[dict[tuple[int, str], int], dict[tuple[int, str], int]]:
    """(bid id, tier slug) -> the bid's limit price, and -> what it pays at most where that is
    below what the clearing saw (an order's stated value under its incumbency's restart value:
    market/orders.py)."""
    limits: dict[tuple[int, str], int] = {}
    pays: dict[tuple[int, str], int] = {}
    for bid_id, slug, price, charge_limit in BidLimit.objects.filter(bid__round=rnd).values_list(
        "bid_id", "tier__slug", "price", "charge_limit"
    ):
        limits[bid_id, slug] = price
        pays[bid_id, slug] = price if charge_limit is None else min(price, charge_limit)
    return limits, pays


def _awards_by_bid(rnd: Round) -> dict[int, list[tuple[str, int]]]:
    awards: dict[int, list[tuple[str, int]]] = defaultdict(list)
    for bid_id, slug, gpus in rnd.awards:
        awards[int(bid_id)].append((slug, int(gpus)))
    return awards


def _bid_allocate(
    rnd: Round,
    bid: Bid,
    *,
    awards: list[tuple[str, int]],
    limits: dict[tuple[int, str], int],
    pays: dict[tuple[int, str], int],
    tiers: dict[str, Tier],
    seconds: int,
    books: _Books,
) -> int:
    """Add one allocation per tier the bid won to ``books``; return the bid's whole charge,
    which must fit in its escrow."""
    charge_total = 0
    for slug, gpus in sorted(awards):
        if limits.get((bid.pk, slug)) is None:
            raise MarketError(
                f"round {rnd.pk}: the solver gave bid {bid.pk} tier {slug}, which it did not bid on"
            )
        price = min(int(rnd.prices[slug]), pays[bid.pk, slug])
        charge = cost_floor(gpus=gpus, price=price, seconds=seconds)
        charge_total += charge
        books.per_tier[slug]["gpus"] += gpus
        books.per_tier[slug]["charge"] += charge
        books.allocations.append(
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
    return charge_total


def _bid_transfers(rnd: Round, bid: Bid, *, charge: int, won: int) -> list[TransferOrder]:
    """The bid's escrow split into what it is charged and what goes back to available
    (``won``: GPUs awarded, for the charge's reason)."""
    ledger = {"tenant": bid.tenant, "reference": f"bid:{bid.pk}", "campaign": bid.campaign}
    orders: list[TransferOrder] = []
    if charge:
        orders.append(
            TransferOrder(
                kind=Transfer.Kind.CHARGE,
                amount=charge,
                reason=f"round {rnd.pk}: bid {bid.pk} won {_gpus(won)}",
                idempotency_key=f"settle:{rnd.pk}:{bid.pk}:charge",
                **ledger,
            )
        )
    rest = bid.escrow - charge
    if rest:
        orders.append(
            TransferOrder(
                kind=Transfer.Kind.RELEASE,
                amount=rest,
                reason=f"round {rnd.pk}: escrow not spent by bid {bid.pk}",
                idempotency_key=f"settle:{rnd.pk}:{bid.pk}:release",
                **ledger,
            )
        )
    return orders


def _bid_close(
    bid: Bid,
    *,
    awards: dict[int, list[tuple[str, int]]],
    limits_of: dict[int, dict[str, int]],
    facts: RoundFacts,
    now: datetime,
) -> None:
    """Mark the bid won or lost with the reason a tenant reads, its escrow spent."""
    bid.status = Bid.Status.WON if bid.pk in awards else Bid.Status.LOST
    bid.outcome, bid.outcome_reason = bid_reason(
        bid_id=bid.pk,
        tenant_id=bid.tenant_id,
        quantity=bid.quantity,
        min_quantity=bid.min_quantity,
        limits=limits_of.get(bid.pk, {}),
        awarded=dict(awards.get(bid.pk, [])),
        facts=facts,
    )
    bid.escrow = 0
    bid.updated_at = now


def _books_write(rnd: Round, *, bids: list[Bid], books: _Books, now: datetime) -> int:
    """Move the money, place and insert the allocations, save the bids and settle the
    standing orders behind them; return how many incumbents were preempted."""
    transfer_execute_many(orders=books.orders)
    _place(rnd, books.allocations, bids)
    rows_insert(books.allocations)
    rows_update(bids, ["status", "escrow", "updated_at", "outcome", "outcome_reason"])
    return orders_settle(rnd=rnd, bids=bids, allocations=books.allocations, now=now)


def _round_mark_settled(
    rnd: Round, *, bids: list[Bid], books: _Books, preemptions: int, now: datetime
) -> None:
    """Tell each tenant its result, queue the Slurm reservations on commit, save the round as
    settled and record the ``round.settle`` audit event."""
    rnd.diagnostics = {**(rnd.diagnostics or {}), "preemptions": preemptions}
    _tenant_notices(rnd, bids)
    placed = [a.pk for a in books.allocations if a.placement]
    if placed and settings.GPUMARKET_SLURM_RESERVATIONS:
        transaction.on_commit(lambda: _slurm_reserve(placed))
    rnd.revenue = books.revenue
    rnd.status = Round.Status.SETTLED
    rnd.settled_at = now
    rnd.save(update_fields=["revenue", "status", "settled_at", "diagnostics"])
    audit.record(
        actor=SYSTEM,
        action="round.settle",
        target=rnd,
        before={"status": Round.Status.CLEARED},
        after={
            "status": rnd.status,
            "revenue": books.revenue,
            "bids": len(bids),
            "winners": books.winners,
            "allocations": len(books.allocations),
            "preemptions": preemptions,
            "prices": rnd.prices,
            "tiers": dict(books.per_tier),
        },
    )


def energy_charge(*, joules: int, price: int) -> int:
    """Milli-credits for ``joules`` at ``price`` milli-credits per kWh, rounded down."""
    return joules * price // JOULES_PER_KWH


@transaction.atomic
def allocations_energy_settle(
    *, metered: dict[int, int], now: datetime | None = None
) -> list[Allocation]:
    """Record the energy each allocation's GPUs used in its window (``metered``: allocation
    id -> whole joules, from telemetry) and charge it at the tier's energy price.

    The energy charge is its own ledger line after the window: the amount is held from the
    team's available credits and charged (reference ``allocation:<id>``, idempotency keys
    ``energy:<id>:hold|charge``), in this transaction, with an ``allocation.energy`` audit
    event. It is never more than the team's available credits at the time (the shortfall
    is recorded in the audit event and on nothing else), never negative, and an allocation
    already metered is left as it is, so a rerun charges nothing twice.
    """
    now = now_or(now)
    allocations = list(
        Allocation.objects.select_for_update(of=("self",))
        .select_related("tier", "tenant")
        .filter(pk__in=list(metered), energy_j__isnull=True)
        .order_by("pk")
    )
    for allocation in allocations:
        joules = max(int(metered[allocation.pk]), 0)
        due = energy_charge(joules=joules, price=allocation.tier.energy_price)
        charge = 0
        if due:
            tenant = allocation.tenant
            hold_accounts_lock(tenant=tenant)
            charge = min(due, balance_get(tenant=tenant).available)
        if charge:
            kwh = f"{joules / JOULES_PER_KWH:.3f} kWh"
            reason = (
                f"energy: allocation {allocation.pk} used {kwh} at "
                f"{credits(allocation.tier.energy_price)} credits/kWh"
            )
            ledger = {"tenant": allocation.tenant, "reference": f"allocation:{allocation.pk}"}
            credits_hold(
                amount=charge,
                reason=reason,
                idempotency_key=f"energy:{allocation.pk}:hold",
                **ledger,
            )
            credits_charge(
                amount=charge,
                reason=reason,
                idempotency_key=f"energy:{allocation.pk}:charge",
                **ledger,
            )
        allocation.energy_j = joules
        allocation.energy_charge = charge
        allocation.save(update_fields=["energy_j", "energy_charge"])
        audit.record(
            actor=SYSTEM,
            action="allocation.energy",
            target=allocation,
            tenant=allocation.tenant,
            after={
                "energy_j": joules,
                "energy_price": allocation.tier.energy_price,
                "energy_charge": charge,
                "unpaid": due - charge,
                "metered_at": now.isoformat(),
            },
        )
    return allocations


def _slurm_reserve(allocation_ids: list[int]) -> None:
    current_app.send_task(SLURM_RESERVE_TASK, args=[allocation_ids])


def _place(rnd: Round, allocations: list[Allocation], bids: list[Bid]) -> None:
    """Bind every new allocation to GPUs, in settlement's transaction. Clearing left out the
    gangs that could not be placed whole; if the fleet changed since (a GPU went into
    maintenance), a gang is placed in as few pieces as possible rather than lost."""
    of = {bid.pk: bid for bid in bids}
    awards = [(a.bid_id, a.tier.slug, a.gpus) for a in allocations]
    tenant = {pk: bid.tenant_id for pk, bid in of.items()}
    gang = {pk: bid.min_quantity > 1 for pk, bid in of.items()}
    placed = round_placement(rnd=rnd, awards=awards, gang=gang, tenant=tenant)
    late = [(b, s, g) for b, s, g in awards if placed.get(s) and b in placed[s].unplaced]
    if late:
        logger.warning("round %s: gangs %s placed in pieces (the fleet changed)", rnd.pk, late)
        again = round_placement(rnd=rnd, awards=awards, gang={}, tenant=tenant)
        placed = {slug: again[slug] for slug in placed}
    for allocation in allocations:
        placement = placed.get(allocation.tier.slug)
        if placement is not None:
            allocation.placement = as_json(placement.placed.get(allocation.bid_id, ()))
            if allocation.placement:
                allocation.launch_secret = secrets.token_hex(32)


def _facts(rnd: Round, *, awards: dict[int, list[tuple[str, int]]], bids: list[Bid]) -> RoundFacts:
    tenant_of = {bid.pk: bid.tenant_id for bid in bids}
    tenant_gpus: dict[tuple[int, str], int] = defaultdict(int)
    for bid_id, rows in awards.items():
        for slug, gpus in rows:
            tenant_gpus[tenant_of.get(bid_id, 0), slug] += gpus
    slugs = list(rnd.prices)
    return RoundFacts(
        mechanism=rnd.policy.mechanism,
        prices={slug: int(p) for slug, p in rnd.prices.items()},
        reserves={slug: rnd.policy.reserve_for(slug) for slug in slugs},
        capacities={slug: int(c) for slug, c in (rnd.capacities or {}).items()},
        share_cap_pct={slug: rnd.policy.max_share_for(slug) for slug in slugs},
        tenant_gpus=dict(tenant_gpus),
        left_out={
            int(pk): why
            for pk, why in ((rnd.diagnostics or {}).get("left_out_by_hard_cap") or {}).items()
        },
        misplaced={
            int(pk): why
            for pk, why in ((rnd.diagnostics or {}).get("left_out_by_placement") or {}).items()
        },
    )


def _tenant_notices(rnd: Round, bids: list[Bid]) -> None:
    """One notice per tenant with bids in the round: what it won and lost, pointing at the
    reasons on its bids (sent once: the dedupe key names the round and the tenant)."""
    per_tenant: dict[int, list[Bid]] = defaultdict(list)
    for bid in bids:
        per_tenant[bid.tenant_id].append(bid)
    notices = []
    for tenant_id, mine in per_tenant.items():
        won = [b for b in mine if b.status == Bid.Status.WON]
        lost = [b for b in mine if b.status == Bid.Status.LOST]
        message = f"Round {rnd.pk} ({rnd.starts_at:%Y-%m-%d %H:%M} UTC): {len(won)} of {len(mine)} bids won."
        if lost:
            message += f" Bid {lost[0].pk} lost: {lost[0].outcome_reason}"
            if len(lost) > 1:
                message += f" ({len(lost) - 1} more lost; see My bids for each reason.)"
        notices.append(
            Notification(
                tenant_id=tenant_id,
                level=Notification.Level.INFO,
                kind="round_result",
                message=message[:500],
                dedupe_key=f"round-result:{rnd.pk}:{tenant_id}",
            )
        )
    Notification.objects.bulk_create(notices, ignore_conflicts=True)


def _gpus(n: int) -> str:
    return f"{n} GPU" if n == 1 else f"{n} GPUs"
