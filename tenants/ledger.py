"""The double-entry credit ledger: every write to a balance goes through here.

Amounts are integer milli-credits (1 credit = 1000). A transfer moves an amount from one
account to another and writes two entries summing to zero. Balance changes lock the two
account rows with ``select_for_update`` in primary-key order, so concurrent requests
serialise on the rows they touch and can never overdraw a tenant account; the database
check constraint is the last line behind that.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from django.contrib.auth.models import AbstractBaseUser
from django.db import IntegrityError, transaction
from django.db.models import BigIntegerField, Case, CharField, F, Q, Sum, Value, When
from django.db.models.functions import Cast
from django.utils import timezone

import audit.services as audit
from audit.models import AuditEvent
from core.rows import rows_update
from tenants.errors import TenantError
from tenants.models import Account, Campaign, Entry, LedgerOperation, Tenant, Transfer

MILLI = 1000
# 10^12 credits: far above any real grant, far below BigInteger overflow when summed.
MAX_AMOUNT = 10**15

Kind = Account.Kind

# transfer kind -> (source account kind, destination account kind)
_ROUTES: dict[str, tuple[str, str]] = {
    Transfer.Kind.GRANT: (Kind.ISSUANCE, Kind.AVAILABLE),
    Transfer.Kind.HOLD: (Kind.AVAILABLE, Kind.ESCROW),
    Transfer.Kind.RELEASE: (Kind.ESCROW, Kind.AVAILABLE),
    Transfer.Kind.CHARGE: (Kind.ESCROW, Kind.REVENUE),
    Transfer.Kind.REFUND: (Kind.REVENUE, Kind.AVAILABLE),
}


def credits(amount: int) -> str:
    """Milli-credits as a human string: 12345 -> '12.345'."""
    sign = "-" if amount < 0 else ""
    whole, frac = divmod(abs(amount), MILLI)
    return f"{sign}{whole:,}.{frac:03d}"


def amount_validate(amount: object, *, field: str = "amount") -> int:
    # bool is an int subclass; a float or Decimal amount is a unit mistake, not rounding.
    if isinstance(amount, bool) or not isinstance(amount, int):
        raise TenantError(
            f"{field} must be a whole number of milli-credits, got {type(amount).__name__} {amount!r}"
        )
    if amount <= 0:
        raise TenantError(f"{field} must be positive, got {amount}")
    if amount > MAX_AMOUNT:
        raise TenantError(
            f"{field} of {credits(amount)} credits is larger than the limit of "
            f"{credits(MAX_AMOUNT)} credits"
        )
    return amount


def tenant_accounts_create(*, tenant: Tenant) -> None:
    """Create a tenant's two accounts (idempotent)."""
    for kind in Account.TENANT_KINDS:
        Account.objects.get_or_create(tenant=tenant, kind=kind)


def platform_account(kind: str) -> Account:
    account = Account.objects.filter(tenant__isnull=True, kind=kind).first()
    if account is not None:
        return account
    try:
        with transaction.atomic():
            return Account.objects.create(tenant=None, kind=kind)
    except IntegrityError:
        # Another request created it first.
        return Account.objects.get(tenant__isnull=True, kind=kind)


def _accounts_locked(*, tenant: Tenant, kind: str) -> tuple[Account, Account]:
    """The source and destination accounts of ``kind``'s route, found and locked in one
    statement, in primary-key order (the lock order on every path, so two transfers cannot
    deadlock). A platform account that does not exist yet is created first."""
    kinds = _ROUTES[kind]
    wanted = Q()
    for account_kind in kinds:
        if account_kind in Account.PLATFORM_KINDS:
            wanted |= Q(tenant__isnull=True, kind=account_kind)
        else:
            wanted |= Q(tenant=tenant, kind=account_kind)
    for _attempt in range(2):
        # FOR UPDATE locks the rows as they leave the sort, so in pk order.
        locked = {
            a.kind: a for a in Account.objects.select_for_update().filter(wanted).order_by("pk")
        }
        missing = [k for k in kinds if k not in locked]
        if not missing:
            break
        for account_kind in missing:
            if account_kind not in Account.PLATFORM_KINDS:
                raise TenantError(f"tenant {tenant.slug!r} has no {account_kind} account")
            platform_account(account_kind)
    for account in locked.values():
        if account.tenant_id is not None:
            account.tenant = tenant  # for str(account), without a query
    return locked[kinds[0]], locked[kinds[1]]


