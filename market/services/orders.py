"""Standing orders: create, edit, pause, resume, cancel; the round opener's bulk bids
(``orders_bid``) and settlement's progress (``orders_settle``). The arithmetic of an order's
bid and of incumbency is market/orders.py, shared with the simulator.

Money on an order's bid moves exactly as on a hand-placed bid (available -> escrow when the
round opens, charged or released at settlement) and the same budgets admit it; the ceiling
adds one more bound: what it has spent plus what its bids hold never passes it.
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import datetime
from typing import Any, NamedTuple

from django.contrib.auth.models import AbstractBaseUser
from django.db import router, transaction
from django.db.models import QuerySet, Sum

import audit.services as audit
from core.rows import rows_copy, rows_update
from market.errors import MarketError
from market.foresight import foresee
from market.models import Allocation, Bid, BidLimit, Order, OrderLimit, Round, Tier
from market.orders import NoBid, OrderBid, OrderState, order_bid, preempted
from market.placement.inventory import tier_gpus
from market.selectors import FORESIGHT_ROUNDS, price_history
from market.services._common import MAX_GPUS, MAX_PRICE, cost_ceil, now_or, whole
from market.services.bids import (
    _cancel_locked,
    _check_member,
    _round_shared,
    tiers_on_offer,
    window_seconds,
)
from market.services.policy import policy_active
from tenants.access import access_object
from tenants.budgets import budget_usage, tenant_hard_capped
from tenants.ledger import TransferOrder, credits, transfer_execute_many
from tenants.models import Account, Budget, Campaign, Notification, Tenant, Transfer

SYSTEM = "orders"
MAX_RESTART_SECONDS = 24 * 3600
MAX_CEILING = 10**15  # the ledger's largest amount
_SLURM_JOB = re.compile(r"^\d+(?:[_+]\d+)?$")
_UNSET: Any = object()


@dataclass(frozen=True)
class _Terms:
    name: str
    values: dict[str, int]
    tiers: dict[str, Tier]
    gpus: int
    min_gpus: int
    gpu_seconds_wanted: int | None
    ceiling: int
    deadline: datetime | None
    restart_seconds: int


def _largest_gang(slug: str, tier: Tier) -> tuple[int, str] | None:
    """The most GPUs one node of the tier has (a gang runs on one node), and where; None
    when nothing is known of the tier's nodes yet (none reports GPUs and none are offered:
    a node may still be coming up)."""
    per_node: dict[str, int] = defaultdict(int)
    for gpu in tier_gpus(slug):
        per_node[gpu.node] += 1
    if not per_node:
        if not tier.offered:
            return None
        return tier.offered, f"tier {slug} offers {tier.offered}"
    node, most = max(sorted(per_node.items()), key=lambda kv: kv[1])
    return most, f"{node} ({slug}) has {most}"


def _terms(
    *,
    name: Any,
    values: Any,
    gpus: Any,
    min_gpus: Any,
    gpu_seconds_wanted: Any,
    ceiling: Any,
    deadline: Any,
    restart_seconds: Any,
    now: datetime,
) -> _Terms:
    """Every field checked, each refusal naming the field and what to change."""
    name = str(name or "").strip()
    if not name:
        raise MarketError("name: give the order a name, e.g. the run it drives")
    if len(name) > 120:
        raise MarketError("name: at most 120 characters")
    gpus = whole(gpus, field="gpus", minimum=1, maximum=MAX_GPUS)
    min_gpus = whole(
        gpus if min_gpus is None else min_gpus, field="min_gpus", minimum=1, maximum=gpus
    )
    if not isinstance(values, dict) or not values:
        raise MarketError("values: give the most you pay per GPU-hour on at least one tier")
    tiers = tiers_on_offer(list(values), field="values", then="value another tier")
    clean = {
        slug: whole(
            price,
            field=f"values: the value for {slug} (milli-credits per GPU-hour)",
            minimum=1,
            maximum=MAX_PRICE,
        )
        for slug, price in sorted(values.items())
    }
    if min_gpus > 1:
        sizes = {slug: _largest_gang(slug, tiers[slug]) for slug in clean}
        known = [size for size in sizes.values() if size is not None]
        if len(known) == len(sizes) and all(min_gpus > most for most, _ in known):
            where = "; ".join(text for _, text in known)
            raise MarketError(
                f"min_gpus: a gang of {min_gpus} GPUs runs on one node and no node is that "
                f"large ({where}); lower min_gpus or split the work"
            )
    if gpu_seconds_wanted is not None:
        gpu_seconds_wanted = whole(
            gpu_seconds_wanted, field="gpu_hours (in GPU-seconds)", minimum=1, maximum=10**12
        )
    ceiling = whole(ceiling, field="ceiling (milli-credits)", minimum=1, maximum=MAX_CEILING)
    policy = policy_active()
    seconds = policy.round_minutes * 60
    cheapest = min(
        cost_ceil(gpus=min_gpus, price=policy.reserve_for(s), seconds=seconds) for s in clean
    )
    if ceiling < cheapest:
        raise MarketError(
            f"ceiling: {credits(ceiling)} credits is below one window's reserve for "
            f"{min_gpus} GPU(s) ({credits(cheapest)} credits); raise the ceiling"
        )
    one_window = cost_ceil(gpus=min_gpus, price=max(clean.values()), seconds=seconds)
    if ceiling < one_window:
        raise MarketError(
            f"ceiling: {credits(ceiling)} credits does not cover one window of {min_gpus} "
            f"GPU(s) at your highest value ({credits(one_window)} credits); raise the ceiling "
            "or lower the values"
        )
    below = [s for s, v in clean.items() if v < policy.reserve_for(s)]
    if len(below) == len(clean):
        reserves = ", ".join(f"{s} {credits(policy.reserve_for(s))}" for s in below)
        raise MarketError(
            f"values: every value is below its tier's reserve price ({reserves} credits per "
            "GPU-hour); the order could never win"
        )
    if deadline is not None:
        if not isinstance(deadline, datetime) or deadline.tzinfo is None:
            raise MarketError("deadline: a date and time with its time zone")
        if deadline <= now:
            raise MarketError(f"deadline: {deadline:%Y-%m-%d %H:%M} UTC is in the past")
    restart_seconds = whole(
        restart_seconds, field="restart_seconds", minimum=0, maximum=MAX_RESTART_SECONDS
    )
    return _Terms(
        name=name,
        values=clean,
        tiers=tiers,
        gpus=gpus,
        min_gpus=min_gpus,
        gpu_seconds_wanted=gpu_seconds_wanted,
        ceiling=ceiling,
        deadline=deadline,
        restart_seconds=restart_seconds,
    )


def _snapshot(order: Order, values: dict[str, int]) -> dict[str, Any]:
    return {
        "name": order.name,
        "values": values,
        "gpus": order.gpus,
        "min_gpus": order.min_gpus,
        "gpu_seconds_wanted": order.gpu_seconds_wanted,
        "ceiling": order.ceiling,
        "deadline": order.deadline.isoformat() if order.deadline else None,
        "restart_seconds": order.restart_seconds,
        "campaign": order.campaign_id,
        "status": order.status,
    }


def order_values(order: Order) -> dict[str, int]:
    return dict(order.limits.order_by("tier__slug").values_list("tier__slug", "price"))


def _open_round() -> Round | None:
    return Round.objects.filter(status=Round.Status.OPEN).first()


@transaction.atomic
def order_create(
    *,
    user: AbstractBaseUser,
    tenant: Tenant,
    name: str,
    values: dict[str, int],
    gpus: int,
    min_gpus: int | None = None,
    gpu_seconds_wanted: int | None = None,
    ceiling: int,
    deadline: datetime | None = None,
    restart_seconds: int = 300,
    campaign: Campaign | None = None,
    command: str = "",
    slurm_job: str = "",
    idempotency_key: str | None = None,
    preemptible: bool = False,
    now: datetime | None = None,
) -> Order:
    """A standing order for ``tenant``: from the round open now on, every round gets its bid
    (``values``: {tier slug: the most it pays, milli-credits per GPU-hour}) until it has
    ``gpu_seconds_wanted`` (None: until cancelled), its ``ceiling`` (milli-credits) is spent,
    or its ``deadline`` passes. ``min_gpus`` (default ``gpus``): all or nothing below it.
    With an ``idempotency_key`` a retry returns the first order (the same key with another
    name is refused). ``preemptible``: it also bids for unsold and reclaimed GPUs in the
    window's backfill sub-rounds (market/services/backfill.py). Refusals name the field;
    nothing is written."""
    now = now_or(now)
    _check_member(user=user, tenant=tenant)
    key = (idempotency_key or "").strip()
    if len(key) > 80:
        raise MarketError("idempotency_key: at most 80 characters")
    if key:
        # The tenant's row serialises two creates racing on one key.
        Tenant.objects.select_for_update().filter(pk=tenant.pk).first()
        previous = Order.objects.filter(tenant=tenant, idempotency_key=key).first()
        if previous is not None:
            if previous.name != str(name or "").strip():
                raise MarketError(
                    f"idempotency_key: {key!r} was used for order {previous.pk} "
                    f"({previous.name!r}); use a new key"
                )
            return previous
    terms = _terms(
        name=name,
        values=values,
        gpus=gpus,
        min_gpus=min_gpus,
        gpu_seconds_wanted=gpu_seconds_wanted,
        ceiling=ceiling,
        deadline=deadline,
        restart_seconds=restart_seconds,
        now=now,
    )
    if campaign is not None and campaign.tenant_id != tenant.pk:
        raise MarketError(f"campaign: {campaign.name!r} does not belong to {tenant.slug}")
    command, slurm_job = str(command or "").strip(), str(slurm_job or "").strip()
    if len(command) > 1000:
        raise MarketError("command: at most 1000 characters")
    if slurm_job and not _SLURM_JOB.match(slurm_job):
        raise MarketError(f"slurm_job: {slurm_job!r} is not a Slurm job id (e.g. 4242)")
    order = Order.objects.create(
        tenant=tenant,
        author=user,
        campaign=campaign,
        name=terms.name,
        gpus=terms.gpus,
        min_gpus=terms.min_gpus,
        gpu_seconds_wanted=terms.gpu_seconds_wanted,
        ceiling=terms.ceiling,
        deadline=terms.deadline,
        restart_seconds=terms.restart_seconds,
        command=command,
        slurm_job=slurm_job,
        idempotency_key=key,
        preemptible=bool(preemptible),
    )
    OrderLimit.objects.bulk_create(
        [OrderLimit(order=order, tier=terms.tiers[s], price=p) for s, p in terms.values.items()]
    )
    audit.record(
        actor=user,
        action="order.create",
        target=order,
        tenant=tenant,
        after=_snapshot(order, terms.values),
    )
    rnd = _open_round()
    if rnd is not None:
        orders_bid(round_id=rnd.pk, order_ids=[order.pk], now=now)
    return order


def _order_locked(*, tenant: Tenant, order_id: object) -> Order:
    order = access_object(Order.objects.all(), tenant=tenant, pk=order_id)
    return (
        Order.objects.select_for_update(of=("self",))
        .select_related("tenant", "campaign")
        .get(pk=order.pk)
    )


def _open_bid_withdraw(
    order: Order, *, actor: AbstractBaseUser | str, reason: str, now: datetime
) -> None:
    """Cancel the order's bid in the round open for bidding, if it has one (escrow back)."""
    rnd = _round_shared_open(now)
    if rnd is None:
        return
    bid = (
        Bid.objects.select_for_update(of=("self",))
        .select_related("tenant", "campaign")
        .filter(order=order, round=rnd, status=Bid.Status.OPEN)
        .first()
    )
    if bid is not None:
        _cancel_locked(bid=bid, actor=actor, reason=reason)


