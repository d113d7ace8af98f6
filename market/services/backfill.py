"""Backfill within a window: GPUs nobody holds now are sold again until the window ends.

Every ``backfill_minutes`` (policy params, default 5) while a settled round's window runs, a
short sub-round offers the pool, per tier the placeable GPUs (healthy, not in maintenance)
that no live allocation holds (unsold, or reclaimed idle: market/services/reclaim.py), to the
active standing orders that accept preemptible capacity (``Order.preemptible``) and hold no
GPUs in the window already. It is cleared by the round's policy with the same code as a round
(``solve``), at the sub-round's prices, for the rest of the window; each award is placed on
one node, charged ``gpus x min(price, value) x time left`` and counted on its order.

Preemptible terms: a backfill allocation ends with the window, and its work is then
suspended like any losing order's (checkpoint signal, grace, SIGSTOP: enforcement). The
GPU's owner of the next window gets it back then; within the window there is no owner to
return, since a reclaimed GPU's team was refunded (no recall right).
"""

from __future__ import annotations

import logging
import secrets
from collections import defaultdict
from dataclasses import dataclass, field
from datetime import datetime, timedelta

import numpy as np
from django.db import transaction
from django.db.models import F

import audit.services as audit
from market import clearing
from market.models import Allocation, Backfill, Bid, BidLimit, Order, OrderLimit, Round, Tier
from market.placement import FreeGpu
from market.placement.inventory import tier_gpus
from market.services._common import now_or
from market.services.reclaim import reclaimed_gpus
from market.services.round_clearing import RoundData, solve
from market.spare import (
    DEFAULT_BACKFILL_MINUTES,
    backfill_charge,
    backfill_escrow,
    backfill_quantity,
    subround_skip,
)
from tenants.errors import TenantError
from tenants.ledger import credits, credits_charge, credits_hold, credits_release
from tenants.models import Campaign, Notification, Tenant

logger = logging.getLogger(__name__)

BACKFILL_MINUTES = "backfill_minutes"
SYSTEM = "backfill"


@dataclass
class BackfillReport:
    backfill: int | None = None
    offered: dict[str, int] = field(default_factory=dict)
    allocations: list[int] = field(default_factory=list)
    skipped: str = ""


def backfill_every(round_: Round) -> timedelta:
    return timedelta(
        minutes=int(round_.policy.params.get(BACKFILL_MINUTES, DEFAULT_BACKFILL_MINUTES))
    )


def backfill_pool(*, now: datetime) -> dict[str, list[FreeGpu]]:
    """{tier slug: GPUs no live allocation holds now}, each list sorted by node and index."""
    reclaimed = reclaimed_gpus(now=now)
    held = {
        gpu["uuid"]
        for pk, placement in Allocation.objects.filter(
            status__in=(Allocation.Status.ACTIVE, Allocation.Status.PAUSED),
            starts_at__lte=now,
            ends_at__gt=now,
        )
        .exclude(placement=[])
        .values_list("pk", "placement")
        for gpu in placement
        if reclaimed.get(gpu["uuid"]) != pk
    }
    pool = {}
    for tier in Tier.objects.filter(active=True).order_by("slug"):
        free = sorted(
            (g for g in tier_gpus(tier.slug) if g.uuid not in held),
            key=lambda g: (g.node, g.index),
        )
        if free:
            pool[tier.slug] = free
    return pool


def _place(free: list[FreeGpu], gpus: int) -> list[FreeGpu] | None:
    """``gpus`` GPUs on one node (the node with the fewest free that fit), or None."""
    by_node: dict[str, list[FreeGpu]] = defaultdict(list)
    for gpu in free:
        by_node[gpu.node].append(gpu)
    fits = sorted((len(g), node) for node, g in by_node.items() if len(g) >= gpus)
    if not fits:
        return None
    return by_node[fits[0][1]][:gpus]


