"""Settlement's part for the orders (``orders_settle``) and a voided round's (``orders_unsettle``)."""

from __future__ import annotations

from collections import defaultdict
from datetime import datetime

import audit.services as audit
from core.rows import rows_update
from market.models import Allocation, Bid, Order, Round
from market.orders import preempted
from market.services.bids import window_seconds
from market.services.orders.notices import done_reason, gpus_text, order_notice
from market.services.orders.opening import SYSTEM, incumbents
from tenants.models import Notification


def orders_settle(
    *, rnd: Round, bids: list[Bid], allocations: list[Allocation], now: datetime
) -> int:
    """Settlement's part for the round's order bids, in its transaction: each order's
    GPU-seconds, spend, rounds won or lost and preemptions; an order that now has what it
    wanted is done. Returns the preemptions (work that ran in the window before and does not
    keep its GPUs)."""
    by_order = {bid.order_id: bid for bid in bids if bid.order_id is not None}
    if not by_order:
        return 0
    orders = list(Order.objects.select_for_update().filter(pk__in=list(by_order)).order_by("pk"))
    seconds = window_seconds(rnd)
    won, charged = _won_by_order(
        allocations, order_of_bid={bid.pk: bid.order_id for bid in by_order.values()}
    )
    held = incumbents(order_ids=list(by_order), ends_at=rnd.starts_at)
    notices: list[Notification] = []
    preemptions = 0
    for order in orders:
        mine = won.get(order.pk, {})
        notices += _order_progress(
            order, rnd=rnd, won=mine, charge=charged.get(order.pk, 0), seconds=seconds
        )
        if preempted(held=held.get(order.pk, {}), won=mine):
            preemptions += 1
            notices.append(_order_preempt(order, rnd=rnd, bid=by_order[order.pk]))
        notices += _order_finish_if_done(order, now=now)
        order.updated_at = now
    rows_update(
        orders,
        [
            "gpu_seconds",
            "spent",
            "rounds_won",
            "rounds_lost",
            "preemptions",
            "status",
            "status_reason",
            "ended_at",
            "updated_at",
        ],
    )
    Notification.objects.bulk_create(notices, ignore_conflicts=True)
    return preemptions


def _won_by_order(
    allocations: list[Allocation], *, order_of_bid: dict[int, int]
) -> tuple[dict[int, dict[str, int]], dict[int, int]]:
    """{order id: {tier slug: GPUs won}} and {order id: milli-credits charged}."""
    won: dict[int, dict[str, int]] = defaultdict(dict)
    charged: dict[int, int] = defaultdict(int)
    for allocation in allocations:
        order_id = order_of_bid.get(allocation.bid_id)
        if order_id is not None:
            slug = allocation.tier.slug
            won[order_id][slug] = won[order_id].get(slug, 0) + allocation.gpus
            charged[order_id] += allocation.charge
    return won, charged


def _order_progress(
    order: Order, *, rnd: Round, won: dict[str, int], charge: int, seconds: int
) -> list[Notification]:
    """Add the round's GPU-seconds, charge and win or loss to the order; the notice of its
    first win."""
    order.gpu_seconds += sum(won.values()) * seconds
    order.spent += charge
    if not won:
        order.rounds_lost += 1
        return []
    order.rounds_won += 1
    if order.rounds_won != 1:
        return []
    return [
        order_notice(order, "order_started", f"started: won {gpus_text(won)} in round {rnd.pk}")
    ]


def _order_preempt(order: Order, *, rnd: Round, bid: Bid) -> Notification:
    """Count the preemption on the order; the notice telling its team why."""
    order.preemptions += 1
    reason = bid.outcome_reason or "it won less than it held"
    return order_notice(
        order,
        "order_preempted",
        f"preempted in round {rnd.pk}: {reason}; its work gets the checkpoint "
        "signal and is suspended at the window's end, and resumes when it wins again",
        level=Notification.Level.WARNING,
        key=f"order-preempted:{order.pk}:{rnd.pk}",
    )


def _order_finish_if_done(order: Order, *, now: datetime) -> list[Notification]:
    """End an active order that now has the GPU-seconds it wanted, with its audit event;
    the notice that it finished."""
    if not (
        order.status == Order.Status.ACTIVE
        and order.gpu_seconds_wanted is not None
        and order.gpu_seconds >= order.gpu_seconds_wanted
    ):
        return []
    order.status, order.status_reason, order.ended_at = (
        Order.Status.DONE,
        done_reason(order),
        now,
    )
    audit.record(
        actor=SYSTEM,
        action="order.end",
        target=order,
        tenant=order.tenant,
        before={"status": Order.Status.ACTIVE},
        after={"status": order.status, "reason": order.status_reason},
    )
    return [order_notice(order, "order_finished", f"finished: {order.status_reason}")]


def orders_unsettle(*, rnd: Round, allocations: list[Allocation], now: datetime) -> None:
    """A voided round's part, in its transaction: what its allocations gave the orders (GPU-
    seconds, spend, a round won) is taken back; an order that was done only by this round
    is active again and bids from the next round on."""
    seconds = window_seconds(rnd)
    gave: dict[int, list[int]] = defaultdict(lambda: [0, 0])
    order_of = dict(
        Bid.objects.filter(round=rnd, order__isnull=False).values_list("pk", "order_id")
    )
    for allocation in allocations:
        order_id = order_of.get(allocation.bid_id)
        if order_id is not None:
            # A backfill allocation ran from its sub-round to the window's end only.
            ran = (
                int((allocation.ends_at - allocation.starts_at).total_seconds())
                if allocation.preemptible
                else seconds
            )
            gave[order_id][0] += allocation.gpus * ran
            gave[order_id][1] += allocation.charge
    orders = list(Order.objects.select_for_update().filter(pk__in=list(gave)).order_by("pk"))
    for order in orders:
        gpu_seconds, charge = gave[order.pk]
        order.gpu_seconds = max(order.gpu_seconds - gpu_seconds, 0)
        order.spent = max(order.spent - charge, 0)
        order.rounds_won = max(order.rounds_won - 1, 0)
        if order.status == Order.Status.DONE and order.gpu_seconds < (
            order.gpu_seconds_wanted or 0
        ):
            order.status, order.ended_at = Order.Status.ACTIVE, None
            order.status_reason = f"active again: round {rnd.pk}, which had finished it, was voided"
        order.updated_at = now
    rows_update(
        orders,
        ["gpu_seconds", "spent", "rounds_won", "status", "status_reason", "ended_at", "updated_at"],
    )
