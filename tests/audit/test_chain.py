"""The audit log's hash chain: every kind of tampering is detected and the first bad event named."""

from __future__ import annotations

import threading
import time

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import DatabaseError, IntegrityError, connection, transaction

import audit.services as audit
from audit.checkpoints import checkpoint_write
from audit.models import AuditEvent
from audit.selectors import chain_verify
from tests.audit import chainkit

pytestmark = pytest.mark.django_db


def _raw(sql: str, params: list) -> None:
    chainkit.as_owner((sql, params))


def test_intact_chain_verifies_and_links_each_event_to_the_previous(settings, tmp_path):
    settings.GPUMARKET_AUDIT_CHECKPOINT_PATH = str(tmp_path / "checkpoints.jsonl")
    events = chainkit.events()
    report = chain_verify()
    assert report.ok and report.checked >= len(events)
    for previous, event in zip(events, events[1:], strict=False):
        assert event.prev_hash == previous.hash and event.seq == previous.seq + 1
    checkpoint_write()  # verify-audit needs a checkpoint to vouch for the tail
    call_command("verify_audit")


@pytest.mark.django_db(transaction=True)
def test_record_outside_a_transaction_is_refused():
    with pytest.raises(audit.AuditError, match="inside the transaction"):
        audit.record(actor="test", action="x")


def test_update_and_delete_are_refused_by_the_database():
    event = chainkit.events(1)[0]
    with pytest.raises(DatabaseError, match="append-only"), transaction.atomic():
        AuditEvent.objects.filter(pk=event.pk).update(action="forged")
    with pytest.raises(DatabaseError, match="append-only"), transaction.atomic():
        AuditEvent.objects.filter(pk=event.pk).delete()


def test_edited_event_is_detected_and_named():
    events = chainkit.events()
    _raw(
        "UPDATE audit_auditevent SET after = %s WHERE id = %s",
        ['{"i": 2, "amount": 1}', events[2].pk],
    )
    report = chain_verify()
    assert not report.ok
    assert report.first_bad_seq == events[2].seq
    assert "edited" in report.problem
    with pytest.raises(CommandError, match=f"seq={events[2].seq}"):
        call_command("verify_audit")


def test_deleted_event_is_detected_and_named():
    events = chainkit.events()
    _raw("DELETE FROM audit_auditevent WHERE id = %s", [events[1].pk])
    report = chain_verify()
    assert not report.ok
    # The event after the gap is the first that no longer fits.
    assert report.first_bad_seq == events[2].seq
    assert "deleted" in report.problem


def test_reordered_events_are_detected_and_named():
    events = chainkit.events()
    a, b = events[1], events[3]
    # Swap the two rows' positions in the table (their ids), leaving each row's content intact.
    _raw("UPDATE audit_auditevent SET id = -id WHERE id = %s", [a.pk])
    _raw("UPDATE audit_auditevent SET id = %s WHERE id = %s", [a.pk, b.pk])
    _raw("UPDATE audit_auditevent SET id = %s WHERE id = %s", [b.pk, -a.pk])
    report = chain_verify()
    assert not report.ok
    assert report.first_bad_id == a.pk  # the slot where event 1 was now holds event 3
    assert report.first_bad_seq == b.seq
    assert "reordered" in report.problem or "deleted" in report.problem


def test_inserted_event_is_detected_and_named():
    events = chainkit.events()
    forged = events[2]
    # A forged copy of a real event, placed at the end with a plausible seq.
    _raw(
        "INSERT INTO audit_auditevent (seq, created_at, actor_label, action, object_type, object_id,"
        " before, after, prev_hash, hash, key_id) VALUES (%s, now(), 'intruder', 'ledger.grant',"
        " 'x', '1', NULL, '{}'::jsonb, %s, %s, %s)",
        [AuditEvent.objects.order_by("-seq").first().seq + 1, events[-1].hash, "f" * 64, "test"],
    )
    report = chain_verify()
    assert not report.ok
    assert report.first_bad_seq == forged.seq + len(events) - 2
    assert "edited" in report.problem or "link" in report.problem


def test_a_batch_appends_its_events_in_one_go_in_the_order_recorded(django_assert_num_queries):
    before = chainkit.events(2)
    with transaction.atomic():
        # The test's savepoint pair, then the chain's lock and head (one call) and one INSERT.
        with django_assert_num_queries(4), transaction.atomic(), audit.batch():
            for i in range(3):
                audit.record(actor="test", action="test.batched", object_id=i, after={"i": i})
    batched = list(AuditEvent.objects.filter(action="test.batched").order_by("seq"))
    assert [e.object_id for e in batched] == ["0", "1", "2"]
    assert [e.seq for e in batched] == [before[-1].seq + 1, before[-1].seq + 2, before[-1].seq + 3]
    assert batched[0].prev_hash == before[-1].hash
    assert chain_verify().ok


def test_a_batch_that_raises_appends_nothing():
    chainkit.events(1)
    count = AuditEvent.objects.count()
    with pytest.raises(RuntimeError), transaction.atomic(), audit.batch():
        audit.record(actor="test", action="test.batched")
        raise RuntimeError("the change failed")
    assert AuditEvent.objects.count() == count
    assert chain_verify().ok