def _fingerprint(kind: str, tenant: Tenant, amount: int, reference: str) -> str:
    """What an idempotency key is recorded for: a retry must ask for the same."""
    return f"{kind}:{tenant.pk}:{amount}:{reference}"


@dataclass(frozen=True)
class _Outcome:
    transfer: Transfer | None
    refusal: str = ""


def _transfer_locked(
    *,
    kind: str,
    tenant: Tenant,
    amount: int,
    actor: AbstractBaseUser | None,
    reason: str,
    reference: str,
    campaign: Campaign | None,
    idempotency_key: str | None,
) -> _Outcome:
    source, destination = _accounts_locked(tenant=tenant, kind=kind)

    fingerprint = _fingerprint(kind, tenant, amount, reference)
    if idempotency_key:
        # Read after taking the locks: a concurrent first attempt with this key has either
        # committed (we see it) or not started (we are first).
        previous = LedgerOperation.objects.filter(key=idempotency_key).first()
        if previous is not None:
            if previous.fingerprint != fingerprint:
                return _Outcome(
                    None,
                    f"idempotency key {idempotency_key!r} was already used for a different "
                    f"operation ({previous.fingerprint}); use a new key",
                )
            if previous.outcome == LedgerOperation.Outcome.REFUSED:
                return _Outcome(None, previous.message)
            return _Outcome(previous.transfer)

    if source.tenant_id is not None and source.balance < amount:
        message = (
            f"insufficient credits: {kind} of {credits(amount)} needs {credits(amount)} in "
            f"{tenant.slug}'s {source.kind} account, which holds {credits(source.balance)}"
        )
        if idempotency_key:
            LedgerOperation.objects.create(
                key=idempotency_key,
                fingerprint=fingerprint,
                outcome=LedgerOperation.Outcome.REFUSED,
                message=message,
            )
        return _Outcome(None, message)

    now = timezone.now()
    transfer = Transfer.objects.create(
        kind=kind,
        tenant=tenant,
        amount=amount,
        source=source,
        destination=destination,
        campaign=campaign,
        reference=reference,
        reason=reason,
        actor=actor,
        created_at=now,
    )
    Entry.objects.bulk_create(
        [
            Entry(transfer=transfer, account=source, amount=-amount),
            Entry(transfer=transfer, account=destination, amount=amount),
        ]
    )
    # Both balances in one statement; the rows are locked above.
    Account.objects.filter(pk__in=[source.pk, destination.pk]).update(
        balance=F("balance")
        + Case(
            When(pk=source.pk, then=Value(-amount)),
            default=Value(amount),
            output_field=BigIntegerField(),
        )
    )
    source.balance -= amount
    destination.balance += amount
    if idempotency_key:
        LedgerOperation.objects.create(
            key=idempotency_key,
            fingerprint=fingerprint,
            outcome=LedgerOperation.Outcome.APPLIED,
            transfer=transfer,
        )
    _transfer_audit(transfer, source=source, destination=destination)
    return _Outcome(transfer)


def _transfer_audit(transfer: Transfer, *, source: Account, destination: Account) -> None:
    """The audit event of a transfer (verify-ledger matches each transfer to its own)."""
    audit.record(
        actor=transfer.actor,
        action=f"ledger.{transfer.kind}",
        target=transfer,
        tenant=transfer.tenant,
        after={
            "amount": transfer.amount,
            "from": str(source),
            "to": str(destination),
            "reference": transfer.reference,
            "reason": transfer.reason,
            "campaign": transfer.campaign_id,
        },
    )


