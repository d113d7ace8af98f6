"""The round opener's part: every active order's bid, placed in bulk (``orders_bid``)."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import datetime
from typing import NamedTuple

from django.db import router, transaction
from django.db.models import QuerySet, Sum

import audit.services as audit
from core.rows import rows_copy, rows_update
from market.models import Allocation, Bid, BidLimit, Order, OrderLimit, Round, Tier
from market.orders import NoBid, OrderBid, OrderState, order_bid
from market.services._common import now_or
from market.services.bids import _round_shared, window_seconds
from market.services.orders.notices import (
    deadline_reason,
    deadlines_check,
    done_reason,
    ended_notify,
)
from market.services.orders.purses import Purse, purses_read
from tenants.ledger import TransferOrder, transfer_execute_many
from tenants.models import Campaign, Tenant, Transfer

SYSTEM = "orders"  # the actor of the audit events orders record on their own


def incumbents(
    *, order_ids: Iterable[int] | QuerySet, ends_at: datetime
) -> dict[int, dict[str, int]]:
    """{order id: {tier slug: GPUs}} the orders hold in windows ending at ``ends_at``;
    ``order_ids`` may be a query of their ids (one subquery rather than a parameter each)."""
    rows = Allocation.objects.filter(
        bid__order_id__in=order_ids if isinstance(order_ids, QuerySet) else list(order_ids),
        ends_at=ends_at,
        status__in=(
            Allocation.Status.ACTIVE,
            Allocation.Status.PAUSED,
            Allocation.Status.FINISHED,
            Allocation.Status.PREEMPTED,
        ),
    ).values_list("bid__order_id", "tier__slug", "gpus")
    held: dict[int, dict[str, int]] = defaultdict(dict)
    for order_id, slug, gpus in rows:
        held[order_id][slug] = held[order_id].get(slug, 0) + gpus
    return held


@dataclass
class OpenReport:
    bids: list[int]  # the new bids' ids, in the orders' order
    held: dict[int, str]  # order id -> why it made no bid
    ended: dict[int, str]  # order id -> status it ended in


class _Live(NamedTuple):
    """What the opener reads of a live order: one tuple per order, not a model object (a
    model object each cost a tenth of a 10,000-order opening). An order whose row changes
    becomes an object (``_order_of``), as few do in a round."""

    id: int
    tenant_id: int
    author_id: int
    campaign_id: int | None
    name: str
    gpus: int
    min_gpus: int
    gpu_seconds_wanted: int | None
    gpu_seconds: int
    ceiling: int
    spent: int
    deadline: datetime | None
    restart_seconds: int
    status: str
    status_reason: str
    hold_reason: str
    updated_at: datetime
    ended_at: datetime | None


def _order_of(row: _Live) -> Order:
    """The order of ``row`` as a saved model object; its fields the row leaves out are
    deferred (read from the database if asked for, never written as defaults)."""
    values = row._asdict()
    names = [f.attname for f in Order._meta.concrete_fields if f.attname in values]
    return Order.from_db(router.db_for_write(Order), names, [values[n] for n in names])


_BID_FIELDS = (
    "tenant",
    "author",
    "round",
    "campaign",
    "order",
    "quantity",
    "min_quantity",
    "escrow",
    "note",
)


@transaction.atomic
def orders_bid(
    *, round_id: int, order_ids: list[int] | None = None, now: datetime | None = None
) -> OpenReport:
    """Every active order (or those of ``order_ids``) without a bid in the round gets its
    bid, in bulk: a few statements for all of them, not a request each. Escrow, budgets and
    the audit trail are those of a hand-placed bid; an order its ceiling, deadline or wanted
    GPU-hours ends is ended here with its reason; one its team's balance or budget cannot
    cover this round sits the round out with the reason (``hold_reason``). Idempotent: an
    order has one bid per round (a unique constraint), so a second run adds nothing.

    Set-based throughout: the orders are read as tuples (``_Live``) under their row locks;
    the reads that follow select by the same condition, not by a list of ids; bids and their
    limits go by COPY (``rows_copy``); only the orders whose row changes are written back."""
    now = now_or(now)
    report = OpenReport(bids=[], held={}, ended={})
    rnd = _round_shared(round_id, now=now)
    if rnd is None:
        return report
    scope = Order.objects.filter(status=Order.Status.ACTIVE)
    if order_ids is not None:
        scope = scope.filter(pk__in=order_ids)
    rows = _live_orders_locked(scope, rnd=rnd)
    if not rows:
        return report
    opening = _opening_read(rnd, scope=scope, rows=rows, now=now)
    outcome = _Outcome(report=report, now=now)
    for row in rows:
        _order_decide(row, rnd=rnd, opening=opening, outcome=outcome, now=now)
    keys = _bids_copy(rnd, placed=outcome.placed, tier_of=opening.tier_of)
    tenants = Tenant.objects.in_bulk({row.tenant_id for row in rows})
    _escrow_hold(rnd, keys=keys, placed=outcome.placed, tenants=tenants, opening=opening)
    _opening_audit(rnd, keys=keys, outcome=outcome, tenants=tenants)
    rows_update(
        outcome.changed, ["status", "status_reason", "hold_reason", "ended_at", "updated_at"]
    )
    ended_notify(outcome.ended)
    deadlines_check(
        [_order_of(row) for row in rows if row.deadline is not None and row.id not in report.ended],
        values=opening.values,
        window=opening.seconds,
        now=now,
    )
    report.bids = keys
    return report


def _live_orders_locked(scope: QuerySet[Order], *, rnd: Round) -> list[_Live]:
    """The orders in ``scope`` without an open bid in the round, locked, in pk order."""
    return [
        _Live._make(row)
        for row in scope.select_for_update()
        .exclude(
            pk__in=Bid.objects.filter(
                round=rnd, status=Bid.Status.OPEN, order__isnull=False
            ).values("order_id")
        )
        .order_by("pk")
        .values_list(*_Live._fields)
    ]


@dataclass
class _Opening:
    """What the opener reads once for all the orders it bids for."""

    values: dict[int, dict[str, int]]  # order id -> {active tier slug: value}
    tier_of: dict[str, Tier]  # the active tiers by slug
    holding: dict[int, int]  # order id -> escrow its open bids hold
    held_by: dict[int, dict[str, int]]  # order id -> {tier slug: GPUs} it holds now
    purses: dict[int, Purse]  # tenant id -> what it may still commit
    campaigns: dict[int, Campaign]
    seconds: int  # the round's window
    reserves: dict[str, int]  # tier slug -> reserve price


def _opening_read(
    rnd: Round, *, scope: QuerySet[Order], rows: list[_Live], now: datetime
) -> _Opening:
    # The reads below take every order in scope (a superset of the rows locked above): one
    # subquery instead of 10,000 parameters, and a lookup by id only ever finds those rows.
    in_scope = scope.values("pk")
    values: dict[int, dict[str, int]] = defaultdict(dict)
    tier_of: dict[str, Tier] = {t.slug: t for t in Tier.objects.filter(active=True)}
    for order_id, slug, price in OrderLimit.objects.filter(order_id__in=in_scope).values_list(
        "order_id", "tier__slug", "price"
    ):
        if slug in tier_of:
            values[order_id][slug] = price
    holding = dict(
        Bid.objects.filter(order_id__in=in_scope, status=Bid.Status.OPEN)
        .values("order_id")
        .annotate(held=Sum("escrow"))
        .values_list("order_id", "held")
    )
    return _Opening(
        values=values,
        tier_of=tier_of,
        holding=holding,
        held_by=incumbents(order_ids=in_scope, ends_at=rnd.starts_at),
        purses=purses_read({row.tenant_id for row in rows}, rnd=rnd, now=now),
        campaigns=Campaign.objects.in_bulk({row.campaign_id for row in rows} - {None}),
        seconds=window_seconds(rnd),
        reserves={slug: rnd.policy.reserve_for(slug) for slug in tier_of},
    )


@dataclass
class _Outcome:
    """Where the opener's decisions go: the bids to place and the order rows to write back
    (ended, or with a new hold reason)."""

    report: OpenReport
    now: datetime
    placed: list[tuple[_Live, OrderBid]] = field(default_factory=list)
    changed: list[Order] = field(default_factory=list)
    ended: list[Order] = field(default_factory=list)

    def hold_reason_set(self, row: _Live, why: str) -> None:
        if row.hold_reason != why:
            order = _order_of(row)
            order.hold_reason = why
            self.changed.append(order)

    def hold(self, row: _Live, why: str) -> None:
        self.report.held[row.id] = why
        self.hold_reason_set(row, why)

    def end(self, row: _Live, status: str, why: str | Callable[[Order], str]) -> None:
        order = _order_of(row)
        reason = why if isinstance(why, str) else why(order)
        _end(order, status, reason, now=self.now, report=self.report)
        self.changed.append(order)
        self.ended.append(order)

    def place(self, row: _Live, decision: OrderBid) -> None:
        self.hold_reason_set(row, "")
        self.placed.append((row, decision))


def _order_decide(
    row: _Live, *, rnd: Round, opening: _Opening, outcome: _Outcome, now: datetime
) -> None:
    """End the order, hold it out of this round with the reason, or place its bid."""
    if row.deadline is not None and row.deadline <= rnd.starts_at:
        outcome.end(row, Order.Status.EXPIRED, deadline_reason)
        return
    if not opening.values.get(row.id):
        outcome.hold(row, "none of its tiers is on offer now")
        return
    decision = order_bid(
        OrderState(
            gpus=row.gpus,
            min_gpus=row.min_gpus,
            values=opening.values[row.id],
            gpu_seconds_wanted=row.gpu_seconds_wanted,
            gpu_seconds=row.gpu_seconds,
            ceiling=row.ceiling,
            committed=row.spent + int(opening.holding.get(row.id) or 0),
            restart_seconds=row.restart_seconds,
            incumbent=opening.held_by.get(row.id, {}),
            reserves=opening.reserves,
        ),
        window_seconds=opening.seconds,
    )
    if isinstance(decision, NoBid):
        if decision.ends == "done":
            outcome.end(row, Order.Status.DONE, done_reason)
        elif decision.ends == "exhausted" and not opening.holding.get(row.id):
            outcome.end(row, Order.Status.EXHAUSTED, decision.reason)
        else:
            outcome.hold(row, decision.reason)
        return
    campaign = opening.campaigns.get(row.campaign_id)
    if campaign is not None and not (campaign.starts_at <= now < campaign.ends_at):
        why = f"its campaign {campaign.name!r} is not running now"
    else:
        why = opening.purses[row.tenant_id].admit(decision.escrow, row.campaign_id)
    if why:
        outcome.hold(row, why)
        return
    outcome.place(row, decision)


def _bids_copy(
    rnd: Round, *, placed: list[tuple[_Live, OrderBid]], tier_of: dict[str, Tier]
) -> list[int]:
    """Insert the placed bids and their limits by COPY; the new bids' ids, in order."""
    keys = rows_copy(
        Bid,
        _BID_FIELDS,
        [
            (
                row.tenant_id,
                row.author_id,
                rnd.pk,
                row.campaign_id,
                row.id,
                decision.quantity,
                decision.min_quantity,
                decision.escrow,
                f"order {row.id}: {row.name}"[:200],
            )
            for row, decision in placed
        ],
    )
    rows_copy(
        BidLimit,
        ("bid", "tier", "price", "charge_limit"),
        [
            (
                key,
                tier_of[slug].pk,
                price,
                decision.charge_limits[slug] if price != decision.charge_limits[slug] else None,
            )
            for key, (_, decision) in zip(keys, placed, strict=True)
            for slug, price in decision.limits.items()
        ],
    )
    return keys


