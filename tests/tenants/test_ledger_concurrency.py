"""Concurrent spending of one balance on PostgreSQL, each thread on its own connection."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import pytest
from django.db import connection, connections, transaction

from tenants.errors import TenantError
from tenants.ledger import balance_get, credits_hold, ledger_verify
from tenants.models import Account, Entry, Transfer
from tests import factories

pytestmark = pytest.mark.django_db(transaction=True)

ATTEMPTS = 50
PRICE = 1_000
AFFORDABLE = 10


def _race(worker, attempts: int = ATTEMPTS) -> list[str]:
    """Run ``worker`` in ``attempts`` threads released together; collect their outcomes."""
    barrier = threading.Barrier(attempts)

    def run(i: int) -> str:
        try:
            barrier.wait()
            return worker(i)
        finally:
            connections.close_all()  # each thread had its own connection

    with ThreadPoolExecutor(max_workers=attempts) as pool:
        return list(pool.map(run, range(attempts)))


def test_fifty_concurrent_holds_on_a_balance_for_ten_exactly_ten_succeed():
    assert connection.vendor == "postgresql"
    tenant = factories.tenant(credits=PRICE * AFFORDABLE)

    def hold(i: int) -> str:
        try:
            credits_hold(tenant=tenant, amount=PRICE, reference=f"race:{i}")
            return "ok"
        except TenantError as exc:
            assert "insufficient credits" in str(exc)
            return "refused"

    outcomes = _race(hold)
    assert outcomes.count("ok") == AFFORDABLE
    assert outcomes.count("refused") == ATTEMPTS - AFFORDABLE
    balance = balance_get(tenant=tenant)
    assert (balance.available, balance.escrow) == (0, PRICE * AFFORDABLE)
    assert ledger_verify() == []


def _naive_hold(*, tenant, amount: int, barrier: threading.Barrier) -> None:
    """The bug the real service avoids: check the balance without a lock, then write."""
    source = Account.objects.get(tenant=tenant, kind="available")
    destination = Account.objects.get(tenant=tenant, kind="escrow")
    barrier.wait()  # everyone has read the same balance before anyone writes
    if source.balance < amount:
        raise TenantError("insufficient")
    with transaction.atomic():
        transfer = Transfer.objects.create(
            kind="hold",
            tenant=tenant,
            amount=amount,
            source=source,
            destination=destination,
            created_at=source.tenant.created_at,
        )
        Entry.objects.create(transfer=transfer, account=source, amount=-amount)
        Entry.objects.create(transfer=transfer, account=destination, amount=amount)
        source.balance -= amount
        destination.balance += amount
        source.save(update_fields=["balance"])
        destination.save(update_fields=["balance"])


def test_the_race_test_catches_a_naive_unlocked_hold():
    """Proves the test above can fail: without locks, far more than ten holds succeed and the
    cached balances no longer match the entries."""
    tenant = factories.tenant(credits=PRICE * AFFORDABLE)
    attempts = 20
    barrier = threading.Barrier(attempts)

    def hold(i: int) -> str:
        try:
            _naive_hold(tenant=tenant, amount=PRICE, barrier=barrier)
            return "ok"
        except TenantError:
            return "refused"

    outcomes = _race(hold, attempts=attempts)
    assert outcomes.count("ok") > AFFORDABLE
    assert any("cached balance" in p for p in ledger_verify())
