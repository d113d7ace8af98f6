"""Many rows at once: new rows from model objects (``rows_insert``) or from plain values
(``rows_copy``), rows written back each with its own values (``rows_update``) and integer
columns read into one array (``rows_read``)."""

from __future__ import annotations

import itertools
import time
from collections.abc import Sequence

import numpy as np
import psycopg
from django.db import connections, models, router
from django.db.models import Model, QuerySet
from django.utils import timezone

PG_ROWS = 50_000  # rows per UPDATE on PostgreSQL (one array per field)
CASE_ROWS = 500  # rows per bulk_update statement elsewhere
CREATE_ROWS = 2000  # rows per bulk_create statement where COPY is not used
COPY_FROM_ROWS = 50  # fewer rows than this go by bulk_create: one statement, not two


# Fields whose attribute value is what a save writes (Django's preparation of them is a type
# cast the driver makes anyway); any other field is prepared by Django, as for a save.
_AS_HELD = frozenset(
    {
        models.BigIntegerField,
        models.IntegerField,
        models.PositiveIntegerField,
        models.SmallIntegerField,
        models.BooleanField,
        models.CharField,
        models.TextField,
        models.ForeignKey,
    }
)


def _related_keys(objs: Sequence[Model], relations: list) -> None:
    """What a save checks of related objects: one assigned before it had its key gets that
    key now; one that still has none is refused."""
    for f in relations:
        for obj in objs:
            if getattr(obj, f.attname) is None and f.is_cached(obj):
                related = f.get_cached_value(obj)
                if related is None:
                    continue
                if related.pk is None:
                    raise ValueError(
                        f"rows_insert: {f.name} of a {obj._meta.label} row is not saved yet"
                    )
                setattr(obj, f.attname, related.pk)


def rows_insert(objs: Sequence[Model]) -> None:
    """Insert ``objs`` (new rows of one model with a database-generated primary key) in the
    caller's transaction, in order, and set their primary keys, as ``bulk_create`` does.

    Django's ``bulk_create`` builds an INSERT with a parameter per value and, on PostgreSQL,
    an array per column that the driver writes out in Python: a 20,000-bid round's settlement
    spent half its time there (docs/market.md). On PostgreSQL the keys are drawn from the
    table's sequence in one statement and the rows sent by COPY, their values prepared by
    each field as Django prepares them for a save; elsewhere (the embedded SQLite)
    ``bulk_create`` in batches of CREATE_ROWS, as for fewer than COPY_FROM_ROWS rows (one
    statement instead of two). Related objects must have their keys before the rows are
    inserted (checked, as a save checks it).
    """
    if not objs:
        return
    model = type(objs[0])
    alias = router.db_for_write(model)
    connection = connections[alias]
    if connection.vendor != "postgresql" or len(objs) < COPY_FROM_ROWS:
        model._default_manager.db_manager(alias).bulk_create(objs, batch_size=CREATE_ROWS)
        return
    meta = model._meta
    if any(obj.pk is not None for obj in objs):
        raise ValueError(f"rows_insert: a {meta.label} row already has its primary key")
    fields = [f for f in meta.concrete_fields if f is not meta.pk]
    _related_keys(objs, [f for f in fields if f.is_relation])
    plain = [type(f) in _AS_HELD for f in fields]

    def values(obj: Model) -> list:
        return [
            getattr(obj, f.attname)
            if as_held
            else f.get_db_prep_save(f.pre_save(obj, True), connection)
            for f, as_held in zip(fields, plain, strict=True)
        ]

    keys = _copy(connection, model, fields, objs, values)
    for obj, key in zip(objs, keys, strict=True):
        setattr(obj, meta.pk.attname, key)
        obj._state.adding = False
        obj._state.db = alias


