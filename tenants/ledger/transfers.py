"""One transfer at a time: the routes, the checks, the locks and the records of a transfer,
and the named moves (grant, hold, release, charge, refund) built on ``transfer_execute``."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from django.contrib.auth.models import AbstractBaseUser
from django.db import IntegrityError, transaction
from django.db.models import BigIntegerField, Case, F, Q, Value, When
from django.utils import timezone

import audit.services as audit
from core.money import credits
from tenants.errors import TenantError
from tenants.models import Account, Campaign, Entry, LedgerOperation, Tenant, Transfer

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


def hold_accounts_lock(*, tenant: Tenant) -> None:
    """Lock the accounts a hold moves money between (the tenant's available and escrow
    accounts, in primary-key order as every transfer locks them) until the transaction ends.
    Every transfer that changes what a budget counts as committed locks one of them, so a
    budget checked after this stays as checked until the hold that follows commits: two
    bids of one tenant cannot both pass a check that has room for one."""
    _accounts_locked(tenant=tenant, kind=Transfer.Kind.HOLD)


def _fingerprint(kind: str, tenant: Tenant, amount: int, reference: str) -> str:
    """What an idempotency key is recorded for: a retry must ask for the same."""
    return f"{kind}:{tenant.pk}:{amount}:{reference}"


@dataclass(frozen=True)
class _Outcome:
    transfer: Transfer | None
    refusal: str = ""


def _order_check(*, kind: str, tenant: Tenant, amount: object, campaign: Campaign | None) -> None:
    """TenantError unless a transfer of ``kind`` could be asked for with these arguments."""
    if kind not in _ROUTES:
        raise TenantError(f"unknown transfer kind {kind!r}; expected one of {sorted(_ROUTES)}")
    amount_validate(amount)
    if not isinstance(tenant, Tenant) or tenant.pk is None:
        raise TenantError("transfer needs an existing tenant")
    if campaign is not None and campaign.tenant_id != tenant.pk:
        raise TenantError(f"campaign {campaign.name!r} does not belong to tenant {tenant.slug!r}")


def _earlier(previous: LedgerOperation, *, key: str, fingerprint: str) -> _Outcome:
    """What a key recorded before gives a retry: its transfer, its refusal, or a refusal
    when the key was used for something else."""
    if previous.fingerprint != fingerprint:
        return _Outcome(
            None,
            f"idempotency key {key!r} was already used for a different operation "
            f"({previous.fingerprint}); use a new key",
        )
    if previous.outcome == LedgerOperation.Outcome.REFUSED:
        return _Outcome(None, previous.message)
    return _Outcome(previous.transfer)


def _short(*, kind: str, tenant: Tenant, amount: int, source: Account) -> str:
    """The refusal when ``source`` (a tenant's account) holds less than ``amount``."""
    return (
        f"insufficient credits: {kind} of {credits(amount)} needs {credits(amount)} in "
        f"{tenant.slug}'s {source.kind} account, which holds {credits(source.balance)}"
    )


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
            return _earlier(previous, key=idempotency_key, fingerprint=fingerprint)

    if source.tenant_id is not None and source.balance < amount:
        message = _short(kind=kind, tenant=tenant, amount=amount, source=source)
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
    _transfer_audit(transfer, source=str(source), destination=str(destination))
    return _Outcome(transfer)


def _transfer_audit(transfer: Transfer, *, source: str, destination: str) -> None:
    """The audit event of a transfer (verify-ledger matches each transfer to its own);
    ``source`` and ``destination`` name its accounts (``str`` of each)."""
    audit.record(
        actor=transfer.actor,
        action=f"ledger.{transfer.kind}",
        target=transfer,
        tenant=transfer.tenant,
        after={
            "amount": transfer.amount,
            "from": source,
            "to": destination,
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
    _order_check(kind=kind, tenant=tenant, amount=amount, campaign=campaign)
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