@transaction.atomic
def backfill_run(*, now: datetime | None = None, force: bool = False) -> BackfillReport:
    """One backfill sub-round for the window running now, if one is due (the last was at
    least ``backfill_minutes`` ago; ``force``: now). Single-flight under the round's row
    lock; its bids, escrow, charges and allocations are written in this one transaction."""
    now = now_or(now)
    report = BackfillReport()
    rnd = _window_running_locked(now)
    if rnd is None:
        report.skipped = "no settled window runs now"
        return report
    seconds = int((rnd.ends_at - now).total_seconds())
    last = Backfill.objects.filter(round=rnd).order_by("-at").values_list("at", flat=True).first()
    report.skipped = subround_skip(
        seconds_left=seconds,
        since_last=None if force or last is None else (now - last).total_seconds(),
        every_seconds=backfill_every(rnd).total_seconds(),
    )
    if report.skipped:
        return report
    pool = backfill_pool(now=now)
    report.offered = {slug: len(gpus) for slug, gpus in pool.items()}
    orders = _orders_preemptible_locked(now)
    if not pool or not orders:
        report.skipped = "nothing to offer" if not pool else "no order accepts preemptible capacity"
        return report
    backfill = Backfill.objects.create(
        round=rnd, at=now, capacities={slug: len(g) for slug, g in pool.items()}
    )
    report.backfill = backfill.pk
    bids = _bids(backfill=backfill, rnd=rnd, orders=orders, pool=pool, seconds=seconds)
    if bids:
        report.allocations = _backfill_clear(
            backfill=backfill, rnd=rnd, bids=bids, pool=pool, seconds=seconds, now=now
        )
    backfill.save(update_fields=["prices", "diagnostics", "gpus_won", "revenue"])
    _backfill_audit(backfill, rnd=rnd, bids=bids, allocations=report.allocations)
    return report


def _window_running_locked(now: datetime) -> Round | None:
    """The settled round whose window runs at ``now``, locked; None when there is none or
    another worker holds it (single flight)."""
    return (
        Round.objects.select_for_update(of=("self",), skip_locked=True)
        .select_related("policy")
        .filter(status=Round.Status.SETTLED, starts_at__lte=now, ends_at__gt=now)
        .order_by("-starts_at")
        .first()
    )


def _orders_preemptible_locked(now: datetime) -> list[Order]:
    """The active orders that accept preemptible capacity and hold no GPUs now, locked."""
    holding = set(
        Allocation.objects.filter(
            status__in=(Allocation.Status.ACTIVE, Allocation.Status.PAUSED),
            starts_at__lte=now,
            ends_at__gt=now,
            bid__order__isnull=False,
        ).values_list("bid__order_id", flat=True)
    )
    return list(
        Order.objects.select_for_update()
        .filter(status=Order.Status.ACTIVE, preemptible=True)
        .exclude(pk__in=holding)
        .order_by("pk")
    )


def _backfill_clear(
    *,
    backfill: Backfill,
    rnd: Round,
    bids: list[Bid],
    pool: dict[str, list[FreeGpu]],
    seconds: int,
    now: datetime,
) -> list[int]:
    """Clear the sub-round's bids with the round's policy and settle them; a clearing that
    fails is recorded on the backfill and every bid's escrow goes back. Returns the new
    allocations' ids."""
    limits = {
        (b, slug): price
        for b, slug, price in BidLimit.objects.filter(bid__in=bids).values_list(
            "bid_id", "tier__slug", "price"
        )
    }
    data = _round_data(bids, limits=limits, pool=pool, seconds=seconds)
    try:
        outcome = solve(data=data, policy=rnd.policy)
    except clearing.ClearingError as exc:
        logger.error("backfill %s could not clear: %s", backfill.pk, exc)
        backfill.diagnostics = {"status": "failed", "error": str(exc)[:300]}
        _settle(
            backfill=backfill,
            rnd=rnd,
            bids=bids,
            awards=[],
            prices={},
            limits={},
            pool=pool,
            seconds=seconds,
            now=now,
        )
        return []
    backfill.prices = outcome.prices
    backfill.diagnostics = outcome.diagnostics | {"status": outcome.diagnostics.get("status", "")}
    return _settle(
        backfill=backfill,
        rnd=rnd,
        bids=bids,
        awards=outcome.awards(data),
        prices=outcome.prices,
        limits=limits,
        pool=pool,
        seconds=seconds,
        now=now,
    )