def test_an_event_under_a_savepoint_that_rolls_back_inside_a_batch_is_not_appended():
    with transaction.atomic(), audit.batch():
        audit.record(actor="test", action="test.kept", object_id=1)
        try:
            with transaction.atomic():
                audit.record(actor="test", action="test.undone")
                raise RuntimeError("this part failed and was caught")
        except RuntimeError:
            pass
        audit.record(actor="test", action="test.kept", object_id=2)
    assert list(AuditEvent.objects.order_by("seq").values_list("action", flat=True)) == [
        "test.kept",
        "test.kept",
    ]
    assert chain_verify().ok


@pytest.mark.django_db(transaction=True)
def test_batch_outside_a_transaction_is_refused():
    with pytest.raises(audit.AuditError, match="inside the transaction"), audit.batch():
        pass


@pytest.mark.django_db(transaction=True)
def test_an_append_that_waited_for_the_chain_lock_chains_onto_what_its_holder_appended():
    """Two appends from two connections: the second waits for the chain's lock while the first
    holds it, and once the first commits it must read the head that commit left."""
    appended, release = threading.Event(), threading.Event()
    recorded: dict[str, AuditEvent] = {}
    failures: list[BaseException] = []

    def append(name: str, hold: bool) -> None:
        try:
            with transaction.atomic():
                recorded[name] = audit.record(actor="test", action=f"test.{name}")
                if hold:
                    appended.set()
                    release.wait(timeout=30)
        except BaseException as exc:  # reported by the main thread
            failures.append(exc)
        finally:
            connection.close()

    first = threading.Thread(target=append, args=("first", True))
    first.start()
    assert appended.wait(timeout=30)
    second = threading.Thread(target=append, args=("second", False))
    second.start()
    try:
        deadline = time.monotonic() + 30
        while not _waiting_for_an_advisory_lock() and time.monotonic() < deadline:
            time.sleep(0.01)
        assert _waiting_for_an_advisory_lock(), "the second append never waited for the lock"
    finally:
        release.set()
        first.join(timeout=30)
        second.join(timeout=30)
    assert failures == []
    assert recorded["second"].seq == recorded["first"].seq + 1
    assert recorded["second"].prev_hash == recorded["first"].hash
    assert chain_verify().ok


def test_a_broken_foreign_key_is_refused_before_the_chain_lock_is_taken():
    """The transaction's deferred foreign-key checks run before the chain's lock is taken, not
    at COMMIT under it: a batch of thousands of rows then holds the lock, which every audited
    write waits for, only for its events (bench/orders_open.py --probe). A broken key is
    refused by the append, before the lock."""
    with pytest.raises(IntegrityError, match="foreign key"), transaction.atomic():
        with connection.cursor() as cursor:
            cursor.execute(
                "INSERT INTO tenants_entry (transfer_id, account_id, amount) VALUES (%s, %s, 5)",
                [10**12, 10**12],
            )
        audit.record(actor="test", action="test.broken")
        pytest.fail("the append went ahead with a foreign-key check pending")
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND granted")
        assert cursor.fetchone()[0] == 0


def _waiting_for_an_advisory_lock() -> bool:
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted")
        return cursor.fetchone()[0] > 0


def test_a_recorded_event_has_every_field_and_reads_back_as_recorded():
    with transaction.atomic(), audit.batch():
        event = audit.record(
            actor="test",
            action="test.fields",
            object_type="x.y",
            object_id=7,
            before={"b": [1, "é"]},
            after={"a": 1},
        )
    fields = [f.attname for f in AuditEvent._meta.concrete_fields]
    assert set(fields) <= set(vars(event))
    stored = AuditEvent.objects.get(pk=event.pk)
    assert [getattr(stored, f) for f in fields] == [getattr(event, f) for f in fields]
    assert (stored.object_id, stored.before, stored.tenant_id) == ("7", {"b": [1, "é"]}, None)
    assert chain_verify().ok


def test_a_batch_large_enough_for_copy_reads_back_as_recorded():
    from core.rows import COPY_FROM_ROWS

    with transaction.atomic(), audit.batch():
        recorded = [
            audit.record(
                actor="test",
                action="test.copied",
                object_id=i,
                before=None if i % 2 else {"i": i, "name": "é\t\\n"},
                after=[i, None, {"b": True}],
            )
            for i in range(COPY_FROM_ROWS + 5)
        ]
    fields = [f.attname for f in AuditEvent._meta.concrete_fields]
    stored = {e.pk: e for e in AuditEvent.objects.filter(action="test.copied")}
    assert len(stored) == len(recorded)
    for event in recorded:
        assert [getattr(stored[event.pk], f) for f in fields] == [getattr(event, f) for f in fields]
    # None is SQL NULL, as a save writes it, not a JSON null
    odd = AuditEvent.objects.filter(action="test.copied", before__isnull=True).count()
    assert odd == len(recorded) // 2
    assert chain_verify().ok