def _round_shared_open(now: datetime) -> Round | None:
    rnd = _open_round()
    return None if rnd is None else _round_shared(rnd.pk, now=now)


@transaction.atomic
def order_edit(
    *,
    user: AbstractBaseUser,
    tenant: Tenant,
    order_id: object,
    name: str | None = None,
    values: dict[str, int] | None = None,
    gpus: int | None = None,
    min_gpus: int | None = None,
    gpu_seconds_wanted: int | None = _UNSET,
    ceiling: int | None = None,
    deadline: datetime | None = _UNSET,
    restart_seconds: int | None = None,
    now: datetime | None = None,
) -> Order:
    """Change a live order; omitted fields stay. Its bid in the round open now is replaced
    by one on the new terms (escrow follows) in the same transaction."""
    now = now_or(now)
    _check_member(user=user, tenant=tenant)
    order = _order_locked(tenant=tenant, order_id=order_id)
    if not order.live:
        raise MarketError(f"order {order.pk} is {order.status}; only a live order can be edited")
    old = order_values(order)
    terms = _terms(
        name=order.name if name is None else name,
        values=old if values is None else values,
        gpus=order.gpus if gpus is None else gpus,
        min_gpus=(order.min_gpus if gpus is None else None) if min_gpus is None else min_gpus,
        gpu_seconds_wanted=order.gpu_seconds_wanted
        if gpu_seconds_wanted is _UNSET
        else gpu_seconds_wanted,
        ceiling=order.ceiling if ceiling is None else ceiling,
        deadline=order.deadline if deadline is _UNSET else deadline,
        restart_seconds=order.restart_seconds if restart_seconds is None else restart_seconds,
        now=now,
    )
    if terms.ceiling < order.spent:
        raise MarketError(
            f"ceiling: the order has spent {credits(order.spent)} credits already; the ceiling "
            "cannot be lower"
        )
    before = _snapshot(order, old)
    _open_bid_withdraw(order, actor=user, reason=f"order {order.pk} edited", now=now)
    order.name, order.gpus, order.min_gpus = terms.name, terms.gpus, terms.min_gpus
    order.gpu_seconds_wanted, order.ceiling = terms.gpu_seconds_wanted, terms.ceiling
    order.deadline, order.restart_seconds = terms.deadline, terms.restart_seconds
    order.save()
    if terms.values != old:
        order.limits.all().delete()
        OrderLimit.objects.bulk_create(
            [OrderLimit(order=order, tier=terms.tiers[s], price=p) for s, p in terms.values.items()]
        )
    audit.record(
        actor=user,
        action="order.edit",
        target=order,
        tenant=tenant,
        before=before,
        after=_snapshot(order, terms.values),
    )
    _rebid(order, now=now)
    return order