def transfer_execute(
    *,
    kind: str,
    tenant: Tenant,
    amount: int,
    actor: AbstractBaseUser | None = None,
    reason: str = "",
    reference: str = "",
    campaign: Campaign | None = None,
    idempotency_key: str | None = None,
) -> Transfer:
    """Move ``amount`` milli-credits along the route of ``kind``; raise TenantError if refused.

    With an ``idempotency_key`` a retry returns the first outcome: the same transfer, or the
    same refusal, and never moves credits twice. (Inside a caller's transaction that later
    rolls back, the record of a refusal rolls back with it.)
    """
    if kind not in _ROUTES:
        raise TenantError(f"unknown transfer kind {kind!r}; expected one of {sorted(_ROUTES)}")
    amount_validate(amount)
    if not isinstance(tenant, Tenant) or tenant.pk is None:
        raise TenantError("transfer needs an existing tenant")
    if campaign is not None and campaign.tenant_id != tenant.pk:
        raise TenantError(f"campaign {campaign.name!r} does not belong to tenant {tenant.slug!r}")
    try:
        # Only the idempotency key can make this fail with an IntegrityError that a caller
        # may want to survive, so only then is a savepoint worth its two round trips.
        with transaction.atomic(savepoint=bool(idempotency_key)):
            outcome = _transfer_locked(
                kind=kind,
                tenant=tenant,
                amount=amount,
                actor=actor,
                reason=reason,
                reference=reference,
                campaign=campaign,
                idempotency_key=idempotency_key,
            )
    except IntegrityError as exc:
        if not idempotency_key:
            raise
        # Only the idempotency key is unique here: two first attempts with one key raced.
        raise TenantError(
            f"idempotency key {idempotency_key!r} is being used by another request; retry"
        ) from exc
    if outcome.transfer is None:
        raise TenantError(outcome.refusal)
    return outcome.transfer


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


BATCH_ROWS = 2000  # rows per INSERT or UPDATE statement of a batch
_KEYS_PER_READ = 10_000


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
        if order.kind not in _ROUTES:
            raise TenantError(
                f"unknown transfer kind {order.kind!r}; expected one of {sorted(_ROUTES)}"
            )
        amount_validate(order.amount)
        if not isinstance(order.tenant, Tenant) or order.tenant.pk is None:
            raise TenantError("transfer needs an existing tenant")
        if order.campaign is not None and order.campaign.tenant_id != order.tenant.pk:
            raise TenantError(
                f"campaign {order.campaign.name!r} does not belong to tenant {order.tenant.slug!r}"
            )
    if not orders:
        return []
    accounts = _accounts_locked_many(orders)
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

    done: list[Transfer | None] = [None] * len(orders)
    new: list[tuple[int, TransferOrder, Account, Account]] = []
    for i, order in enumerate(orders):
        fingerprint = _fingerprint(order.kind, order.tenant, order.amount, order.reference)
        previous = earlier.get(order.idempotency_key or "")
        if previous is not None:
            if previous.fingerprint != fingerprint:
                raise TenantError(
                    f"idempotency key {order.idempotency_key!r} was already used for a "
                    f"different operation ({previous.fingerprint}); use a new key"
                )
            if previous.outcome == LedgerOperation.Outcome.REFUSED:
                raise TenantError(previous.message)
            done[i] = previous.transfer
            continue
        source_kind, destination_kind = _ROUTES[order.kind]
        source = accounts[_account_key(order.tenant, source_kind)]
        destination = accounts[_account_key(order.tenant, destination_kind)]
        if source.tenant_id is not None and source.balance < order.amount:
            raise TenantError(
                f"insufficient credits: {order.kind} of {credits(order.amount)} needs "
                f"{credits(order.amount)} in {order.tenant.slug}'s {source.kind} account, "
                f"which holds {credits(source.balance)}"
            )
        source.balance -= order.amount
        destination.balance += order.amount
        new.append((i, order, source, destination))

    now = timezone.now()
    transfers = Transfer.objects.bulk_create(
        [
            Transfer(
                kind=order.kind,
                tenant=order.tenant,
                amount=order.amount,
                source=source,
                destination=destination,
                campaign=order.campaign,
                reference=order.reference,
                reason=order.reason,
                actor=order.actor,
                created_at=now,
            )
            for _, order, source, destination in new
        ],
        batch_size=BATCH_ROWS,
    )
    Entry.objects.bulk_create(
        [
            entry
            for transfer, (_, order, source, destination) in zip(transfers, new, strict=True)
            for entry in (
                Entry(transfer=transfer, account=source, amount=-order.amount),
                Entry(transfer=transfer, account=destination, amount=order.amount),
            )
        ],
        batch_size=BATCH_ROWS,
    )
    # The rows are locked above, so their new balances can be written as values.
    moved = {account.pk: account for _, _, s, d in new for account in (s, d)}
    rows_update(list(moved.values()), ["balance"])
    LedgerOperation.objects.bulk_create(
        [
            LedgerOperation(
                key=order.idempotency_key,
                fingerprint=_fingerprint(order.kind, order.tenant, order.amount, order.reference),
                outcome=LedgerOperation.Outcome.APPLIED,
                transfer=transfer,
            )
            for transfer, (_, order, _, _) in zip(transfers, new, strict=True)
            if order.idempotency_key
        ],
        batch_size=BATCH_ROWS,
    )
    with audit.batch():
        for transfer, (i, _, source, destination) in zip(transfers, new, strict=True):
            _transfer_audit(transfer, source=source, destination=destination)
            done[i] = transfer
    return done  # type: ignore[return-value] - every order has its transfer now


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


