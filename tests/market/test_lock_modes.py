"""Row locks that leave foreign keys free. A service that locks a row to change its plain
columns takes FOR NO KEY UPDATE, not FOR UPDATE: the latter also blocks every insert that
references the row (PostgreSQL's foreign-key check takes FOR KEY SHARE on it). With the
audit chain's lock held to the end of every transaction that records, that made a deadlock:
one transaction recorded an event, then inserted a row referencing a tier; another locked
the tier FOR UPDATE for a capacity change, then waited for the chain to record its own
event. It was seen in the end-to-end failure tests."""

from __future__ import annotations

import threading

import pytest
from django.db import connection, connections, transaction
from django.db.utils import OperationalError

import audit.services
from market.models import Tier
from market.services.tiers import tier_capacity_set, tier_create
from tests import factories


def _held_while_recording(monkeypatch, change):
    """Run ``change`` in a thread and stop it inside its audit record, its row locks held."""
    recording, release = threading.Event(), threading.Event()
    real = audit.services.record

    def record(**kwargs):
        recording.set()
        release.wait(20)
        return real(**kwargs)

    monkeypatch.setattr(audit.services, "record", record)
    failure = []

    def run():
        try:
            change()
        except Exception as exc:  # noqa: BLE001 - reported by the test
            failure.append(exc)
        finally:
            connections.close_all()

    thread = threading.Thread(target=run)
    thread.start()
    assert recording.wait(20), failure
    return release, thread, failure


def _key_share(table: str, pk: int) -> None:
    """What an insert referencing the row asks for, with no patience."""
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute("SET LOCAL lock_timeout = '2s'")
        cursor.execute(f"SELECT 1 FROM {table} WHERE id = %s FOR KEY SHARE", [pk])


@pytest.mark.django_db(transaction=True)
def test_a_tier_locked_for_its_capacity_leaves_rows_that_reference_it_free(monkeypatch):
    admin = factories.admin_user()
    tier = tier_create(actor=admin, slug="a100", name="A100", capacity=0)
    release, thread, failure = _held_while_recording(
        monkeypatch, lambda: tier_capacity_set(tier=tier, capacity=4, actor="test")
    )
    try:
        _key_share("market_tier", tier.pk)
    except OperationalError as exc:
        pytest.fail(f"an insert referencing the tier waited on its capacity change: {exc}")
    finally:
        release.set()
        thread.join(30)
    assert not failure and Tier.objects.get(pk=tier.pk).capacity == 4
