"""Ledger services: transfers, refusals, idempotency, and the invariants verify-ledger checks."""

from __future__ import annotations

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import transaction
from django.db.models import F
from django.utils import timezone

import audit.services as audit
from tenants.errors import TenantError
from tenants.ledger import (
    MAX_AMOUNT,
    balance_get,
    credits_charge,
    credits_grant,
    credits_hold,
    credits_refund,
    credits_release,
    ledger_verify,
)
from tenants.models import Account, Entry, LedgerOperation, Transfer
from tests import factories

pytestmark = pytest.mark.django_db


def test_grant_hold_charge_release_refund_move_exactly_their_amounts():
    t = factories.tenant()
    credits_grant(tenant=t, amount=10_000, reason="start", actor=None)
    credits_hold(tenant=t, amount=4_000, reference="bid:1")
    credits_charge(tenant=t, amount=2_500, reference="bid:1")
    credits_release(tenant=t, amount=1_500, reference="bid:1")
    credits_refund(tenant=t, amount=500, reference="round:1")
    balance = balance_get(tenant=t)
    assert (balance.available, balance.escrow) == (10_000 - 4_000 + 1_500 + 500, 0)
    revenue = Account.objects.get(tenant__isnull=True, kind="revenue")
    assert revenue.balance == 2_000
    assert ledger_verify() == []
    for transfer in Transfer.objects.all():
        amounts = sorted(transfer.entries.values_list("amount", flat=True))
        assert amounts == [-transfer.amount, transfer.amount]


@pytest.mark.parametrize(
    ("amount", "fragment"),
    [
        (0, "must be positive"),
        (-5, "must be positive"),
        (1.5, "whole number"),
        ("100", "whole number"),
        (True, "whole number"),
        (MAX_AMOUNT + 1, "larger than the limit"),
    ],
)
def test_bad_amounts_are_refused_and_nothing_is_written(amount, fragment):
    t = factories.tenant(credits=1_000)
    before = (Transfer.objects.count(), Entry.objects.count())
    with pytest.raises(TenantError, match=fragment):
        credits_hold(tenant=t, amount=amount)
    assert (Transfer.objects.count(), Entry.objects.count()) == before


def test_overdraft_is_refused_with_the_numbers_and_nothing_moves():
    t = factories.tenant(credits=1_000)
    with pytest.raises(TenantError, match=r"insufficient credits.*holds 1\.000"):
        credits_hold(tenant=t, amount=1_001)
    assert balance_get(tenant=t).available == 1_000
    assert ledger_verify() == []


def test_grant_needs_a_reason():
    t = factories.tenant()
    with pytest.raises(TenantError, match="reason"):
        credits_grant(tenant=t, amount=5, reason="  ", actor=None)


def test_retry_with_same_key_returns_first_transfer_and_moves_nothing_twice():
    t = factories.tenant(credits=1_000)
    first = credits_hold(tenant=t, amount=300, idempotency_key="k1", reference="bid:9")
    again = credits_hold(tenant=t, amount=300, idempotency_key="k1", reference="bid:9")
    assert again.pk == first.pk
    assert balance_get(tenant=t).escrow == 300


def test_retry_of_a_refusal_returns_the_same_refusal_even_after_funds_arrive():
    t = factories.tenant(credits=100)
    with pytest.raises(TenantError) as first:
        credits_hold(tenant=t, amount=500, idempotency_key="k2")
    credits_grant(tenant=t, amount=1_000, reason="top up", actor=None)
    with pytest.raises(TenantError) as second:
        credits_hold(tenant=t, amount=500, idempotency_key="k2")
    assert str(second.value) == str(first.value)
    assert balance_get(tenant=t).escrow == 0
    assert LedgerOperation.objects.get(key="k2").outcome == "refused"


def test_key_reused_for_another_operation_is_refused():
    t = factories.tenant(credits=1_000)
    credits_hold(tenant=t, amount=100, idempotency_key="k3")
    with pytest.raises(TenantError, match="different operation"):
        credits_hold(tenant=t, amount=200, idempotency_key="k3")


def test_verify_ledger_command_names_a_tampered_balance_and_a_lost_entry():
    t = factories.tenant(credits=1_000)
    call_command("verify_ledger")  # clean
    Account.objects.filter(tenant=t, kind="available").update(balance=5_000)
    with pytest.raises(CommandError) as exc:
        call_command("verify_ledger")
    message = str(exc.value)
    assert "cached balance 5000 != sum of entries 1000" in message
    assert "credits created or lost" in message


def test_verify_ledger_finds_an_unbalanced_transfer():
    t = factories.tenant(credits=1_000)
    entry = Entry.objects.filter(transfer__tenant=t, amount__gt=0).get()
    Entry.objects.filter(pk=entry.pk).update(amount=999)
    problems = ledger_verify()
    assert any("entries sum to -1, not 0" in p for p in problems)


def test_verify_ledger_names_a_transfer_without_its_audit_event_and_an_event_without_its_transfer():
    t = factories.tenant(credits=1_000)
    source = Account.objects.get(tenant=t, kind="available")
    destination = Account.objects.get(tenant=t, kind="escrow")
    # Written behind the ledger's back: a transfer (entries and balances right) no event records.
    with transaction.atomic():
        unrecorded = Transfer.objects.create(
            kind="hold",
            tenant=t,
            amount=10,
            source=source,
            destination=destination,
            created_at=timezone.now(),
        )
        Entry.objects.bulk_create(
            [
                Entry(transfer=unrecorded, account=source, amount=-10),
                Entry(transfer=unrecorded, account=destination, amount=10),
            ]
        )
        Account.objects.filter(pk=source.pk).update(balance=F("balance") - 10)
        Account.objects.filter(pk=destination.pk).update(balance=F("balance") + 10)
        # and an event for a transfer that does not exist
        audit.record(
            actor=None,
            action="ledger.hold",
            object_type=Transfer._meta.label_lower,
            object_id=unrecorded.pk + 1000,
            tenant=t,
            after={"amount": 5},
        )
    problems = ledger_verify()
    assert f"transfer {unrecorded.pk}: no audit event records it" in problems
    assert f"audit event for transfer {unrecorded.pk + 1000}: the transfer is gone" in problems
    assert len(problems) == 2
