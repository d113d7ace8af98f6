"""A standing order's life at its team's hands: create, edit, pause, resume, cancel."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django.contrib.auth.models import AbstractBaseUser
from django.db import transaction

import audit.services as audit
from market.errors import MarketError
from market.models import Bid, Order, OrderLimit, Round
from market.services._common import now_or
from market.services.bids import _cancel_locked, _check_member, _round_shared
from market.services.orders.opening import orders_bid
from market.services.orders.terms import _SLURM_JOB, order_snapshot, order_values, terms_check
from tenants.access import access_object
from tenants.ledger import credits
from tenants.models import Campaign, Tenant

_UNSET: Any = object()


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
    previous = _order_retried(tenant=tenant, key=key, name=name)
    if previous is not None:
        return previous
    terms = terms_check(
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
    command, slurm_job = _launch_check(command=command, slurm_job=slurm_job)
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
        after=order_snapshot(order, terms.values),
    )
    rnd = _open_round()
    if rnd is not None:
        orders_bid(round_id=rnd.pk, order_ids=[order.pk], now=now)
    return order


def _order_retried(*, tenant: Tenant, key: str, name: Any) -> Order | None:
    """The order a create with this idempotency ``key`` already made, if any (None without
    a key); the same key with another name is refused."""
    if len(key) > 80:
        raise MarketError("idempotency_key: at most 80 characters")
    if not key:
        return None
    # The tenant's row serialises two creates racing on one key.
    Tenant.objects.select_for_update().filter(pk=tenant.pk).first()
    previous = Order.objects.filter(tenant=tenant, idempotency_key=key).first()
    if previous is not None and previous.name != str(name or "").strip():
        raise MarketError(
            f"idempotency_key: {key!r} was used for order {previous.pk} "
            f"({previous.name!r}); use a new key"
        )
    return previous


def _launch_check(*, command: Any, slurm_job: Any) -> tuple[str, str]:
    """The order's launch command and the Slurm job it drives, trimmed and checked."""
    command, slurm_job = str(command or "").strip(), str(slurm_job or "").strip()
    if len(command) > 1000:
        raise MarketError("command: at most 1000 characters")
    if slurm_job and not _SLURM_JOB.match(slurm_job):
        raise MarketError(f"slurm_job: {slurm_job!r} is not a Slurm job id (e.g. 4242)")
    return command, slurm_job


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
    terms = terms_check(
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
    before = order_snapshot(order, old)
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
        after=order_snapshot(order, terms.values),
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