def credits_grant(
    *,
    tenant: Tenant,
    amount: int,
    reason: str,
    actor: AbstractBaseUser | None,
    idempotency_key: str | None = None,
) -> Transfer:
    """Issue new credits to a tenant (admin, with a reason)."""
    if not reason or not reason.strip():
        raise TenantError("a credit grant needs a reason")
    return transfer_execute(
        kind=Transfer.Kind.GRANT,
        tenant=tenant,
        amount=amount,
        actor=actor,
        reason=reason.strip(),
        idempotency_key=idempotency_key,
    )


class Move(Protocol):
    """The keyword arguments of every transfer whose route is fixed (hold, release, charge,
    refund): those of ``transfer_execute`` less ``kind``."""

    def __call__(
        self,
        *,
        tenant: Tenant,
        amount: int,
        actor: AbstractBaseUser | None = None,
        reason: str = "",
        reference: str = "",
        campaign: Campaign | None = None,
        idempotency_key: str | None = None,
    ) -> Transfer: ...


def _move(kind: str, doc: str) -> Move:
    def move(
        *,
        tenant: Tenant,
        amount: int,
        actor: AbstractBaseUser | None = None,
        reason: str = "",
        reference: str = "",
        campaign: Campaign | None = None,
        idempotency_key: str | None = None,
    ) -> Transfer:
        return transfer_execute(
            kind=kind,
            tenant=tenant,
            amount=amount,
            actor=actor,
            reason=reason,
            reference=reference,
            campaign=campaign,
            idempotency_key=idempotency_key,
        )

    move.__name__ = move.__qualname__ = f"credits_{kind}"
    move.__doc__ = doc
    return move


credits_hold = _move(Transfer.Kind.HOLD, "available -> escrow (a bid's maximum cost).")
credits_release = _move(
    Transfer.Kind.RELEASE,
    "escrow -> available (a cancelled or lost bid, or what a winner did not spend).",
)
credits_charge = _move(Transfer.Kind.CHARGE, "escrow -> revenue (what a winner pays).")
credits_refund = _move(
    Transfer.Kind.REFUND, "revenue -> available (reverses a charge, e.g. a voided round)."
)


# Reads -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Balance:
    available: int
    escrow: int

    @property
    def total(self) -> int:
        return self.available + self.escrow


def balance_get(*, tenant: Tenant) -> Balance:
    rows = dict(Account.objects.filter(tenant=tenant).values_list("kind", "balance"))
    return Balance(available=rows.get(Kind.AVAILABLE, 0), escrow=rows.get(Kind.ESCROW, 0))


