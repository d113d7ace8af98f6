"""rows_update: each row gets its own values, in one statement per PG_ROWS rows. rows_insert:
the rows bulk_create would write, their keys set, refused whole as a save refuses. rows_copy:
the same rows from plain values, by COPY or by bulk_create, keys back in order. rows_read: the
rows values_list gives, as one array, on PostgreSQL by an array per column where it can."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from django.db import IntegrityError, connection, transaction
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

import core.rows
from audit.models import AuditEvent
from core.rows import rows_copy, rows_insert, rows_read, rows_update
from market.models import Bid, BidLimit
from market.services.bids import bid_place
from tenants.models import Account, Entry, LedgerOperation, Transfer
from tests import factories
from tests.market.marketkit import T0, market_make

pytestmark = pytest.mark.django_db


def test_every_row_gets_its_own_values_and_no_other_row_changes(monkeypatch):
    market = market_make()
    tenant = factories.tenant(credits=10**9)
    user = factories.member(tenant=tenant)
    bids = [
        bid_place(
            user=user,
            tenant=tenant,
            round=market.round,
            now=T0,
            quantity=1,
            limits={"a100": 1000 + i},
        )
        for i in range(5)
    ]
    untouched = bids.pop()
    when = datetime(2030, 1, 1, tzinfo=UTC)
    for i, bid in enumerate(bids):
        bid.status = "lost" if i % 2 else "won"
        bid.outcome_reason = f"reason {i} with 'quotes', commas and {{braces}}"
        bid.updated_at = when + timedelta(minutes=i)
        bid.escrow = i
    monkeypatch.setattr(core.rows, "PG_ROWS", 3)  # two statements for four rows
    with CaptureQueriesContext(connection) as captured:
        rows_update(bids, ["status", "outcome_reason", "updated_at", "escrow"])
    assert len(captured.captured_queries) == 2
    for i, bid in enumerate(bids):
        row = Bid.objects.get(pk=bid.pk)
        assert (row.status, row.outcome_reason, row.updated_at, row.escrow) == (
            bid.status,
            bid.outcome_reason,
            bid.updated_at,
            i,
        )
    row = Bid.objects.get(pk=untouched.pk)
    assert (row.status, row.escrow) == ("open", untouched.escrow)


# Text that COPY's format must carry through: its separators, escapes and NULL marker.
AWKWARD = "tab\there, newline\nthere, back\\slash, \\N, quote ' and \" and é"


def _transfers(tenant, n: int, tag: str) -> list[Transfer]:
    main, held = Account.objects.filter(tenant=tenant).order_by("pk")[:2]
    when = datetime(2030, 1, 2, 3, 4, 5, 678_000, tzinfo=UTC)
    return [
        Transfer(
            kind=Transfer.Kind.HOLD,
            tenant=tenant,
            amount=1_000 + i,
            source=main,
            destination=held,
            reference=f"{tag}:{i}",
            reason=AWKWARD if i % 2 else "",
            created_at=when + timedelta(seconds=i),
        )
        for i in range(n)
    ]


def _events(n: int, tag: str) -> list[AuditEvent]:
    when = datetime(2030, 1, 2, tzinfo=UTC)
    return [
        AuditEvent(
            seq=10_000 + i + (0 if tag == "a" else 100),
            created_at=when,
            actor_label=AWKWARD,
            action="test.copy",
            object_id=str(i),
            before=None if i % 2 else {"text": AWKWARD, "n": [1, 2.5, None, True]},
            after=[AWKWARD, {"nested": {"deep": i}}],
            prev_hash=f"{tag}{i:063d}",
            key_id="k",
            hash=f"{tag}{i:063x}",
        )
        for i in range(n)
    ]


def _row(obj, skip=("id", "created_at", "reference", "transfer_id", "seq", "hash", "prev_hash")):
    return {
        f.attname: getattr(obj, f.attname)
        for f in obj._meta.concrete_fields
        if f.attname not in skip
    }


def test_rows_insert_writes_the_rows_bulk_create_writes_and_sets_their_keys(monkeypatch):
    monkeypatch.setattr(core.rows, "COPY_FROM_ROWS", 1)  # COPY even for a few rows
    tenant = factories.tenant(credits=10**6)
    by_bulk, by_copy = _transfers(tenant, 4, "bulk"), _transfers(tenant, 4, "copy")
    Transfer.objects.bulk_create(by_bulk)
    rows_insert(by_copy)
    keys = [t.pk for t in by_copy]
    assert keys == sorted(keys) and min(keys) > max(t.pk for t in by_bulk)
    assert all(not t._state.adding and t._state.db == "default" for t in by_copy)
    for bulk, copied in zip(by_bulk, by_copy, strict=True):
        a, b = Transfer.objects.get(pk=bulk.pk), Transfer.objects.get(pk=copied.pk)
        assert _row(a) == _row(b) == _row(copied)
        assert b.created_at == copied.created_at and b.reference == copied.reference

    # A related row assigned before it had its key gets the key (as a save does), and a
    # field Django fills on insert (auto_now_add) is filled.
    later = _transfers(tenant, 2, "later")
    ops = [
        LedgerOperation(key=f"k{i}", fingerprint="f", outcome="applied", transfer=t)
        for i, t in enumerate(later)
    ]
    rows_insert(later)
    rows_insert(ops)
    for op, t in zip(ops, later, strict=True):
        row = LedgerOperation.objects.get(pk=op.pk)
        assert row.transfer_id == t.pk and row.created_at is not None

    events_bulk, events_copy = _events(3, "a"), _events(3, "b")
    AuditEvent.objects.bulk_create(events_bulk)
    rows_insert(events_copy)
    for bulk, copied in zip(events_bulk, events_copy, strict=True):
        assert _row(AuditEvent.objects.get(pk=bulk.pk)) == _row(
            AuditEvent.objects.get(pk=copied.pk)
        )


def test_rows_insert_refuses_an_unsaved_related_row_and_a_bad_row_writes_nothing(monkeypatch):
    monkeypatch.setattr(core.rows, "COPY_FROM_ROWS", 1)
    tenant = factories.tenant(credits=10**6)
    unsaved = _transfers(tenant, 1, "unsaved")[0]
    with pytest.raises(ValueError, match="transfer of a tenants.LedgerOperation row"):
        rows_insert(
            [LedgerOperation(key="x", fingerprint="f", outcome="applied", transfer=unsaved)]
        )
    with pytest.raises(ValueError, match="already has its primary key"):
        rows_insert([_saved(tenant)])

    transfers = _transfers(tenant, 1, "bad")
    rows_insert(transfers)
    account = Account.objects.filter(tenant=tenant).first()
    before = Entry.objects.count()
    # The database's own check (no entry of 0) refuses the third row: Django's error, and
    # the rows before it are not left behind.
    entries = [
        Entry(transfer=transfers[0], account=account, amount=amount) for amount in (5, -5, 0)
    ]
    with pytest.raises(IntegrityError), transaction.atomic():
        rows_insert(entries)
    assert Entry.objects.count() == before


def _saved(tenant) -> Transfer:
    transfer = _transfers(tenant, 1, "saved")[0]
    transfer.save()
    return transfer


@pytest.mark.parametrize("copy_from", [1, 10**9], ids=["copy", "bulk_create"])
def test_rows_copy_writes_from_values_what_rows_insert_writes_from_objects(monkeypatch, copy_from):
    monkeypatch.setattr(core.rows, "COPY_FROM_ROWS", copy_from)
    tenant = factories.tenant(credits=10**6)
    objects = _transfers(tenant, 4, "objects")
    rows_insert(objects)
    names = ("kind", "tenant", "amount", "source", "destination", "reference", "reason")
    names += ("created_at",)
    values = [
        tuple(getattr(t, t._meta.get_field(name).attname) for name in names)
        for t in _transfers(tenant, 4, "values")
    ]
    keys = rows_copy(Transfer, names, values)
    assert keys == sorted(keys) and min(keys) > max(t.pk for t in objects)
    for obj, key in zip(objects, keys, strict=True):
        # campaign and actor, left out, are written as their defaults (NULL)
        a, b = Transfer.objects.get(pk=obj.pk), Transfer.objects.get(pk=key)
        assert _row(a) == _row(b) and b.campaign_id is None and b.actor_id is None
        assert b.created_at == a.created_at and b.reason == a.reason
    # A field left out takes its default ("" for the message); a time Django sets on
    # insert is the time of the call, on every backend alike, and may not be given.
    start = timezone.now()
    (op,) = rows_copy(
        LedgerOperation,
        ("key", "fingerprint", "outcome", "transfer"),
        [("k-values", "f", LedgerOperation.Outcome.APPLIED, keys[0])],
    )
    row = LedgerOperation.objects.get(pk=op)
    assert (row.key, row.outcome, row.message, row.transfer_id) == (
        "k-values",
        "applied",
        "",
        keys[0],
    )
    assert start <= row.created_at <= timezone.now()
    with pytest.raises(ValueError, match="LedgerOperation.created_at is set on insert"):
        rows_copy(
            LedgerOperation,
            ("key", "fingerprint", "outcome", "created_at"),
            [("k2", "f", "applied", start)],
        )
    assert rows_copy(Entry, ("transfer", "account", "amount"), []) == []
    # A row the database refuses (an entry of 0) leaves none of the batch behind.
    account = Account.objects.filter(tenant=tenant).first()
    before = Entry.objects.count()
    with pytest.raises(IntegrityError), transaction.atomic():
        rows_copy(
            Entry,
            ("transfer", "account", "amount"),
            [(keys[0], account.pk, amount) for amount in (5, -5, 0)],
        )
    assert Entry.objects.count() == before


def _limits_placed(n: int = 4) -> None:
    market = market_make()
    tenant = factories.tenant(credits=10**9)
    user = factories.member(tenant=tenant)
    for i in range(n):
        bid_place(
            user=user,
            tenant=tenant,
            round=market.round,
            now=T0,
            quantity=1 + i,
            limits={"a100": 1000 + i, "h100": 2000 + 3 * i},
        )


def test_rows_read_gives_the_rows_values_list_gives_in_one_array():
    _limits_placed()
    qs = (
        BidLimit.objects.filter(price__gt=1001)
        .order_by("-price")
        .values_list("bid_id", "tier_id", "price")
    )
    with CaptureQueriesContext(connection) as captured:
        got = rows_read(qs)
    assert len(captured.captured_queries) == 1
    assert got.dtype.name == "int64" and got.shape == (6, 3)
    assert got.tolist() == [list(row) for row in qs]
    assert rows_read(qs.filter(price__gt=10**6)).shape == (0, 3)


def test_rows_read_by_first_column_or_unordered_comes_as_column_arrays_with_the_same_rows():
    _limits_placed()
    by_bid = BidLimit.objects.order_by("bid_id").values_list("bid_id", "tier_id", "price")
    unordered = BidLimit.objects.values_list("bid_id", "tier_id", "price")
    for qs, ordered in ((by_bid, True), (unordered, False)):
        with CaptureQueriesContext(connection) as captured:
            got = rows_read(qs)
        assert len(captured.captured_queries) == 1
        assert "array_agg" in captured.captured_queries[0]["sql"]
        assert got.dtype.name == "int64" and got.shape == (8, 3)
        want = [list(row) for row in qs]
        if ordered:
            assert got[:, 0].tolist() == [row[0] for row in want]
        assert sorted(got.tolist()) == sorted(want)
    bids = Bid.objects.order_by("pk").values_list("pk", "quantity")
    assert rows_read(bids).tolist() == [list(row) for row in bids]
    assert rows_read(unordered.filter(price__gt=10**6)).shape == (0, 3)


def test_column_arrays_are_put_in_their_first_columns_order_where_asked_and_refuse_a_null():
    _limits_placed()
    # Rows given out of their first column's order: sorted by it, equal keys in given order.
    sql = "SELECT tier_id, price FROM market_bidlimit ORDER BY tier_id DESC, price DESC"
    got = core.rows._read_columns(connection, sql, [], width=2, sort=True)
    given = BidLimit.objects.order_by("-tier_id", "-price").values_list("tier_id", "price")
    assert got.tolist() == sorted(([t, p] for t, p in given), key=lambda row: row[0])
    assert got.tolist() != [[t, p] for t, p in given]
    unsorted = core.rows._read_columns(connection, sql, [], width=2, sort=False)
    assert unsorted.tolist() == [[t, p] for t, p in given]
    with pytest.raises(ValueError, match="column 1 holds a NULL"):
        core.rows._read_columns(connection, "SELECT 1, NULL::bigint", [], width=2, sort=False)