def rows_copy(
    model: type[Model],
    names: Sequence[str],
    rows: Sequence[Sequence],
    *,
    as_text: Sequence[str] = (),
) -> list[int]:
    """Insert ``rows`` (tuples of values for the fields ``names``, in that order; a foreign key
    given by its id) as new rows of ``model`` with database-generated primary keys, in the
    caller's transaction and in order; returns their keys.

    ``rows_insert`` without a model object per row, for a batch whose rows nobody reads back
    as objects (a settlement's ledger entries and idempotency records: a million-bid round
    writes millions). Every field the model has and ``names`` leaves out is written as its
    default would be, so ``names`` must cover every field without one; a time set on insert
    (``auto_now``, ``auto_now_add``) must be left out, and is the time of the call. Values
    are written as given (prepared by their field where it is not a plain integer, string,
    boolean or key). Same statements as ``rows_insert``: COPY on PostgreSQL,
    ``bulk_create`` elsewhere and for fewer than COPY_FROM_ROWS rows.

    ``as_text``: fields whose values are given as the text COPY writes (a JSON field's value
    already encoded, say), which only COPY takes: PostgreSQL and COPY_FROM_ROWS rows or more.
    """
    if not rows:
        return []
    meta = model._meta
    fields = [meta.get_field(name) for name in names]
    if any(f.primary_key or not f.concrete for f in fields):
        raise ValueError(f"rows_copy: {meta.label} takes concrete fields other than its key")
    timed = [f.name for f in fields if _set_on_insert(f)]
    if timed:
        raise ValueError(f"rows_copy: {meta.label}.{timed[0]} is set on insert; leave it out")
    given = set(fields)
    rest = [f for f in meta.concrete_fields if f is not meta.pk and f not in given]
    alias = router.db_for_write(model)
    connection = connections[alias]
    if connection.vendor != "postgresql" or len(rows) < COPY_FROM_ROWS:
        if as_text:
            raise ValueError("rows_copy: values as text go only by COPY (PostgreSQL)")
        attnames = [f.attname for f in fields]
        objs = [model(**dict(zip(attnames, row, strict=True))) for row in rows]
        model._default_manager.db_manager(alias).bulk_create(objs, batch_size=CREATE_ROWS)
        return [obj.pk for obj in objs]
    now = timezone.now()
    defaults = [
        f.get_db_prep_save(now if _set_on_insert(f) else f.get_default(), connection) for f in rest
    ]
    prepare = [None if type(f) in _AS_HELD or f.name in as_text else f for f in fields]

    def values(row: Sequence) -> list:
        return [
            value if f is None else f.get_db_prep_save(value, connection)
            for f, value in zip(prepare, row, strict=True)
        ] + defaults

    return _copy(connection, model, [*fields, *rest], rows, values)


def _set_on_insert(field) -> bool:
    return getattr(field, "auto_now", False) or getattr(field, "auto_now_add", False)


def _copy(connection, model: type[Model], fields: list, items: Sequence, values) -> list[int]:
    """COPY one row per item (``values(item)``: the values of ``fields``), with keys drawn from
    the table's sequence in one statement; returns the keys in order."""
    meta = model._meta
    pk = meta.pk
    quote = connection.ops.quote_name
    columns = ", ".join(quote(f.column) for f in [pk, *fields])
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT nextval(pg_get_serial_sequence(%s, %s)) FROM generate_series(1, %s)",
            [quote(meta.db_table), pk.column, len(items)],
        )
        keys = sorted(row[0] for row in cursor.fetchall())
        copy_sql = f"COPY {quote(meta.db_table)} ({columns}) FROM STDIN"
        with connection.wrap_database_errors, cursor.cursor.copy(copy_sql) as copy:
            for key, item in zip(keys, items, strict=True):
                copy.write_row([key, *values(item)])
    return keys


def rows_update(objs: Sequence[Model], fields: Sequence[str]) -> None:
    """Write ``fields`` of ``objs`` (saved rows of one model) to the database, each row its
    own values, in the caller's transaction.

    Django's ``bulk_update`` puts every row of a statement in one CASE per field, which the
    database searches row by row, and builds an expression per row and field in Python: a
    10,000-bid round spent 340 s of its settlement there. On PostgreSQL the values go as one
    array per field, joined to the rows by primary key (UPDATE ... FROM unnest(...)), in
    statements of PG_ROWS rows; elsewhere (the embedded SQLite) ``bulk_update`` in batches of
    CASE_ROWS, where a statement's cost stays small.
    """
    if not objs:
        return
    model = type(objs[0])
    alias = router.db_for_write(model)
    connection = connections[alias]
    if connection.vendor != "postgresql":
        model._default_manager.db_manager(alias).bulk_update(objs, fields, batch_size=CASE_ROWS)
        return
    meta = model._meta
    pk = meta.pk
    columns = [meta.get_field(name) for name in fields]
    table = connection.ops.quote_name(meta.db_table)
    quote = connection.ops.quote_name
    assignments = ", ".join(f"{quote(f.column)} = v.{quote(f.column)}" for f in columns)
    arrays = ", ".join(f"%s::{f.db_type(connection)}[]" for f in [pk, *columns])
    names = ", ".join(quote(f.column) for f in [pk, *columns])
    sql = (
        f"UPDATE {table} SET {assignments} FROM unnest({arrays}) AS v({names}) "
        f"WHERE {table}.{quote(pk.column)} = v.{quote(pk.column)}"
    )
    with connection.cursor() as cursor:
        for start in range(0, len(objs), PG_ROWS):
            chunk = objs[start : start + PG_ROWS]
            params = [[obj.pk for obj in chunk]]
            params += [
                [f.get_db_prep_save(getattr(obj, f.attname), connection) for obj in chunk]
                for f in columns
            ]
            cursor.execute(sql, params)


