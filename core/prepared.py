"""Statements that a request runs every time, parsed and planned once per connection.

Django gives psycopg's connection client-side binding: every statement goes as text with its
values written in, and PostgreSQL parses and plans it anew. For the token lookup of every API
request that planning (a join of four tables) was five times the statement's own run: 0.36 ms
of PostgreSQL's CPU against 0.065 ms prepared. ``prepared_cursor`` gives a cursor whose
statements are prepared on the first run and reused by name afterwards on that connection,
with the values sent apart (server-side binding).

What a caller must know: a value goes with the type psycopg gives it (a Python int as the
smallest integer type its value fits, a str as unknown), so a statement names the type of
each placeholder with a cast where it matters (``%s::bigint``); and the statements are
counted and logged by Django like any other.
"""

from __future__ import annotations

from typing import Any

import psycopg
from django.db import connection
from django.db.backends.utils import CursorDebugWrapper, CursorWrapper

# Django turns psycopg's automatic preparing off (None), and psycopg then refuses an explicit
# prepare=True as well; a threshold that no statement reaches keeps the automatic preparing
# off (Django's own cursors bind on the client and never prepare) and allows the explicit one.
_NEVER_BY_COUNT = 2**31


class _PreparingCursor(psycopg.Cursor):
    def execute(self, query: Any, params: Any = None, **kwargs: Any) -> _PreparingCursor:
        return super().execute(query, params, **{**kwargs, "prepare": True})


class _PreparedDebugWrapper(CursorDebugWrapper):
    """Logs a prepared statement as Django logs one bound on the client, values written in:
    Django reads that text back from psycopg's cursor, which has none for a statement run
    by name."""

    def execute(self, sql: str, params: Any = None) -> Any:
        with self.debug_sql(self.db.ops.compose_sql(sql, params)):
            return CursorWrapper.execute(self, sql, params)


def prepared_cursor() -> CursorWrapper:
    """A cursor on Django's connection whose statements PostgreSQL prepares once and then
    runs by name; elsewhere (the embedded SQLite) Django's own cursor. Use it as
    ``connection.cursor()``: in a ``with`` block."""
    if connection.vendor != "postgresql":
        return connection.cursor()
    connection.close_if_health_check_failed()
    connection.ensure_connection()
    raw = connection.connection
    if raw.prepare_threshold is None:
        raw.prepare_threshold = _NEVER_BY_COUNT
    connection.validate_thread_sharing()
    with connection.wrap_database_errors:
        cursor = _PreparingCursor(raw)
    if connection.queries_logged:
        return _PreparedDebugWrapper(cursor, connection)
    return connection.make_cursor(cursor)