def _round_data(
    bids: list[Bid],
    *,
    limits: dict[tuple[int, str], int],
    pool: dict[str, list[FreeGpu]],
    seconds: int,
) -> RoundData:
    """The sub-round as the clearing reads a round: its bids' columns, the pool's GPUs per
    tier as capacity."""
    slugs = sorted(pool)
    return RoundData(
        bid_ids=np.array([b.pk for b in bids], dtype=np.int64),
        tenant_ids=np.array([b.tenant_id for b in bids], dtype=np.int64),
        quantity=np.array([b.quantity for b in bids], dtype=np.int64),
        min_quantity=np.array([b.min_quantity for b in bids], dtype=np.int64),
        escrow=np.array([b.escrow for b in bids], dtype=np.int64),
        limits=np.array(
            [[limits.get((b.pk, slug), 0) for slug in slugs] for b in bids], dtype=np.int64
        ),
        tier_slugs=slugs,
        capacity=np.array([len(pool[slug]) for slug in slugs], dtype=np.int64),
        tenant_weights=dict(
            Tenant.objects.filter(pk__in={b.tenant_id for b in bids}).values_list("pk", "weight")
        ),
        seconds=seconds,
    )


def _backfill_audit(
    backfill: Backfill, *, rnd: Round, bids: list[Bid], allocations: list[int]
) -> None:
    audit.record(
        actor=SYSTEM,
        action="backfill.clear",
        target=backfill,
        after={
            "round": rnd.pk,
            "offered": backfill.capacities,
            "prices": backfill.prices,
            "bids": len(bids),
            "allocations": allocations,
            "gpus_won": backfill.gpus_won,
            "revenue": backfill.revenue,
        },
    )


def _bids(
    *,
    backfill: Backfill,
    rnd: Round,
    orders: list[Order],
    pool: dict[str, list[FreeGpu]],
    seconds: int,
) -> list[Bid]:
    """Each order's bid on the pool's tiers at its values, its escrow held; an order its
    ceiling or its team's balance cannot cover sits the sub-round out."""
    values: dict[int, dict[str, int]] = defaultdict(dict)
    tiers = {t.slug: t for t in Tier.objects.filter(slug__in=pool)}
    for order_id, slug, price in OrderLimit.objects.filter(
        order__in=orders, tier__slug__in=pool
    ).values_list("order_id", "tier__slug", "price"):
        values[order_id][slug] = price
    campaigns = Campaign.objects.in_bulk({o.campaign_id for o in orders} - {None})
    bids = []
    for order in orders:
        mine = values.get(order.pk)
        if not mine:
            continue
        quantity = backfill_quantity(
            gpus=order.gpus,
            min_gpus=order.min_gpus,
            gpu_seconds_left=None
            if order.gpu_seconds_wanted is None
            else order.gpu_seconds_wanted - order.gpu_seconds,
            seconds=seconds,
        )
        if quantity is None:
            continue
        escrow = backfill_escrow(quantity=quantity, values=mine, seconds=seconds)
        if order.spent + escrow > order.ceiling:
            continue
        bid = Bid(
            tenant_id=order.tenant_id,
            author_id=order.author_id,
            round=rnd,
            backfill=backfill,
            campaign_id=order.campaign_id,
            order=order,
            quantity=quantity,
            min_quantity=order.min_gpus if order.min_gpus > 1 else 0,
            escrow=escrow,
            note=f"order {order.pk}: {order.name} (backfill {backfill.pk})"[:200],
        )
        try:
            with transaction.atomic():
                bid.save()
                credits_hold(
                    tenant=order.tenant,
                    amount=escrow,
                    reason=f"escrow for backfill bid {bid.pk} (order {order.pk})",
                    reference=f"bid:{bid.pk}",
                    campaign=campaigns.get(order.campaign_id),
                    idempotency_key=f"backfill-hold:{bid.pk}",
                )
        except TenantError:
            continue  # its team cannot cover it now: it sits this sub-round out
        BidLimit.objects.bulk_create(
            [BidLimit(bid=bid, tier=tiers[slug], price=price) for slug, price in mine.items()]
        )
        bids.append(bid)
    return bids


def _settle(
    *,
    backfill: Backfill,
    rnd: Round,
    bids: list[Bid],
    awards: list[list],
    prices: dict[str, int],
    limits: dict[tuple[int, str], int],
    pool: dict[str, list[FreeGpu]],
    seconds: int,
    now: datetime,
) -> list[int]:
    """Awards into placed, charged allocations; every bid's escrow released but its charge."""
    created, charged = _awards_allocate(
        rnd=rnd,
        bids=bids,
        awards=awards,
        prices=prices,
        limits=limits,
        pool=pool,
        seconds=seconds,
        now=now,
    )
    won_gpus: dict[int, int] = defaultdict(int)
    for allocation in created:
        won_gpus[allocation.bid_id] += allocation.gpus
    notices = []
    for bid in bids:
        charge = charged.get(bid.pk, 0)
        _bid_pay(backfill, bid=bid, charge=charge, won=won_gpus.get(bid.pk))
        if bid.pk in won_gpus:
            notices.append(
                _order_progress(bid, rnd=rnd, gpus=won_gpus[bid.pk], charge=charge, seconds=seconds)
            )
    Notification.objects.bulk_create(notices, ignore_conflicts=True)
    backfill.gpus_won = sum(won_gpus.values())
    backfill.revenue = sum(charged.values())
    return [a.pk for a in created]