def _rebid(order: Order, *, now: datetime) -> None:
    rnd = _open_round()
    if rnd is not None and order.status == Order.Status.ACTIVE:
        orders_bid(round_id=rnd.pk, order_ids=[order.pk], now=now)


def _status_set(
    *,
    user: AbstractBaseUser,
    tenant: Tenant,
    order_id: object,
    allowed: tuple[str, ...],
    status: str,
    verb: str,
    reason: str,
    now: datetime,
) -> Order:
    _check_member(user=user, tenant=tenant)
    order = _order_locked(tenant=tenant, order_id=order_id)
    if order.status == status:
        return order  # a retried request
    if order.status not in allowed:
        raise MarketError(f"order {order.pk} is {order.status}; it cannot be {verb}")
    before = order.status
    if status != Order.Status.ACTIVE:
        _open_bid_withdraw(order, actor=user, reason=f"order {order.pk} {verb}", now=now)
    order.status, order.status_reason, order.hold_reason = status, reason, ""
    if status == Order.Status.CANCELLED:
        order.ended_at = now
    order.save(update_fields=["status", "status_reason", "hold_reason", "ended_at", "updated_at"])
    audit.record(
        actor=user,
        action=f"order.{verb}",
        target=order,
        tenant=tenant,
        before={"status": before},
        after={"status": order.status, "reason": reason},
    )
    _rebid(order, now=now)
    return order


