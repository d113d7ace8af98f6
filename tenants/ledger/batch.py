"""Many transfers at once (a round's settlement, failure or void): ``transfer_execute_many``."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from functools import cache

from django.contrib.auth.models import AbstractBaseUser
from django.db import router, transaction
from django.db.models import Q
from django.db.models.base import ModelState
from django.utils import timezone

import audit.services as audit
from core.rows import rows_copy, rows_update
from tenants.errors import TenantError
from tenants.models import Account, Campaign, Entry, LedgerOperation, Tenant, Transfer

from .transfers import (
    _ROUTES,
    _earlier,
    _fingerprint,
    _order_check,
    _short,
    _transfer_audit,
    platform_account,
)


@dataclass(frozen=True)
class TransferOrder:
    """One transfer of a batch (``transfer_execute_many``): the arguments of
    ``transfer_execute``."""

    kind: str
    tenant: Tenant
    amount: int
    actor: AbstractBaseUser | None = None
    reason: str = ""
    reference: str = ""
    campaign: Campaign | None = None
    idempotency_key: str | None = None


_KEYS_PER_READ = 10_000
WRITE_SLICE = 50_000  # transfers whose rows are built and written together


@transaction.atomic
def transfer_execute_many(*, orders: Sequence[TransferOrder]) -> list[Transfer]:
    """The transfers ``orders`` asks for, in order, all or none: what ``transfer_execute``
    does one by one, in a number of statements that does not grow with the transfers (a
    round's settlement moves money for every bid in it). Returns them in the orders' order.

    The same rules and records: each order checked as ``transfer_execute`` checks it; every
    account involved locked in one statement in primary-key order (the lock order of every
    path); no tenant account overdrawn at any point of the sequence; two entries per transfer,
    the balances moved, the idempotency records written and one audit event per transfer
    with the content ``transfer_execute`` gives it, appended to the chain together. An order
    whose key was applied before gets that earlier transfer and moves nothing. Raises
    TenantError with the first refusal (a key used for something else, a refusal recorded
    under a key, credits short), and then nothing is written.
    """
    for order in orders:
        _order_check(
            kind=order.kind, tenant=order.tenant, amount=order.amount, campaign=order.campaign
        )
    if not orders:
        return []
    accounts = _accounts_locked_many(orders)
    done: list[Transfer | None] = [None] * len(orders)
    new = _balances_moved(orders, accounts=accounts, earlier=_applied_before(orders), done=done)
    # The rows are written a slice of transfers at a time, so that a round of a million bids
    # does not hold every entry, idempotency record and audit event at once; the slices are
    # in order, in this one transaction.
    now = timezone.now()
    alias = router.db_for_write(Transfer)
    for start in range(0, len(new), WRITE_SLICE):
        _rows_write(new[start : start + WRITE_SLICE], now=now, alias=alias, done=done)
    # The rows are locked above, so their new balances can be written as values.
    moved = {account.pk: account for _, _, s, d in new for account in (s, d)}
    rows_update(list(moved.values()), ["balance"])
    return done  # type: ignore[return-value] - every order has its transfer now


_New = tuple[int, TransferOrder, Account, Account]  # position, order, source, destination


def _applied_before(orders: Sequence[TransferOrder]) -> dict[str, LedgerOperation]:
    """The idempotency records already written under the orders' keys."""
    keys = [order.idempotency_key for order in orders if order.idempotency_key]
    if len(set(keys)) != len(keys):
        raise TenantError("one idempotency key is used twice in one batch of transfers")
    earlier: dict[str, LedgerOperation] = {}
    for start in range(0, len(keys), _KEYS_PER_READ):
        chunk = keys[start : start + _KEYS_PER_READ]
        earlier.update(
            (op.key, op)
            for op in LedgerOperation.objects.select_related("transfer").filter(key__in=chunk)
        )
    return earlier


def _balances_moved(
    orders: Sequence[TransferOrder],
    *,
    accounts: dict,
    earlier: dict[str, LedgerOperation],
    done: list[Transfer | None],
) -> list[_New]:
    """Each order in turn against the locked balances: an order applied before gets its
    earlier transfer in ``done``; the rest move the balances in memory (no tenant account
    overdrawn at any point of the sequence) and are returned, to be written."""
    new: list[_New] = []
    for i, order in enumerate(orders):
        previous = earlier.get(order.idempotency_key or "")
        if previous is not None:
            fingerprint = _fingerprint(order.kind, order.tenant, order.amount, order.reference)
            outcome = _earlier(previous, key=previous.key, fingerprint=fingerprint)
            if outcome.transfer is None:
                raise TenantError(outcome.refusal)
            done[i] = outcome.transfer
            continue
        source_kind, destination_kind = _ROUTES[order.kind]
        source = accounts[_account_key(order.tenant, source_kind)]
        destination = accounts[_account_key(order.tenant, destination_kind)]
        if source.tenant_id is not None and source.balance < order.amount:
            raise TenantError(
                _short(kind=order.kind, tenant=order.tenant, amount=order.amount, source=source)
            )
        source.balance -= order.amount
        destination.balance += order.amount
        new.append((i, order, source, destination))
    return new


def _rows_write(
    part: list[_New], *, now: datetime, alias: str, done: list[Transfer | None]
) -> None:
    """One slice's transfers, entries, idempotency records and audit events. Transfers,
    entries and idempotency records go as plain values (``rows_copy``): a model object per
    row, made and then read back field by field, costs about 60 microseconds a transfer more."""
    rows = [
        _transfer_row(order, source, destination, now) for _, order, source, destination in part
    ]
    keys = rows_copy(Transfer, _TRANSFER_FIELDS, rows)
    rows_copy(
        Entry,
        ("transfer", "account", "amount"),
        [
            row
            for key, (_, order, source, destination) in zip(keys, part, strict=True)
            for row in ((key, source.pk, -order.amount), (key, destination.pk, order.amount))
        ],
    )
    rows_copy(
        LedgerOperation,
        ("key", "fingerprint", "outcome", "transfer"),
        [
            (
                order.idempotency_key,
                # made again rather than kept from the checks: a million-bid round's
                # strings would add about 120 MB to the batch's peak
                _fingerprint(order.kind, order.tenant, order.amount, order.reference),
                LedgerOperation.Outcome.APPLIED,
                key,
            )
            for key, (_, order, _, _) in zip(keys, part, strict=True)
            if order.idempotency_key
        ],
    )
    labels: dict[int, str] = {}  # str(account), once per account
    with audit.batch():
        for key, row, (i, order, source, destination) in zip(keys, rows, part, strict=True):
            transfer = _transfer(key, row, order, source, destination, alias)
            for account in (source, destination):
                if account.pk not in labels:
                    labels[account.pk] = str(account)
            _transfer_audit(transfer, source=labels[source.pk], destination=labels[destination.pk])
            done[i] = transfer


_TRANSFER_FIELDS = (
    "kind",
    "tenant",
    "amount",
    "source",
    "destination",
    "campaign",
    "reference",
    "reason",
    "actor",
    "created_at",
)


@cache
def _transfer_attnames() -> tuple[str, ...]:
    """The transfer's key and ``_TRANSFER_FIELDS`` by attribute name (``tenant_id``), which
    must be every field of the model (``_transfer`` sets each), in its order."""
    names = ("id", *(Transfer._meta.get_field(name).attname for name in _TRANSFER_FIELDS))
    if names != tuple(f.attname for f in Transfer._meta.concrete_fields):
        raise TypeError("_TRANSFER_FIELDS must name every field of Transfer, in its order")
    return names


def _transfer_row(order: TransferOrder, source: Account, destination: Account, now) -> tuple:
    """The values of ``order``'s transfer, field by field as ``_TRANSFER_FIELDS`` names them."""
    return (
        order.kind,
        order.tenant.pk,
        order.amount,
        source.pk,
        destination.pk,
        order.campaign.pk if order.campaign is not None else None,
        order.reference,
        order.reason,
        order.actor.pk if order.actor is not None else None,
        now,
    )


def _transfer(
    key: int, row: tuple, order: TransferOrder, source: Account, destination: Account, alias: str
) -> Transfer:
    """The saved transfer ``rows_copy`` wrote from ``row``, as an object, with its tenant,
    accounts, campaign and actor in hand (reading one of them makes no query)."""
    # A plain row, as from_db makes a saved one less the model's per-field work (a keyword
    # or positional __init__ was about a tenth of a 10,000-hold batch): a transfer has no
    # defaults to compute and no signals on it.
    transfer = Transfer.__new__(Transfer)
    transfer._state = ModelState()
    transfer._state.adding, transfer._state.db = False, alias
    transfer.__dict__.update(zip(_transfer_attnames(), (key, *row), strict=True))
    transfer._state.fields_cache.update(
        tenant=order.tenant,
        source=source,
        destination=destination,
        campaign=order.campaign,
        actor=order.actor,
    )
    return transfer


def _account_key(tenant: Tenant, kind: str) -> tuple[int | None, str]:
    return (None if kind in Account.PLATFORM_KINDS else tenant.pk, kind)


def _accounts_locked_many(orders: Sequence[TransferOrder]) -> dict[tuple[int | None, str], Account]:
    """Every account the orders' routes touch, found and locked in one statement in
    primary-key order, keyed by (tenant id or None, kind); platform accounts that do not
    exist yet are created first. TenantError when a tenant lacks an account."""
    tenants = {order.tenant.pk: order.tenant for order in orders}
    kinds = {kind for order in orders for kind in _ROUTES[order.kind]}
    platform = sorted(kind for kind in kinds if kind in Account.PLATFORM_KINDS)
    own = sorted(kind for kind in kinds if kind not in Account.PLATFORM_KINDS)
    wanted = Q(tenant_id__in=list(tenants), kind__in=own) | Q(
        tenant__isnull=True, kind__in=platform
    )
    for _attempt in range(2):
        locked = {
            (a.tenant_id, a.kind): a
            for a in Account.objects.select_for_update().filter(wanted).order_by("pk")
        }
        missing = [kind for kind in platform if (None, kind) not in locked]
        if not missing:
            break
        for kind in missing:
            platform_account(kind)
    for order in orders:
        for kind in _ROUTES[order.kind]:
            account = locked.get(_account_key(order.tenant, kind))
            if account is None:
                raise TenantError(f"tenant {order.tenant.slug!r} has no {kind} account")
            if account.tenant_id is not None:
                account.tenant = order.tenant  # for str(account), without a query
    return locked
