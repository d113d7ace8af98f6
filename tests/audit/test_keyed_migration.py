"""The migration that keys the chain: a log recorded before it (plain SHA-256 links) is checked
and signed again with the audit key, in order; a log that was already broken is refused."""

from __future__ import annotations

import hashlib
import json
from datetime import UTC, datetime, timedelta

import pytest
from django.db import connection
from django.db.migrations.executor import MigrationExecutor

from audit.chain import GENESIS_HASH
from audit.keys import signing_key
from audit.models import AuditEvent
from audit.selectors import chain_verify

pytestmark = pytest.mark.django_db(transaction=True)

BEFORE = [("audit", "0002_append_only")]
AFTER = [("audit", "0003_keyed_chain")]


def _migrate(target) -> None:
    executor = MigrationExecutor(connection)
    executor.loader.build_graph()
    executor.migrate(target)


def _latest() -> list[tuple[str, str]]:
    """Every app's last migration: what every other test runs on. Going back to BEFORE
    unapplies every later audit migration and every migration of another app that depends
    on one (market's one-call bid function needs the chain head's), so all of them are
    applied again, not only audit's."""
    return MigrationExecutor(connection).loader.graph.leaf_nodes()


def _unkeyed_log(n: int, *, tamper_seq: int | None = None) -> None:
    """Write ``n`` events the way the previous release did, straight into the old table."""
    prev = GENESIS_HASH
    start = datetime(2026, 11, 1, tzinfo=UTC)
    with connection.cursor() as cursor:
        for seq in range(1, n + 1):
            created = start + timedelta(minutes=seq)
            after = {"amount": 1000 * seq}
            body = {
                "seq": seq,
                "created_at": created.isoformat(timespec="microseconds"),
                "actor_id": None,
                "actor_label": "beat",
                "tenant_id": None,
                "action": "test.old",
                "object_type": "thing",
                "object_id": str(seq),
                "before": None,
                "after": after,
                "prev_hash": prev,
            }
            digest = hashlib.sha256(
                json.dumps(body, sort_keys=True, separators=(",", ":")).encode()
            ).hexdigest()
            if seq == tamper_seq:
                after = {"amount": 1}  # stored content no longer matches its hash
            cursor.execute(
                "INSERT INTO audit_auditevent (seq, created_at, actor_label, action, object_type,"
                " object_id, before, after, prev_hash, hash) VALUES"
                " (%s, %s, 'beat', 'test.old', 'thing', %s, NULL, %s, %s, %s)",
                [seq, created, str(seq), json.dumps(after), prev, digest],
            )
            prev = digest


@pytest.fixture
def old_schema():
    _migrate(BEFORE)
    try:
        yield
    finally:
        with connection.cursor() as cursor:
            cursor.execute("TRUNCATE audit_auditevent")
        _migrate(_latest())


def test_an_unkeyed_log_is_signed_with_the_key_and_then_verifies(old_schema):
    _unkeyed_log(4)
    _migrate(AFTER)
    events = list(AuditEvent.objects.order_by("seq"))
    assert [e.seq for e in events] == [1, 2, 3, 4]
    assert {e.key_id for e in events} == {signing_key()[0]}
    assert [e.after for e in events] == [{"amount": 1000 * s} for s in range(1, 5)]
    report = chain_verify()
    assert report.ok and report.checked == 4, report.describe()


def test_an_unkeyed_log_that_was_already_broken_is_not_signed(old_schema):
    _unkeyed_log(4, tamper_seq=3)
    with pytest.raises(RuntimeError, match="already broken at seq=3"):
        _migrate(AFTER)
