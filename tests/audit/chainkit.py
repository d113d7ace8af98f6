"""Helpers for the audit chain tests: a few events, and SQL run the way the tables' owner can."""

from __future__ import annotations

from django.db import connection, transaction

import audit.services as audit
from audit.models import AuditEvent
from tests import factories


def events(n: int = 5) -> list[AuditEvent]:
    t = factories.tenant()
    with transaction.atomic():
        return [
            audit.record(
                actor="test",
                action="test.event",
                tenant=t,
                object_type="thing",
                object_id=i,
                after={"i": i, "amount": 1000 * i},
            )
            for i in range(n)
        ]


def as_owner(*statements: tuple[str, list]) -> None:
    """Run SQL with the append-only trigger bypassed, as an intruder with the owner's or a
    superuser's rights would: replica mode skips ordinary triggers."""
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute("SET LOCAL session_replication_role = replica")
        for sql, params in statements:
            cursor.execute(sql, params)
