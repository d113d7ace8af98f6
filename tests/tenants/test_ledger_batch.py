"""transfer_execute_many: a batch of transfers gives what the same transfers one by one give,
or refuses whole, with the same messages, and writes nothing then."""

from __future__ import annotations

import pytest

from audit.models import AuditEvent
from tenants.errors import TenantError
from tenants.ledger import (
    TransferOrder,
    balance_get,
    credits_hold,
    ledger_verify,
    transfer_execute,
    transfer_execute_many,
)
from tenants.models import Entry, LedgerOperation, Transfer
from tests import factories

pytestmark = pytest.mark.django_db


def _orders(a, b, tag: str = "") -> list[TransferOrder]:
    """Holds, then charges, releases and a refund across two tenants: later orders spend
    what earlier ones moved (b's charge needs its hold first)."""
    return [
        TransferOrder(
            kind="hold", tenant=a, amount=4_000, reference="bid:1", idempotency_key=f"{tag}h1"
        ),
        TransferOrder(kind="hold", tenant=b, amount=700, reference="bid:2"),
        TransferOrder(kind="charge", tenant=a, amount=2_500, reference="bid:1", reason="won"),
        TransferOrder(
            kind="charge", tenant=b, amount=700, reference="bid:2", idempotency_key=f"{tag}c2"
        ),
        TransferOrder(kind="release", tenant=a, amount=1_500, reference="bid:1"),
        TransferOrder(kind="refund", tenant=b, amount=200, reference="round:1", reason="void"),
    ]