def _escrow_hold(
    rnd: Round,
    *,
    keys: list[int],
    placed: list[tuple[_Live, OrderBid]],
    tenants: dict[int, Tenant],
    opening: _Opening,
) -> None:
    """Move each new bid's escrow from its team's available credits, in one batch.

    Without an idempotency record each, as a hand-placed bid's hold: the hold is made in the
    transaction that inserts its bid, and an order has one open bid a round (a unique
    constraint, and a second opening passes over an order with its bid), so the hold cannot
    be made twice. A record keyed by the new bid's id could never be met again; it was a
    ninth of the opening's rows and one read of 10,000 keys."""
    transfer_execute_many(
        orders=[
            TransferOrder(
                kind=Transfer.Kind.HOLD,
                tenant=tenants[row.tenant_id],
                amount=decision.escrow,
                reason=f"escrow for bid {key} (order {row.id}) in round {rnd.pk}",
                reference=f"bid:{key}",
                campaign=opening.campaigns.get(row.campaign_id),
            )
            for key, (row, decision) in zip(keys, placed, strict=True)
        ]
    )


def _opening_audit(
    rnd: Round, *, keys: list[int], outcome: _Outcome, tenants: dict[int, Tenant]
) -> None:
    """A ``bid.place`` event per new bid and an ``order.end`` per order ended, in one batch."""
    with audit.batch():
        for key, (row, decision) in zip(keys, outcome.placed, strict=True):
            audit.record(
                actor=SYSTEM,
                action="bid.place",
                object_type=Bid._meta.label_lower,
                object_id=key,
                tenant=tenants[row.tenant_id],
                after={
                    "round": rnd.pk,
                    "order": row.id,
                    "quantity": decision.quantity,
                    "min_quantity": decision.min_quantity,
                    "limits": decision.limits,
                    "charge_limits": decision.charge_limits,
                    "escrow": decision.escrow,
                    "status": Bid.Status.OPEN,
                    "campaign": row.campaign_id,
                },
            )
        for order in outcome.ended:
            audit.record(
                actor=SYSTEM,
                action="order.end",
                target=order,
                tenant=tenants[order.tenant_id],
                before={"status": Order.Status.ACTIVE},
                after={"status": order.status, "reason": order.status_reason},
            )


def _end(order: Order, status: str, reason: str, *, now: datetime, report: OpenReport) -> None:
    order.status, order.status_reason, order.hold_reason, order.ended_at = status, reason, "", now
    order.updated_at = now
    report.ended[order.pk] = status
