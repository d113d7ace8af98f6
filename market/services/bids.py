"""Bids: place, edit, cancel. Escrow for a bid is held in the ledger while it is open.

Lock order, the same on every market path: round row, then bid rows (pk order), then the
ledger's account rows (pk order, taken by ``tenants.ledger``). Placing, editing or cancelling
a bid share-locks its round row (FOR SHARE), so the bids of a round go side by side while
closing the round, an update of that row, waits for those in flight: a bid either commits
before the round closes or sees it closed. What the exclusive lock also gave, one tenant's
bids checked against its budgets one at a time, comes from locking the tenant's accounts
before the check (``hold_accounts_lock``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.contrib.auth.models import AbstractBaseUser
from django.db import IntegrityError, connection, transaction
from django.utils import timezone

import audit.services as audit
from core.money import cost_ceil
from core.prepared import prepared_cursor
from market.errors import MarketError, RoundMissing
from market.models import Bid, BidLimit, Round, Tier
from market.services._common import MAX_GPUS, MAX_PRICE, now_or, whole
from tenants.access import access_object, membership_of
from tenants.budgets import budget_check
from tenants.errors import TenantError
from tenants.ledger import MAX_AMOUNT, credits_hold, credits_release, hold_accounts_lock
from tenants.models import Account, Campaign, Tenant, Transfer


def window_seconds(rnd: Round) -> int:
    return int((rnd.ends_at - rnd.starts_at).total_seconds())


def bid_escrow(*, quantity: int, limits: dict[str, int], seconds: int) -> int:
    """What a bid holds: quantity x its highest limit x window hours, rounded up (milli-credits)."""
    return cost_ceil(gpus=quantity, price=max(limits.values()), seconds=seconds)


@dataclass(frozen=True)
class _Terms:
    quantity: int
    min_quantity: int
    limits: dict[str, int]  # tier slug -> milli-credits per GPU-hour
    tiers: dict[str, Tier]


def tiers_on_offer(slugs: list[Any], *, then: str, field: str = "") -> dict[str, Tier]:
    """{slug: Tier} for ``slugs``, each an active tier; MarketError naming the unknown or
    inactive ones (prefixed with ``field`` when given), the latter ending with ``then``."""
    prefix = f"{field}: " if field else ""
    tiers = Tier.objects.in_bulk([str(slug) for slug in slugs], field_name="slug")
    unknown = sorted(str(slug) for slug in slugs if slug not in tiers)
    if unknown:
        offered = Tier.objects.filter(active=True).values_list("slug", flat=True)
        raise MarketError(
            f"{prefix}unknown tier {', '.join(unknown)}; tiers on offer: "
            f"{', '.join(offered) or 'none'}"
        )
    inactive = sorted(slug for slug, tier in tiers.items() if not tier.active)
    if inactive:
        raise MarketError(f"{prefix}tier {', '.join(inactive)} is not on offer now; {then}")
    return tiers


def _terms(*, quantity: Any, min_quantity: Any, limits: Any) -> _Terms:
    quantity = whole(quantity, field="quantity (GPUs)", minimum=1, maximum=MAX_GPUS)
    min_quantity = whole(min_quantity, field="minimum quantity (GPUs)", minimum=0, maximum=MAX_GPUS)
    if min_quantity > quantity:
        raise MarketError(
            f"minimum quantity {min_quantity} is more than the quantity {quantity}; "
            "the minimum is the smallest useful number of GPUs, at most the quantity"
        )
    if not isinstance(limits, dict) or not limits:
        raise MarketError("a bid needs a limit price for at least one tier")
    tiers = tiers_on_offer(list(limits), then="bid on another tier")
    clean = {
        slug: whole(
            price,
            field=f"limit price for {slug} (milli-credits per GPU-hour)",
            minimum=1,
            maximum=MAX_PRICE,
        )
        for slug, price in sorted(limits.items())
    }
    return _Terms(quantity=quantity, min_quantity=min_quantity, limits=clean, tiers=tiers)


def _round_shared(round_id: int, *, now: datetime) -> Round | None:
    """The round if it is open for bidding at ``now``, share-locked (module docstring) until
    the transaction ends; None otherwise, and then nothing is locked, so bids arriving after
    the close do not hold up the update that closes it. The embedded SQLite has no row
    locks: its writers take the whole database in turn."""
    rows = Round.objects.filter(pk=round_id, status=Round.Status.OPEN, closes_at__gt=now)
    if connection.vendor != "postgresql":
        return rows.first()
    sql, params = rows.query.sql_with_params()
    found = list(Round.objects.raw(f"{sql} FOR SHARE", params))
    return found[0] if found else None


def _round_open_locked(
    *, round_id: int, now: datetime, then: str = "bid in the round that is open now"
) -> Round:
    """The round, share-locked (``_round_shared``); RoundMissing when there is none, and a
    MarketError that ends with ``then`` when it is no longer open for bidding."""
    rnd = _round_shared(round_id, now=now)
    if rnd is not None:
        return rnd
    closed = Round.objects.filter(pk=round_id).first()
    if closed is None:
        raise RoundMissing(f"there is no round {round_id}")
    raise MarketError(
        f"bidding for round {closed.pk} closed at {closed.closes_at:%Y-%m-%d %H:%M:%S} UTC; {then}"
    )


def _budget_or_refuse(
    *, tenant: Tenant, amount: int, campaign: Campaign | None, now: datetime
) -> None:
    try:
        decision = budget_check(tenant=tenant, amount=amount, campaign=campaign, at=now)
    except TenantError as exc:  # e.g. an escrow beyond what one ledger operation may move
        raise MarketError(f"bid refused: {exc}") from exc
    if not decision.allowed:
        raise MarketError(f"bid refused: {decision.reason}")


def _ledger(call: Callable[..., object], **kwargs: Any) -> None:
    try:
        call(**kwargs)
    except TenantError as exc:
        raise MarketError(f"bid refused: {exc}") from exc


def _snapshot(bid: Bid, limits: dict[str, int]) -> dict[str, Any]:
    return {
        "round": bid.round_id,
        "quantity": bid.quantity,
        "min_quantity": bid.min_quantity,
        "limits": limits,
        "escrow": bid.escrow,
        "status": bid.status,
        "campaign": bid.campaign_id,
    }


def _limits_of(bid: Bid) -> dict[str, int]:
    return dict(bid.limits.order_by("tier__slug").values_list("tier__slug", "price"))


def _check_member(*, user: AbstractBaseUser, tenant: Tenant) -> None:
    membership = membership_of(user)
    if membership is None or membership.tenant_id != tenant.pk:
        raise MarketError(f"{user} is not a member of {tenant.slug} and cannot bid for it")


@transaction.atomic
def bid_place(
    *,
    user: AbstractBaseUser,
    tenant: Tenant,
    round: Round | int,  # the domain's word, though it shadows the builtin here
    quantity: int,
    min_quantity: int = 0,
    limits: dict[str, int],
    campaign: Campaign | None = None,
    idempotency_key: str | None = None,
    note: str = "",
    now: datetime | None = None,
) -> Bid:
    """Place a bid for ``quantity`` GPUs (all-or-nothing below ``min_quantity``; 0 = any) with a
    limit price per acceptable tier, {tier slug: milli-credits per GPU-hour}.

    ``round`` is the round or its id (the API has only the id): either way the round is read
    here, once, locked; RoundMissing when there is none.

    Holds quantity x highest limit x window hours (rounded up) in escrow, after the tenant's
    budgets allow it. ``tenant`` comes from the access helpers (the caller's tenant). With an
    ``idempotency_key`` a retry returns the first bid. Raises MarketError with the reason;
    on any refusal nothing is written.

    On PostgreSQL a bid that will be placed goes in one call of ``market_bid_place`` (market
    migration 0011): the same rows, locks, events and hashes in 4 statements instead of 13.
    Anything else (a refusal, a replayed key) takes the path below it, which words each error.
    """
    now = now_or(now)
    round_id = round if isinstance(round, int) else round.pk
    _check_member(user=user, tenant=tenant)
    if connection.vendor == "postgresql":
        placed = _place_in_one_call(
            user=user,
            tenant=tenant,
            round_id=round_id,
            quantity=quantity,
            min_quantity=min_quantity,
            limits=limits,
            campaign=campaign,
            key=(idempotency_key or "").strip(),
            note=str(note or "")[:200],
            now=now,
        )
        if placed is not None:
            return placed
    terms = _terms(quantity=quantity, min_quantity=min_quantity, limits=limits)
    if campaign is not None and campaign.tenant_id != tenant.pk:
        raise MarketError(f"campaign {campaign.name!r} does not belong to {tenant.slug}")
    key = (idempotency_key or "").strip()
    if key:
        if len(key) > 80:
            raise MarketError("an idempotency key has at most 80 characters")
        previous = Bid.objects.filter(tenant=tenant, idempotency_key=key).first()
        if previous is not None:
            return _same_bid_or_refuse(
                previous, terms=terms, round_id=round_id, key=key, campaign=campaign, note=note
            )
    rnd = _round_open_locked(round_id=round_id, now=now)
    escrow = bid_escrow(quantity=terms.quantity, limits=terms.limits, seconds=window_seconds(rnd))
    hold_accounts_lock(tenant=tenant)  # the budget read below stays as read until the commit
    _budget_or_refuse(tenant=tenant, amount=escrow, campaign=campaign, now=now)
    bid, created = _bid_row(
        user=user, tenant=tenant, rnd=rnd, terms=terms, escrow=escrow, campaign=campaign,
        key=key, note=note,
    )  # fmt: skip
    if created:
        _bid_held_and_recorded(bid=bid, user=user, tenant=tenant, terms=terms, campaign=campaign)
    return bid


def _bid_row(
    *,
    user: AbstractBaseUser,
    tenant: Tenant,
    rnd: Round,
    terms: _Terms,
    escrow: int,
    campaign: Campaign | None,
    key: str,
    note: str,
) -> Bid:
    """(the bid's new row, True), or (the bid of the request that raced in with the same
    key, False)."""
    try:
        # The savepoint is only for the race on an idempotency key (handled below); without
        # a key an IntegrityError is a bug and rolls the whole bid back.
        with transaction.atomic(savepoint=bool(key)):
            bid = Bid.objects.create(
                tenant=tenant,
                author=user,
                round=rnd,
                campaign=campaign,
                quantity=terms.quantity,
                min_quantity=terms.min_quantity,
                escrow=escrow,
                note=str(note or "")[:200],
                idempotency_key=key,
            )
    except IntegrityError:
        if not key:
            raise
        # The same key raced in from another request; that one owns the bid.
        previous = Bid.objects.get(tenant=tenant, idempotency_key=key)
        raced = _same_bid_or_refuse(
            previous, terms=terms, round_id=rnd.pk, key=key, campaign=campaign, note=note
        )
        return raced, False
    return bid, True


def _bid_held_and_recorded(
    *, bid: Bid, user: AbstractBaseUser, tenant: Tenant, terms: _Terms, campaign: Campaign | None
) -> None:
    """The bid's limits, its escrow hold and its event; the hold's ledger event and the
    bid's event go into the chain in one append."""
    BidLimit.objects.bulk_create(
        [
            BidLimit(bid=bid, tier=terms.tiers[slug], price=price)
            for slug, price in terms.limits.items()
        ]
    )
    with audit.batch():
        _ledger(
            credits_hold,
            tenant=tenant,
            amount=bid.escrow,
            actor=user,
            reason=f"escrow for bid {bid.pk} in round {bid.round_id}",
            reference=f"bid:{bid.pk}",
            campaign=campaign,
        )
        audit.record(
            actor=user,
            action="bid.place",
            target=bid,
            tenant=tenant,
            after=_snapshot(bid, terms.limits),
        )


_PLACE_SQL = (
    "SELECT outcome, bid_id, escrow, transfer_id, head_seq, head_hash FROM market_bid_place("
    "%s::bigint, %s::timestamptz, %s::timestamptz, %s::bigint, %s::integer, %s::bigint, "
    "%s::integer, %s::integer, %s::text, %s::text, %s::text[], %s::bigint[], %s::boolean, "
    "%s::bigint, %s::bigint)"
)


def _plain_terms(
    *, quantity: Any, min_quantity: Any, limits: Any
) -> tuple[int, int, dict[str, int]] | None:
    """The terms as ``_terms`` takes them, less the tiers' read: quantity and minimum checked
    (raising as ``_terms`` does, before it reads the tiers), then the limits sorted by slug;
    None when the limits need ``_terms`` to word what is wrong with them."""
    quantity = whole(quantity, field="quantity (GPUs)", minimum=1, maximum=MAX_GPUS)
    min_quantity = whole(min_quantity, field="minimum quantity (GPUs)", minimum=0, maximum=MAX_GPUS)
    if min_quantity > quantity or not isinstance(limits, dict) or not limits:
        return None
    clean = {}
    for slug, price in sorted(limits.items()):
        if not isinstance(slug, str) or isinstance(price, bool) or not isinstance(price, int):
            return None
        if not 1 <= price <= MAX_PRICE:
            return None
        clean[slug] = price
    return quantity, min_quantity, clean


def _place_in_one_call(
    *,
    user: AbstractBaseUser,
    tenant: Tenant,
    round_id: int,
    quantity: Any,
    min_quantity: Any,
    limits: Any,
    campaign: Campaign | None,
    key: str,
    note: str,
    now: datetime,
) -> Bid | None:
    """``bid_place`` on PostgreSQL for a bid that goes through: the round, tiers, accounts,
    bid, limits, hold and the chain's head in one call (``market_bid_place``), then the hold's
    and the bid's events appended onto that head in one INSERT. None, with nothing written,
    for anything the reference path must word (a refusal, a replayed or racing key).

    A tenant with a budget that may apply costs one call more: the function stops once the
    accounts are locked, ``budget_check`` decides under those locks, and it is called again."""
    terms = _plain_terms(quantity=quantity, min_quantity=min_quantity, limits=limits)
    if terms is None or len(key) > 80:
        return None
    if campaign is not None and (
        campaign.tenant_id != tenant.pk or not campaign.starts_at <= now < campaign.ends_at
    ):
        return None
    quantity, min_quantity, clean = terms
    stamp = timezone.now()
    with prepared_cursor() as cursor:
        budgets_checked = False
        while True:
            cursor.execute(
                _PLACE_SQL,
                [
                    round_id, now, stamp, tenant.pk, user.pk,
                    campaign.pk if campaign is not None else None, quantity, min_quantity,
                    note, key, list(clean), list(clean.values()), budgets_checked,
                    MAX_AMOUNT, audit.CHAIN_LOCK_KEY,
                ],
            )  # fmt: skip
            outcome, bid_id, escrow, transfer_id, head_seq, head_hash = cursor.fetchone()
            if outcome != "budgets" or budgets_checked:
                break
            _budget_or_refuse(tenant=tenant, amount=escrow, campaign=campaign, now=now)
            budgets_checked = True
    if outcome != "placed":
        return None
    bid = Bid(
        pk=bid_id,
        tenant=tenant,
        author=user,
        round_id=round_id,
        campaign=campaign,
        quantity=quantity,
        min_quantity=min_quantity,
        escrow=escrow,
        note=note,
        idempotency_key=key,
        created_at=stamp,
        updated_at=stamp,
    )
    bid._state.adding, bid._state.db = False, connection.alias
    _placed_recorded(bid, user=user, tenant=tenant, clean=clean, transfer_id=transfer_id,
                     head=(head_seq, head_hash))  # fmt: skip
    return bid


def _placed_recorded(
    bid: Bid,
    *,
    user: AbstractBaseUser,
    tenant: Tenant,
    clean: dict[str, int],
    transfer_id: int,
    head: tuple[int, str],
) -> None:
    """The same two events as credits_hold's and the reference path's, in the same order,
    appended onto the chain's ``head`` the one call read."""
    with audit.batch(head=head):
        audit.record(
            actor=user,
            action=f"ledger.{Transfer.Kind.HOLD}",
            target=Transfer(pk=transfer_id),
            tenant=tenant,
            after={
                "amount": bid.escrow,
                "from": f"{tenant.slug}:{Account.Kind.AVAILABLE}",
                "to": f"{tenant.slug}:{Account.Kind.ESCROW}",
                "reference": f"bid:{bid.pk}",
                "reason": f"escrow for bid {bid.pk} in round {bid.round_id}",
                "campaign": bid.campaign_id,
            },
        )
        audit.record(
            actor=user, action="bid.place", target=bid, tenant=tenant, after=_snapshot(bid, clean)
        )


def _same_bid_or_refuse(
    previous: Bid,
    *,
    terms: _Terms,
    round_id: int,
    key: str,
    campaign: Campaign | None,
    note: str,
) -> Bid:
    """The bid a key was first used for, when this request asks for the same; a replay that
    differs in anything it would store (terms, round, campaign, note) is refused."""
    same = (
        previous.round_id == round_id
        and previous.campaign_id == (campaign.pk if campaign is not None else None)
        and previous.note == str(note or "")[:200]
        and previous.quantity == terms.quantity
        and previous.min_quantity == terms.min_quantity
        and _limits_of(previous) == terms.limits
    )
    if not same:
        raise MarketError(
            f"idempotency key {key!r} was already used for bid {previous.pk} with other terms; use a new key"
        )
    return previous


def _bid_locked(*, tenant: Tenant, bid_id: object, now: datetime) -> tuple[Round, Bid]:
    """The caller's open bid and its open round, the round share-locked, then the bid locked.
    Another tenant's bid is a 404, exactly like a missing one."""
    bid = access_object(Bid.objects.all(), tenant=tenant, pk=bid_id)
    rnd = _round_open_locked(
        round_id=bid.round_id, now=now, then=f"bid {bid.pk} can no longer be changed"
    )
    bid = Bid.objects.select_for_update().get(pk=bid.pk)
    if bid.order_id is not None:
        raise MarketError(
            f"bid {bid.pk} was placed by standing order {bid.order_id}; edit, pause or cancel "
            "the order instead"
        )
    if bid.status != Bid.Status.OPEN:
        raise MarketError(f"bid {bid.pk} is {bid.status}; only an open bid can be changed")
    return rnd, bid


@transaction.atomic
def bid_edit(
    *,
    user: AbstractBaseUser,
    tenant: Tenant,
    bid_id: object,
    quantity: int | None = None,
    min_quantity: int | None = None,
    limits: dict[str, int] | None = None,
    now: datetime | None = None,
) -> Bid:
    """Change an open bid before its round closes. Escrow follows the new terms: the extra is
    held (after the budget check) or the difference released. Omitted terms stay as they are."""
    now = now_or(now)
    _check_member(user=user, tenant=tenant)
    rnd, bid = _bid_locked(tenant=tenant, bid_id=bid_id, now=now)
    old_limits = _limits_of(bid)
    terms = _terms(
        quantity=bid.quantity if quantity is None else quantity,
        min_quantity=bid.min_quantity if min_quantity is None else min_quantity,
        limits=old_limits if limits is None else limits,
    )
    before = _snapshot(bid, old_limits)
    escrow = bid_escrow(quantity=terms.quantity, limits=terms.limits, seconds=window_seconds(rnd))
    difference = escrow - bid.escrow
    common = {
        "tenant": tenant,
        "actor": user,
        "reference": f"bid:{bid.pk}",
        "campaign": bid.campaign,
    }
    if difference > 0:
        hold_accounts_lock(tenant=tenant)  # the budget read stays as read until the commit
        _budget_or_refuse(tenant=tenant, amount=difference, campaign=bid.campaign, now=now)
    # The ledger's event (if escrow moves) and bid.edit go into the chain in one append.
    with audit.batch():
        if difference > 0:
            _ledger(credits_hold, amount=difference, reason=f"bid {bid.pk} raised", **common)
        elif difference < 0:
            _ledger(credits_release, amount=-difference, reason=f"bid {bid.pk} lowered", **common)
        bid.quantity, bid.min_quantity, bid.escrow = terms.quantity, terms.min_quantity, escrow
        bid.save(update_fields=["quantity", "min_quantity", "escrow", "updated_at"])
        if terms.limits != old_limits:
            bid.limits.all().delete()
            BidLimit.objects.bulk_create(
                [
                    BidLimit(bid=bid, tier=terms.tiers[slug], price=price)
                    for slug, price in terms.limits.items()
                ]
            )
        audit.record(
            actor=user,
            action="bid.edit",
            target=bid,
            tenant=tenant,
            before=before,
            after=_snapshot(bid, terms.limits),
        )
    return bid


def _cancel_locked(*, bid: Bid, actor: AbstractBaseUser | str | None, reason: str) -> None:
    if bid.escrow:
        credits_release(
            tenant=bid.tenant,
            amount=bid.escrow,
            actor=actor if isinstance(actor, AbstractBaseUser) else None,
            reason=reason,
            reference=f"bid:{bid.pk}",
            campaign=bid.campaign,
            idempotency_key=f"cancel:{bid.pk}",
        )
    released, bid.escrow, bid.status = bid.escrow, 0, Bid.Status.CANCELLED
    bid.save(update_fields=["escrow", "status", "updated_at"])
    audit.record(
        actor=actor,
        action="bid.cancel",
        target=bid,
        tenant=bid.tenant,
        before={"status": Bid.Status.OPEN, "escrow": released},
        after={"status": bid.status, "released": released, "reason": reason},
    )


@transaction.atomic
def bid_cancel(
    *, user: AbstractBaseUser, tenant: Tenant, bid_id: object, now: datetime | None = None
) -> Bid:
    """Cancel an open bid before its round closes; its whole escrow goes back to available."""
    now = now_or(now)
    _check_member(user=user, tenant=tenant)
    _rnd, bid = _bid_locked(tenant=tenant, bid_id=bid_id, now=now)
    _cancel_locked(bid=bid, actor=user, reason=f"bid {bid.pk} cancelled by {user}")
    return bid


@transaction.atomic
def tenant_bids_cancel(
    *,
    tenant: Tenant,
    reason: str,
    actor: AbstractBaseUser | str | None = "system",
    now: datetime | None = None,
) -> list[Bid]:
    """Cancel every bid the tenant has in rounds still open for bidding (e.g. a hard budget cap
    was reached). Returns the cancelled bids."""
    now = now_or(now)
    if not (reason or "").strip():
        raise MarketError("cancelling a tenant's bids needs a reason")
    candidates = set(
        Bid.objects.filter(tenant=tenant, status=Bid.Status.OPEN).values_list("round_id", flat=True)
    )
    round_ids = list(
        Round.objects.select_for_update()
        .filter(pk__in=candidates, status=Round.Status.OPEN, closes_at__gt=now)
        .order_by("pk")
        .values_list("pk", flat=True)
    )
    bids = list(
        Bid.objects.select_for_update(of=("self",))
        .filter(tenant=tenant, round_id__in=round_ids, status=Bid.Status.OPEN)
        .select_related("tenant", "campaign")
        .order_by("pk")
    )
    for bid in bids:
        _cancel_locked(bid=bid, actor=actor, reason=reason.strip())
    if bids:
        audit.record(
            actor=actor,
            action="bid.cancel_all",
            target=tenant,
            tenant=tenant,
            after={"bids": [b.pk for b in bids], "count": len(bids), "reason": reason.strip()},
        )
    return bids