@transaction.atomic
def order_pause(
    *, user: AbstractBaseUser, tenant: Tenant, order_id: object, now: datetime | None = None
) -> Order:
    """Stop bidding (its bid in the open round is withdrawn); work it won runs to the end of
    its window and is then suspended. ``order_resume`` bids again."""
    return _status_set(
        user=user,
        tenant=tenant,
        order_id=order_id,
        allowed=(Order.Status.ACTIVE,),
        status=Order.Status.PAUSED,
        verb="paused",
        reason=f"paused by {user}",
        now=now_or(now),
    )


@transaction.atomic
def order_resume(
    *, user: AbstractBaseUser, tenant: Tenant, order_id: object, now: datetime | None = None
) -> Order:
    """Bid again, from the round open now."""
    return _status_set(
        user=user,
        tenant=tenant,
        order_id=order_id,
        allowed=(Order.Status.PAUSED,),
        status=Order.Status.ACTIVE,
        verb="resumed",
        reason="",
        now=now_or(now),
    )


@transaction.atomic
def order_cancel(
    *, user: AbstractBaseUser, tenant: Tenant, order_id: object, now: datetime | None = None
) -> Order:
    """End the order: no more bids; its work stops when the window it won ends."""
    return _status_set(
        user=user,
        tenant=tenant,
        order_id=order_id,
        allowed=Order.LIVE,
        status=Order.Status.CANCELLED,
        verb="cancelled",
        reason=f"cancelled by {user}",
        now=now_or(now),
    )