def test_a_batch_moves_what_the_same_transfers_one_by_one_move():
    one = (
        factories.tenant(name="One A", credits=10_000),
        factories.tenant(name="One B", credits=1_000),
    )
    for order in _orders(*one, tag="one-"):
        transfer_execute(**vars(order))
    many = (
        factories.tenant(name="Many A", credits=10_000),
        factories.tenant(name="Many B", credits=1_000),
    )
    transfers = transfer_execute_many(orders=_orders(*many, tag="many-"))

    assert [(t.kind, t.tenant.name, t.amount) for t in transfers] == [
        (o.kind, o.tenant.name, o.amount) for o in _orders(*many)
    ]
    for x, y in zip(one, many, strict=True):
        assert balance_get(tenant=x) == balance_get(tenant=y)
    # The same events, in the same order, with the same content, but for the names.
    events = list(
        AuditEvent.objects.filter(action__startswith="ledger.")
        .exclude(action="ledger.grant")
        .order_by("seq")
        .values_list("action", "after")
    )
    first, second = events[: len(events) // 2], events[len(events) // 2 :]
    assert len(first) == len(second) == 6
    for (action_1, after_1), (action_2, after_2) in zip(first, second, strict=True):
        assert action_1 == action_2
        for key in ("amount", "reference", "reason", "campaign"):
            assert after_1[key] == after_2[key]
        for key in ("from", "to"):  # tenant:kind or platform:kind
            assert after_1[key].split(":")[1] == after_2[key].split(":")[1]
    assert LedgerOperation.objects.filter(key__in=["many-h1", "many-c2"]).count() == 2
    assert ledger_verify() == []


def test_a_batch_written_in_slices_writes_what_it_writes_at_once(monkeypatch):
    import tenants.ledger.batch as batch

    whole = (
        factories.tenant(name="Whole A", credits=10_000),
        factories.tenant(name="Whole B", credits=1_000),
    )
    transfer_execute_many(orders=_orders(*whole, tag="whole-"))
    monkeypatch.setattr(batch, "WRITE_SLICE", 4)  # six transfers: two slices
    sliced = (
        factories.tenant(name="Sliced A", credits=10_000),
        factories.tenant(name="Sliced B", credits=1_000),
    )
    transfers = transfer_execute_many(orders=_orders(*sliced, tag="sliced-"))

    assert [t.amount for t in transfers] == [o.amount for o in _orders(*sliced)]
    assert [t.pk for t in transfers] == sorted(t.pk for t in transfers)
    for x, y in zip(whole, sliced, strict=True):
        assert balance_get(tenant=x) == balance_get(tenant=y)
        assert (
            Entry.objects.filter(transfer__tenant=x).count()
            == Entry.objects.filter(transfer__tenant=y).count()
        )
    # One event per transfer, in the orders' order, each naming its own transfer.
    events = list(
        AuditEvent.objects.filter(action__startswith="ledger.", tenant__in=sliced)
        .exclude(action="ledger.grant")
        .order_by("seq")
        .values_list("object_id", flat=True)
    )
    assert events == [str(t.pk) for t in transfers]
    assert LedgerOperation.objects.filter(key__in=["sliced-h1", "sliced-c2"]).count() == 2
    assert ledger_verify() == []


def test_an_overdraft_anywhere_in_the_batch_refuses_all_of_it_with_the_numbers():
    a = factories.tenant(credits=10_000)
    b = factories.tenant(credits=500)  # short of its 700 hold
    before = (Transfer.objects.count(), Entry.objects.count(), AuditEvent.objects.count())
    with pytest.raises(TenantError, match=r"insufficient credits: hold of 0\.700.*holds 0\.500"):
        transfer_execute_many(orders=_orders(a, b))
    after = (Transfer.objects.count(), Entry.objects.count(), AuditEvent.objects.count())
    assert after == before
    assert balance_get(tenant=a).available == 10_000
    assert not LedgerOperation.objects.filter(key="h1").exists()
    assert ledger_verify() == []


def test_a_key_applied_before_returns_its_transfer_and_moves_nothing_again():
    a = factories.tenant(credits=10_000)
    first = credits_hold(tenant=a, amount=4_000, reference="bid:1", idempotency_key="h1")
    orders = [
        TransferOrder(kind="hold", tenant=a, amount=4_000, reference="bid:1", idempotency_key="h1"),
        TransferOrder(kind="hold", tenant=a, amount=1_000, reference="bid:3", idempotency_key="h3"),
    ]
    again, new = transfer_execute_many(orders=orders)
    assert again.pk == first.pk and new.pk != first.pk
    assert balance_get(tenant=a).escrow == 5_000
    # the whole batch retried: nothing moves
    assert [t.pk for t in transfer_execute_many(orders=orders)] == [first.pk, new.pk]
    assert balance_get(tenant=a).escrow == 5_000
    assert ledger_verify() == []


@pytest.mark.parametrize(
    ("order", "fragment"),
    [
        (dict(kind="hold", amount=999, idempotency_key="h1"), "different operation"),
        (dict(kind="gift", amount=5), "unknown transfer kind 'gift'"),
        (dict(kind="hold", amount=0), "must be positive"),
        (dict(kind="hold", amount=2.5), "whole number"),
    ],
)
def test_a_bad_order_refuses_the_batch_and_nothing_is_written(order, fragment):
    a = factories.tenant(credits=10_000)
    credits_hold(tenant=a, amount=4_000, reference="bid:1", idempotency_key="h1")
    before = (Transfer.objects.count(), AuditEvent.objects.count(), balance_get(tenant=a))
    orders = [
        TransferOrder(kind="hold", tenant=a, amount=100, reference="bid:5"),
        TransferOrder(tenant=a, reference="bid:1", **order),
    ]
    with pytest.raises(TenantError, match=fragment):
        transfer_execute_many(orders=orders)
    assert (Transfer.objects.count(), AuditEvent.objects.count(), balance_get(tenant=a)) == before


def test_one_key_twice_in_a_batch_is_refused():
    a = factories.tenant(credits=10_000)
    orders = [
        TransferOrder(kind="hold", tenant=a, amount=100, idempotency_key="k"),
        TransferOrder(kind="hold", tenant=a, amount=100, idempotency_key="k"),
    ]
    with pytest.raises(TenantError, match="used twice"):
        transfer_execute_many(orders=orders)
    assert balance_get(tenant=a).escrow == 0
