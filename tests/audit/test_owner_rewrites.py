"""Rewrites by someone who owns the database: the append-only trigger is bypassed
(``session_replication_role = replica``) and the hashes are recomputed, yet the audit log and
the ledger still tell. The chain is keyed with a secret kept outside the database, signed head
checkpoints are exported to an append-only file, and every ledger transfer is checked against
its audit event."""

from __future__ import annotations

import hashlib
import hmac
import json

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

from audit.chain import canonical, fields_of
from audit.checkpoints import checkpoint_write, checkpoints_read
from audit.models import AuditEvent
from audit.selectors import chain_verify
from tenants.ledger import credits_grant, ledger_verify
from tenants.models import Account, Entry, Transfer
from tests import factories
from tests.audit import chainkit

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def _checkpoint_file(tmp_path, settings):
    settings.GPUMARKET_AUDIT_CHECKPOINT_PATH = str(tmp_path / "audit-checkpoints.jsonl")


def _rechain_from(seq: int, digest) -> None:
    """Recompute every hash from ``seq`` on with ``digest`` (what an owner who knows the
    algorithm, but not the key, can do) and write them back."""
    events = list(AuditEvent.objects.order_by("seq"))
    prev = next((e.hash for e in events if e.seq == seq - 1), "0" * 64)
    updates = []
    for event in events:
        if event.seq < seq:
            continue
        event.prev_hash = prev
        event.hash = digest(canonical(**fields_of(event)))
        updates.append(
            (
                "UPDATE audit_auditevent SET prev_hash = %s, hash = %s WHERE id = %s",
                [event.prev_hash, event.hash, event.pk],
            )
        )
        prev = event.hash
    chainkit.as_owner(*updates)


@pytest.mark.parametrize(
    "digest",
    [
        pytest.param(lambda body: hashlib.sha256(body).hexdigest(), id="plain-sha256"),
        pytest.param(
            lambda body: hmac.new(b"a guessed key", body, hashlib.sha256).hexdigest(),
            id="hmac-with-a-guessed-key",
        ),
    ],
)
def test_an_edited_event_with_every_later_hash_recomputed_is_detected(digest):
    events = chainkit.events()
    target = events[2]
    chainkit.as_owner(
        (
            "UPDATE audit_auditevent SET after = %s WHERE id = %s",
            [json.dumps({"i": 2, "amount": 1}), target.pk],
        )
    )
    _rechain_from(target.seq, digest)
    report = chain_verify()
    assert not report.ok
    assert report.first_bad_seq == target.seq
    assert "key" in report.problem
    with pytest.raises(CommandError, match=f"seq={target.seq}"):
        call_command("verify_audit")


def test_a_truncated_tail_is_detected_against_the_signed_checkpoints():
    events = chainkit.events()
    checkpoint_write()
    assert checkpoints_read()[-1].seq == events[-1].seq
    chainkit.as_owner(
        ("DELETE FROM audit_auditevent WHERE seq >= %s", [events[3].seq]),
    )
    report = chain_verify()
    assert not report.ok
    assert report.first_bad_seq == events[-1].seq
    assert "truncated" in report.problem
    with pytest.raises(CommandError, match="truncated"):
        call_command("verify_audit")


def test_a_rewritten_tail_is_detected_even_when_its_length_is_kept():
    # Delete the last two events and append two forged ones with the same seq numbers, chained
    # with the old algorithm: the checkpoint names the head hash that was really there.
    events = chainkit.events()
    checkpoint_write()
    head = events[-1]
    chainkit.as_owner(
        (
            "UPDATE audit_auditevent SET after = %s WHERE id = %s",
            [json.dumps({"i": 4, "amount": 7}), head.pk],
        )
    )
    _rechain_from(head.seq, lambda body: hashlib.sha256(body).hexdigest())
    report = chain_verify()
    assert not report.ok and report.first_bad_seq == head.seq


def test_a_forged_or_edited_checkpoint_line_is_refused(settings):
    chainkit.events(3)
    checkpoint_write()
    path = settings.GPUMARKET_AUDIT_CHECKPOINT_PATH
    with open(path, encoding="utf-8") as f:
        line = json.loads(f.readline())
    line["seq"] = 1  # claim the head was earlier than it was, to hide a later truncation
    with open(path, "a", encoding="utf-8") as f:
        f.write(json.dumps(line) + "\n")
    report = chain_verify()
    assert not report.ok
    assert "checkpoint" in report.problem and "signature" in report.problem


def test_checkpoints_are_appended_only_when_the_head_moved(settings):
    chainkit.events(2)
    first = checkpoint_write()
    assert checkpoint_write() is None  # nothing new: no line
    chainkit.events(1)
    second = checkpoint_write()
    assert second.seq > first.seq
    assert [c.seq for c in checkpoints_read()] == [first.seq, second.seq]
    assert chain_verify().ok


def test_an_inflated_grant_rewritten_in_transfer_entries_and_balances_is_detected():
    t = factories.tenant()
    credits_grant(tenant=t, amount=100_000, reason="start", actor=None)
    assert ledger_verify() == []
    transfer = Transfer.objects.get(tenant=t, kind="grant")
    inflated = 99_000_000
    delta = inflated - transfer.amount
    available = Account.objects.get(tenant=t, kind="available")
    chainkit.as_owner(
        ("UPDATE tenants_transfer SET amount = %s WHERE id = %s", [inflated, transfer.pk]),
        (
            "UPDATE tenants_entry SET amount = %s WHERE transfer_id = %s AND amount > 0",
            [inflated, transfer.pk],
        ),
        (
            "UPDATE tenants_entry SET amount = %s WHERE transfer_id = %s AND amount < 0",
            [-inflated, transfer.pk],
        ),
        ("UPDATE tenants_account SET balance = balance + %s WHERE id = %s", [delta, available.pk]),
        (
            "UPDATE tenants_account SET balance = balance - %s WHERE id = %s",
            [delta, transfer.source_id],
        ),
    )
    assert sorted(Entry.objects.filter(transfer=transfer).values_list("amount", flat=True)) == [
        -inflated,
        inflated,
    ]
    problems = ledger_verify()
    assert any(f"transfer {transfer.pk}" in p and "audit" in p for p in problems), problems
    with pytest.raises(CommandError, match=f"transfer {transfer.pk}"):
        call_command("verify_ledger")


def test_a_transfer_without_its_audit_event_is_reported():
    t = factories.tenant()
    credits_grant(tenant=t, amount=5_000, reason="start", actor=None)
    transfer = Transfer.objects.get(tenant=t, kind="grant")
    chainkit.as_owner(
        (
            "DELETE FROM audit_auditevent WHERE object_type = 'tenants.transfer' AND object_id = %s",
            [str(transfer.pk)],
        ),
    )
    assert any(f"transfer {transfer.pk}" in p and "no audit event" in p for p in ledger_verify())