def rows_read(queryset: QuerySet) -> np.ndarray:
    """The rows of ``queryset``, a ``values_list`` of integer columns without NULLs, as one
    int64 array (rows, columns), in the caller's transaction and in the queryset's order.

    The queryset's own SQL is run once and its rows fetched at once, without the tuple
    Django makes of each row and the chunks of 100 it fetches them in. A million-bid round's
    read (``round_clearing.round_data``: a million bids, two million limits, the tenants)
    took 4.3-4.6 s through ``values_list`` and 2.3-2.8 s this way (with its limits read by a
    range of ids rather than a join).

    On PostgreSQL, a queryset that is unordered or ordered by its first column alone (as a
    round's bids by id) comes as one array per column instead of a row per tuple
    (``_read_columns``): 1.4 -> 0.9 s for the bids and limits of a million-bid round.
    """
    compiler = queryset.query.get_compiler(using=queryset.db)
    sql, params = compiler.as_sql()
    connection = connections[queryset.db]
    if connection.vendor == "postgresql" and _by_first_column_or_none(queryset):
        return _read_columns(
            connection, sql, params, width=compiler.col_count, sort=queryset.ordered
        )
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        width = len(cursor.description)
        rows = cursor.fetchall()
    # One flat pass over the values: faster than np.array, which first works out the shape.
    flat = itertools.chain.from_iterable(rows)
    return np.fromiter(flat, dtype=np.int64, count=len(rows) * width).reshape(-1, width)


def _by_first_column_or_none(queryset: QuerySet) -> bool:
    """Whether ``queryset`` is unordered or ordered by its first column alone, ascending."""
    query = queryset.query
    if not queryset.ordered:
        return True
    if query.extra_order_by or not query.values_select or len(query.order_by) != 1:
        return False
    first, (by,) = query.values_select[0], query.order_by
    pk_names = {"pk", queryset.model._meta.pk.name}
    return isinstance(by, str) and (by == first or {by, first} <= pk_names)


# An element of an int8 array in PostgreSQL's binary form: its length, then its value.
_ELEMENT = np.dtype([("length", ">i4"), ("value", ">i8")])


def _read_columns(connection, sql: str, params, *, width: int, sort: bool) -> np.ndarray:
    """Each column of the rows of ``sql`` aggregated into one int8 array by the database and
    sent in its binary form (``array_send``), read by numpy without a Python object per value.
    Rows come from ``sql`` in its order; the aggregate keeps the order of the rows it is given
    but SQL does not promise it, so with ``sort`` the rows are put in the order of their
    first column here where they are not (stable, so equal keys keep their order)."""
    names = ", ".join(f"c{i}" for i in range(width))
    columns = ", ".join(f"array_send(array_agg(q.c{i}::int8))" for i in range(width))
    statement = f"SELECT {columns} FROM ({sql}) AS q({names})"
    connection.ensure_connection()
    start = time.monotonic()
    # In the binary format, on the connection's own transaction: as text (Django's cursor),
    # each array would travel as hex digits and be parsed back, no faster than rows.
    with connection.wrap_database_errors, psycopg.Cursor(connection.connection) as cursor:
        cursor.execute(statement, params, binary=True)
        sent = cursor.fetchone()
    if connection.queries_logged:  # as Django's cursor logs it (DEBUG, statement counts)
        connection.queries_log.append(
            {"sql": statement % tuple(params), "time": f"{time.monotonic() - start:.3f}"}
        )
    if sent[0] is None:  # no rows: the aggregate of nothing is NULL
        return np.zeros((0, width), dtype=np.int64)
    out = np.empty((_array_size(sent[0]), width), dtype=np.int64)
    for i, column in enumerate(sent):
        out[:, i] = _array_values(column, rows=out.shape[0], column=i)
    if sort and out.shape[0] > 1 and not (out[1:, 0] >= out[:-1, 0]).all():
        out = out[np.argsort(out[:, 0], kind="stable")]
    return out


def _array_size(sent: bytes) -> int:
    # Header: dimensions, a NULL flag and the element type, then (size, lower bound) a dimension.
    return int(np.frombuffer(sent, dtype=">i4", count=4)[3])


def _array_values(sent: bytes, *, rows: int, column: int) -> np.ndarray:
    dims, has_null, _type = np.frombuffer(sent, dtype=">i4", count=3).tolist()
    if has_null:
        raise ValueError(f"rows_read: column {column} holds a NULL")
    if dims != 1 or _array_size(sent) != rows:
        raise ValueError(f"rows_read: column {column} is not one array of {rows} values")
    elements = np.frombuffer(sent, dtype=_ELEMENT, count=rows, offset=20)
    if (elements["length"] != 8).any():
        raise ValueError(f"rows_read: column {column} is not of 8-byte integers")
    return elements["value"]
