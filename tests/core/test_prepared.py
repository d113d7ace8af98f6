"""prepared_cursor: the same rows as Django's cursor, the statement prepared once per
connection and then run by name, logged and counted like any other, and values bound apart
without losing what a wider column holds."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext

from core.prepared import prepared_cursor

pytestmark = pytest.mark.django_db

SQL = "SELECT %s::bigint * 2, %s::text, %s::timestamptz, %s::bigint[]"


def _prepared_statements() -> list[str]:
    with connection.cursor() as cursor:
        cursor.execute("SELECT statement FROM pg_prepared_statements")
        return [row[0] for row in cursor.fetchall()]


def test_a_statement_gives_what_djangos_cursor_gives_and_is_prepared_once():
    values = [10**12, "é'; --", datetime(2026, 1, 2, 3, 4, 5, 6, tzinfo=UTC), [1, 2**40]]
    with connection.cursor() as cursor:
        cursor.execute(SQL, values)
        expected = cursor.fetchone()
    for _ in range(3):
        with prepared_cursor() as cursor:
            cursor.execute(SQL, values)
            assert cursor.fetchone() == expected
    assert expected[0] == 2 * 10**12  # bound as wide as the value: no 32-bit wrap
    assert (
        sum("pg_prepared_statements" not in s and "* 2" in s for s in _prepared_statements()) == 1
    )


def test_its_statements_are_counted_and_logged_as_djangos_are():
    with CaptureQueriesContext(connection) as captured, prepared_cursor() as cursor:
        cursor.execute(SQL, [1, "x", datetime(2026, 1, 1, tzinfo=UTC), [3]])
    assert len(captured.captured_queries) == 1
    assert "* 2" in captured.captured_queries[0]["sql"]


def test_a_statement_prepared_in_a_transaction_that_rolled_back_still_runs():
    with pytest.raises(RuntimeError), transaction.atomic():
        with prepared_cursor() as cursor:
            cursor.execute("SELECT %s::integer + 40", [2])
        raise RuntimeError("the change failed after the statement")
    for _ in range(2):
        with prepared_cursor() as cursor:
            cursor.execute("SELECT %s::integer + 40", [2])
            assert cursor.fetchone() == (42,)


def test_a_statement_that_failed_runs_again_once_its_transaction_rolled_back():
    with pytest.raises(Exception, match="division by zero"), transaction.atomic():
        with prepared_cursor() as cursor:
            cursor.execute("SELECT 1 / %s::integer", [0])
    with prepared_cursor() as cursor:
        cursor.execute("SELECT 1 / %s::integer", [1])
        assert cursor.fetchone() == (1,)