def ledger_verify() -> list[str]:
    """Every ledger invariant; returns the problems found (empty = clean).

    - every transfer has exactly two entries that sum to zero and match its amount;
    - each account's cached balance equals the sum of its entries;
    - no tenant account is negative;
    - total issued equals total held anywhere (all balances sum to zero);
    - every transfer matches the audit event recorded with it (kind, tenant, amount), so a
      transfer rewritten together with its entries and balances still shows: the audit chain
      is keyed, and its events cannot be rewritten to match (verify-audit checks that).
    """
    problems: list[str] = []
    bad_transfers = (
        Transfer.objects.annotate(total=Sum("entries__amount"))
        .exclude(total=0)
        .values_list("pk", "total")[:20]
    )
    for pk, total in bad_transfers:
        problems.append(f"transfer {pk}: entries sum to {total}, not 0")
    for transfer in Transfer.objects.raw(
        "SELECT t.id, t.amount FROM tenants_transfer t "
        "LEFT JOIN tenants_entry e ON e.transfer_id = t.id "
        "GROUP BY t.id, t.amount "
        "HAVING COUNT(e.id) <> 2 OR COALESCE(MAX(e.amount), 0) <> t.amount"
    )[:20]:
        problems.append(
            f"transfer {transfer.pk}: does not have two entries of +/-{transfer.amount}"
        )
    sums = dict(
        Entry.objects.values("account").annotate(s=Sum("amount")).values_list("account", "s")
    )
    total_balance = 0
    for account in Account.objects.select_related("tenant").order_by("pk"):
        total_balance += account.balance
        entries_sum = sums.get(account.pk, 0)
        if entries_sum != account.balance:
            problems.append(
                f"account {account} (id {account.pk}): cached balance {account.balance} "
                f"!= sum of entries {entries_sum}"
            )
        if account.tenant_id is not None and account.balance < 0:
            problems.append(f"account {account} (id {account.pk}) is negative: {account.balance}")
    if total_balance != 0:
        problems.append(
            f"credits created or lost: balances sum to {total_balance}, expected 0 "
            "(issued must equal held)"
        )
    problems.extend(_audit_mismatches())
    return problems


_AUDIT_BATCH = 2000
_AUDIT_REPORT_LIMIT = 20


def _audit_mismatches() -> list[str]:
    """Transfers that do not match their audit event, and audit events whose transfer is gone."""
    problems: list[str] = []
    object_type = Transfer._meta.label_lower
    transfers = Transfer.objects.order_by("pk").values_list("pk", "kind", "tenant_id", "amount")
    batch: list[tuple[int, str, int, int]] = []

    def check(batch: list[tuple[int, str, int, int]]) -> None:
        events = {
            object_id: (action, tenant_id, after)
            for object_id, action, tenant_id, after in AuditEvent.objects.filter(
                object_type=object_type, object_id__in=[str(pk) for pk, *_ in batch]
            ).values_list("object_id", "action", "tenant_id", "after")
        }
        for pk, kind, tenant_id, amount in batch:
            event = events.get(str(pk))
            if event is None:
                problems.append(f"transfer {pk}: no audit event records it")
                continue
            action, event_tenant, after = event
            recorded = after.get("amount") if isinstance(after, dict) else None
            if (action, event_tenant, recorded) != (f"ledger.{kind}", tenant_id, amount):
                problems.append(
                    f"transfer {pk}: {kind} of {amount} for tenant {tenant_id} does not match "
                    f"its audit event ({action} of {recorded} for tenant {event_tenant})"
                )

    for row in transfers.iterator(chunk_size=_AUDIT_BATCH):
        batch.append(row)
        if len(batch) == _AUDIT_BATCH:
            check(batch)
            batch = []
    if batch:
        check(batch)
    transfer_ids = Transfer.objects.annotate(text_id=Cast("pk", CharField())).values("text_id")
    orphans = (
        AuditEvent.objects.filter(object_type=object_type, action__startswith="ledger.")
        .exclude(object_id__in=transfer_ids)
        .values_list("object_id", flat=True)
    )
    for object_id in orphans[:_AUDIT_REPORT_LIMIT]:
        problems.append(f"audit event for transfer {object_id}: the transfer is gone")
    return problems[: _AUDIT_REPORT_LIMIT * 2]