# -- the round opener -------------------------------------------------------------------


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


class _Purse:
    """What one tenant may still commit in this opening: its available balance and the room
    under each of its safe budgets and hard caps, drawn down as its orders' bids are
    admitted."""

    def __init__(self, *, available: int, budgets: list[tuple[Budget, int]], capped: str) -> None:
        self.available = available
        self.budgets = budgets  # (safe budget or hard cap, room left)
        self.capped = capped  # why a hard cap stops every bid, or ""

    def admit(self, amount: int, campaign_id: int | None) -> str:
        if self.capped:
            return self.capped
        if amount > self.available:
            return (
                f"the team's available balance is {credits(self.available)} credits and this "
                f"round's bid needs {credits(amount)}"
            )
        applicable = [
            (i, b) for i, (b, _) in enumerate(self.budgets) if b.campaign_id in (None, campaign_id)
        ]
        for i, budget in applicable:
            if amount > self.budgets[i][1]:
                scope = (
                    f"campaign {budget.campaign.name!r}" if budget.campaign_id else budget.window
                )
                kind = "hard cap" if budget.mode == Budget.Mode.HARD else "budget"
                return (
                    f"the {scope} {kind} of {credits(budget.cap)} credits has "
                    f"{credits(max(self.budgets[i][1], 0))} left and this round's bid needs "
                    f"{credits(amount)}"
                )
        self.available -= amount
        for i, _ in applicable:
            self.budgets[i] = (self.budgets[i][0], self.budgets[i][1] - amount)
        return ""