def _awards_allocate(
    *,
    rnd: Round,
    bids: list[Bid],
    awards: list[list],
    prices: dict[str, int],
    limits: dict[tuple[int, str], int],
    pool: dict[str, list[FreeGpu]],
    seconds: int,
    now: datetime,
) -> tuple[list[Allocation], dict[int, int]]:
    """Each award placed on one node of the pool and saved as a preemptible allocation to
    the window's end (a gang no one node holds loses the sub-round); the allocations and
    {bid id: milli-credits charged}."""
    by_bid = {b.pk: b for b in bids}
    free = {slug: list(gpus) for slug, gpus in pool.items()}
    tiers = {t.slug: t for t in Tier.objects.filter(slug__in=pool)}
    charged: dict[int, int] = defaultdict(int)
    created: list[Allocation] = []
    for bid_id, slug, gpus in sorted(awards):
        bid = by_bid[bid_id]
        placed = _place(free[slug], gpus)
        if placed is None:
            continue  # no one node holds the gang: it loses this sub-round
        free[slug] = [g for g in free[slug] if g not in placed]
        price = min(prices[slug], limits[(bid_id, slug)])
        charge = backfill_charge(
            gpus=gpus, price=prices[slug], limit=limits[(bid_id, slug)], seconds=seconds
        )
        created.append(
            Allocation.objects.create(
                tenant_id=bid.tenant_id,
                round=rnd,
                bid=bid,
                tier=tiers[slug],
                gpus=gpus,
                price=price,
                charge=charge,
                placement=[{"node": g.node, "index": g.index, "uuid": g.uuid} for g in placed],
                launch_secret=secrets.token_hex(32),
                starts_at=now,
                ends_at=rnd.ends_at,
                preemptible=True,
            )
        )
        charged[bid_id] += charge
    return created, charged


def _bid_pay(backfill: Backfill, *, bid: Bid, charge: int, won: int | None) -> None:
    """Charge the bid what it won (``won`` GPUs; None: it won nothing), release the rest of
    its escrow, and close it as won or lost."""
    ledger = {
        "tenant": bid.tenant,
        "actor": None,
        "reference": f"bid:{bid.pk}",
        "campaign": bid.campaign,
    }
    if charge:
        credits_charge(
            amount=charge,
            reason=f"backfill {backfill.pk}: bid {bid.pk} won {won} GPU(s)",
            idempotency_key=f"backfill-charge:{bid.pk}",
            **ledger,
        )
    if bid.escrow - charge:
        credits_release(
            amount=bid.escrow - charge,
            reason=f"backfill {backfill.pk}: what bid {bid.pk} did not spend",
            idempotency_key=f"backfill-release:{bid.pk}",
            **ledger,
        )
    bid.status = Bid.Status.LOST if won is None else Bid.Status.WON
    bid.escrow = 0
    bid.save(update_fields=["status", "escrow", "updated_at"])


def _order_progress(bid: Bid, *, rnd: Round, gpus: int, charge: int, seconds: int) -> Notification:
    """Count what the winning bid's order received and paid; the notice telling its team."""
    Order.objects.filter(pk=bid.order_id).update(
        gpu_seconds=F("gpu_seconds") + gpus * seconds,
        spent=F("spent") + charge,
    )
    return Notification(
        tenant_id=bid.tenant_id,
        level=Notification.Level.INFO,
        kind="backfill_won",
        message=(
            f"Order {bid.order_id} took {gpus} idle GPU(s) on preemptible "
            f"terms until {rnd.ends_at:%H:%M} UTC for {credits(charge)} credits; its "
            f"work gets the checkpoint signal and a grace before that GPU is needed."
        )[:500],
        dedupe_key=f"backfill-won:{bid.pk}",
    )
