"""Reading the ledger: a tenant's balance, and every invariant ``verify-ledger`` checks."""

from __future__ import annotations

from dataclasses import dataclass

from django.db.models import CharField, Exists, OuterRef, Sum
from django.db.models.functions import Cast

from audit.models import AuditEvent
from tenants.models import Account, Entry, Tenant, Transfer

Kind = Account.Kind


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
    # NOT EXISTS, which PostgreSQL runs as a hash anti-join. NOT IN (the list of ids) was
    # searched row by row once the list outgrew work_mem: at 1.5 million transfers it had
    # not finished after minutes.
    recorded = Transfer.objects.annotate(text_id=Cast("pk", CharField())).filter(
        text_id=OuterRef("object_id")
    )
    orphans = (
        AuditEvent.objects.filter(object_type=object_type, action__startswith="ledger.")
        .filter(~Exists(recorded))
        .values_list("object_id", flat=True)
    )
    for object_id in orphans[:_AUDIT_REPORT_LIMIT]:
        problems.append(f"audit event for transfer {object_id}: the transfer is gone")
    return problems[: _AUDIT_REPORT_LIMIT * 2]