def _purses(tenant_ids: set[int], *, now: datetime) -> dict[int, _Purse]:
    """Each tenant's purse, its ledger accounts locked first (pk order, as every transfer
    locks them) so what is read stays as read until the holds commit."""
    accounts = list(
        Account.objects.select_for_update()
        .filter(tenant_id__in=tenant_ids, kind__in=Account.TENANT_KINDS)
        .order_by("pk")
    )
    available = {a.tenant_id: a.balance for a in accounts if a.kind == Account.Kind.AVAILABLE}
    budgets: dict[int, list[Budget]] = defaultdict(list)
    for budget in (
        Budget.objects.filter(tenant_id__in=tenant_ids, active=True)
        .select_related("campaign", "tenant")
        .order_by("pk")
    ):
        if budget.campaign_id is None or budget.campaign.starts_at <= now < budget.campaign.ends_at:
            budgets[budget.tenant_id].append(budget)
    purses = {}
    for tenant_id in tenant_ids:
        safe, capped = [], ""
        for budget in budgets.get(tenant_id, []):
            if budget.mode == Budget.Mode.SAFE:
                usage = budget_usage(budget=budget, at=now)
                safe.append((budget, budget.cap - usage.committed))
            elif budget.mode == Budget.Mode.HARD:
                # What the clearing would admit (tenants.budgets.hard_cap_admit): a bid whose
                # most possible cost fits the room the cap leaves, so no escrow is held for
                # a bid the cap would leave out.
                safe.append((budget, budget.cap - budget_usage(budget=budget, at=now).spent))
        if any(b.mode == Budget.Mode.HARD for b in budgets.get(tenant_id, [])):
            hard = tenant_hard_capped(tenant=budgets[tenant_id][0].tenant, at=now)
            if hard is not None:
                scope = (
                    hard.campaign.name if hard.campaign_id else hard.get_window_display().lower()
                )
                capped = (
                    f"paused: the team reached its {scope} hard cap of {credits(hard.cap)} "
                    "credits; it bids again when the window rolls over or the cap is raised"
                )
        purses[tenant_id] = _Purse(
            available=available.get(tenant_id, 0), budgets=safe, capped=capped
        )
    return purses


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
    rows = [
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
    if not rows:
        return report
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
    held_by = incumbents(order_ids=in_scope, ends_at=rnd.starts_at)
    purses = _purses({row.tenant_id for row in rows}, now=now)
    campaigns = Campaign.objects.in_bulk({row.campaign_id for row in rows} - {None})
    seconds = window_seconds(rnd)
    reserves = {slug: rnd.policy.reserve_for(slug) for slug in tier_of}
    placed: list[tuple[_Live, OrderBid]] = []
    changed: list[Order] = []  # rows to write back: ended, or a new hold reason
    ended: list[Order] = []

    def hold_reason_set(row: _Live, why: str) -> None:
        if row.hold_reason != why:
            order = _order_of(row)
            order.hold_reason = why
            changed.append(order)

    def hold(row: _Live, why: str) -> None:
        report.held[row.id] = why
        hold_reason_set(row, why)

    def end(row: _Live, status: str, why: str | Callable[[Order], str]) -> None:
        order = _order_of(row)
        _end(order, status, why if isinstance(why, str) else why(order), now=now, report=report)
        changed.append(order)
        ended.append(order)

    for row in rows:
        if row.deadline is not None and row.deadline <= rnd.starts_at:
            end(row, Order.Status.EXPIRED, _deadline_reason)
            continue
        if not values.get(row.id):
            hold(row, "none of its tiers is on offer now")
            continue
        decision = order_bid(
            OrderState(
                gpus=row.gpus,
                min_gpus=row.min_gpus,
                values=values[row.id],
                gpu_seconds_wanted=row.gpu_seconds_wanted,
                gpu_seconds=row.gpu_seconds,
                ceiling=row.ceiling,
                committed=row.spent + int(holding.get(row.id) or 0),
                restart_seconds=row.restart_seconds,
                incumbent=held_by.get(row.id, {}),
                reserves=reserves,
            ),
            window_seconds=seconds,
        )
        if isinstance(decision, NoBid):
            if decision.ends == "done":
                end(row, Order.Status.DONE, _done_reason)
            elif decision.ends == "exhausted" and not holding.get(row.id):
                end(row, Order.Status.EXHAUSTED, decision.reason)
            else:
                hold(row, decision.reason)
            continue
        campaign = campaigns.get(row.campaign_id)
        if campaign is not None and not (campaign.starts_at <= now < campaign.ends_at):
            why = f"its campaign {campaign.name!r} is not running now"
        else:
            why = purses[row.tenant_id].admit(decision.escrow, row.campaign_id)
        if why:
            hold(row, why)
            continue
        hold_reason_set(row, "")
        placed.append((row, decision))

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
    tenants = Tenant.objects.in_bulk({row.tenant_id for row in rows})
    transfer_execute_many(
        orders=[
            TransferOrder(
                kind=Transfer.Kind.HOLD,
                tenant=tenants[row.tenant_id],
                amount=decision.escrow,
                reason=f"escrow for bid {key} (order {row.id}) in round {rnd.pk}",
                reference=f"bid:{key}",
                campaign=campaigns.get(row.campaign_id),
                idempotency_key=f"order-hold:{key}",
            )
            for key, (row, decision) in zip(keys, placed, strict=True)
        ]
    )
    with audit.batch():
        for key, (row, decision) in zip(keys, placed, strict=True):
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
        for order in ended:
            audit.record(
                actor=SYSTEM,
                action="order.end",
                target=order,
                tenant=tenants[order.tenant_id],
                before={"status": Order.Status.ACTIVE},
                after={"status": order.status, "reason": order.status_reason},
            )
    rows_update(changed, ["status", "status_reason", "hold_reason", "ended_at", "updated_at"])
    _notify_ended(ended)
    _deadlines_check(
        [_order_of(row) for row in rows if row.deadline is not None and row.id not in report.ended],
        values=values,
        window=seconds,
        now=now,
    )
    report.bids = keys
    return report


def _deadlines_check(
    orders: list[Order], *, values: dict[int, dict[str, int]], window: int, now: datetime
) -> None:
    """A notice (once a day per order) for each order with a deadline that the recent rounds'
    prices say it will miss at its values: the value it would need, or that no price will
    do (market/foresight.py)."""
    if not orders:
        return
    prices = [row["prices"] for row in price_history(limit=FORESIGHT_ROUNDS)]
    notices = []
    for order in orders:
        mine = values.get(order.pk) or {}
        if not mine or order.gpu_seconds_wanted is None:
            continue
        seen = foresee(
            prices=prices,
            values=mine,
            gpus=order.gpus,
            remaining_gpu_seconds=max(order.gpu_seconds_wanted - order.gpu_seconds, 0),
            window_seconds=window,
            now=now,
            deadline=order.deadline,
        )
        if not seen.windows_needed or (seen.needed_value is None and not seen.needed_reason):
            continue
        windows_left = int((order.deadline - now).total_seconds() // window)
        if not prices and windows_left >= seen.windows_needed:
            continue  # no price history to judge by, and time enough
        if seen.needed_value is not None:
            if seen.needed_value <= max(mine.values()):
                continue
            advice = (
                f"bid {credits(seen.needed_value)} credits/GPU-h to finish by "
                f"{order.deadline:%a %d %b %H:%M} UTC (it offers at most "
                f"{credits(max(mine.values()))})"
            )
        else:
            advice = seen.needed_reason
        notices.append(
            _notice(
                order,
                "order_deadline_at_risk",
                f"may miss its deadline: {advice}",
                level=Notification.Level.WARNING,
                key=f"order-deadline-risk:{order.pk}:{now:%Y-%m-%d}",
            )
        )
    Notification.objects.bulk_create(notices, ignore_conflicts=True)


def _hours(gpu_seconds: int | None) -> str:
    return "until cancelled" if gpu_seconds is None else f"{gpu_seconds / 3600:,.2f}"


def _done_reason(order: Order) -> str:
    return f"received {_hours(order.gpu_seconds)} of {_hours(order.gpu_seconds_wanted)} GPU-hours"


def _deadline_reason(order: Order) -> str:
    wanted = _hours(order.gpu_seconds_wanted)
    return (
        f"its deadline {order.deadline:%Y-%m-%d %H:%M} UTC passed with "
        f"{_hours(order.gpu_seconds)} of {wanted} GPU-hours received"
    )


def _end(order: Order, status: str, reason: str, *, now: datetime, report: OpenReport) -> None:
    order.status, order.status_reason, order.hold_reason, order.ended_at = status, reason, "", now
    order.updated_at = now
    report.ended[order.pk] = status


_ENDED_TEXT = {
    Order.Status.DONE: ("order_finished", Notification.Level.INFO, "finished"),
    Order.Status.EXHAUSTED: ("order_budget_exhausted", Notification.Level.WARNING, "stopped"),
    Order.Status.EXPIRED: ("order_deadline_passed", Notification.Level.WARNING, "stopped"),
}


def _notify_ended(orders: list[Order]) -> None:
    notices = []
    for order in orders:
        kind, level, verb = _ENDED_TEXT[order.status]
        notices.append(
            Notification(
                tenant_id=order.tenant_id,
                level=level,
                kind=kind,
                message=f"Order {order.pk} ({order.name}) {verb}: {order.status_reason}."[:500],
                dedupe_key=f"order-end:{order.pk}",
            )
        )
    Notification.objects.bulk_create(notices, ignore_conflicts=True)


# -- settlement -------------------------------------------------------------------------


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
    won: dict[int, dict[str, int]] = defaultdict(dict)
    charged: dict[int, int] = defaultdict(int)
    order_of_bid = {bid.pk: bid.order_id for bid in by_order.values()}
    for allocation in allocations:
        order_id = order_of_bid.get(allocation.bid_id)
        if order_id is not None:
            slug = allocation.tier.slug
            won[order_id][slug] = won[order_id].get(slug, 0) + allocation.gpus
            charged[order_id] += allocation.charge
    held = incumbents(order_ids=list(by_order), ends_at=rnd.starts_at)
    notices: list[Notification] = []
    preemptions = 0
    for order in orders:
        mine = won.get(order.pk, {})
        order.gpu_seconds += sum(mine.values()) * seconds
        order.spent += charged.get(order.pk, 0)
        if mine:
            order.rounds_won += 1
            if order.rounds_won == 1:
                notices.append(
                    _notice(order, "order_started", f"started: won {_gpus(mine)} in round {rnd.pk}")
                )
        else:
            order.rounds_lost += 1
        if preempted(held=held.get(order.pk, {}), won=mine):
            order.preemptions += 1
            preemptions += 1
            reason = by_order[order.pk].outcome_reason or "it won less than it held"
            notices.append(
                _notice(
                    order,
                    "order_preempted",
                    f"preempted in round {rnd.pk}: {reason}; its work gets the checkpoint "
                    "signal and is suspended at the window's end, and resumes when it wins again",
                    level=Notification.Level.WARNING,
                    key=f"order-preempted:{order.pk}:{rnd.pk}",
                )
            )
        if (
            order.status == Order.Status.ACTIVE
            and order.gpu_seconds_wanted is not None
            and order.gpu_seconds >= order.gpu_seconds_wanted
        ):
            order.status, order.status_reason, order.ended_at = (
                Order.Status.DONE,
                _done_reason(order),
                now,
            )
            notices.append(_notice(order, "order_finished", f"finished: {order.status_reason}"))
            audit.record(
                actor=SYSTEM,
                action="order.end",
                target=order,
                tenant=order.tenant,
                before={"status": Order.Status.ACTIVE},
                after={"status": order.status, "reason": order.status_reason},
            )
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


def _gpus(won: dict[str, int]) -> str:
    return ", ".join(f"{gpus} x {slug}" for slug, gpus in sorted(won.items()))


def _notice(
    order: Order,
    kind: str,
    text: str,
    *,
    level: str = Notification.Level.INFO,
    key: str | None = None,
) -> Notification:
    return Notification(
        tenant_id=order.tenant_id,
        level=level,
        kind=kind,
        message=f"Order {order.pk} ({order.name}) {text}"[:500],
        dedupe_key=key or f"{kind.replace('_', '-')}:{order.pk}",
    )
