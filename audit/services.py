"""Recording audit events. ``record`` is called by every state-changing service, inside that
service's transaction, so the event and the change commit or roll back together."""

from __future__ import annotations

import functools
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from django.contrib.auth.models import AbstractBaseUser
from django.db import connection, models, transaction
from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.models.base import ModelState
from django.utils import timezone

from audit.chain import FIELDS, GENESIS_HASH, canonical_encoded, json_text, mac
from audit.keys import signing_key
from audit.models import AuditEvent
from core.prepared import prepared_cursor
from core.rows import COPY_FROM_ROWS, rows_copy, rows_insert

# Any fixed 64-bit key: the advisory lock that serialises appends to the chain on PostgreSQL.
# A caller that takes it and reads the head itself (``audit_chain_head(CHAIN_LOCK_KEY)``, in a
# statement of its own) hands the head to ``batch``.
CHAIN_LOCK_KEY = _CHAIN_LOCK_KEY = 7_412_001


class AuditError(Exception):
    """The audit log could not be written or read as asked."""


def _head_locked() -> tuple[int, str]:
    """The seq and hash of the chain's last event (0 and the genesis hash when there is none),
    read under the chain's lock, which is held until the transaction ends."""
    # Appends must be serial for the chain to be linear. On PostgreSQL a transaction-scoped
    # advisory lock does that without a table lock, and audit_chain_head (migrations 0004,
    # 0007) runs the transaction's pending foreign-key checks, so that they are not run under
    # the lock at COMMIT, then takes it and reads the head, in one round trip; SQLite already
    # serialises writers.
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute("SELECT seq, hash FROM audit_chain_head(%s)", [_CHAIN_LOCK_KEY])
            seq, head = cursor.fetchone()  # NULLs when the chain is empty
    else:
        last = AuditEvent.objects.order_by("-seq").values_list("seq", "hash").first()
        seq, head = last or (None, None)
    return (0, GENESIS_HASH) if seq is None else (seq, head)


def _actor_parts(actor: AbstractBaseUser | str | None) -> tuple[int | None, str]:
    if actor is None:
        return None, "system"
    if isinstance(actor, str):
        return None, actor
    return actor.pk, actor.get_username()


_batch = threading.local()


def _savepoints(connection: BaseDatabaseWrapper) -> list[str]:
    # atomic(savepoint=False) pushes None: a failure inside it dooms the whole transaction,
    # so an event recorded there cannot outlive a rollback that the batch would miss.
    return [sid for sid in connection.savepoint_ids if sid]


@contextmanager
def batch(*, head: tuple[int, str] | None = None) -> Iterator[None]:
    """Events recorded inside are appended together when the block ends: one round trip for
    the chain's lock and head and one INSERT for all of them, instead of that for each. The
    events, their order and their hashes are those that recording them one by one would give.

    Must run inside the transaction of the change; if the block raises, nothing is appended
    (and the transaction rolls back). Blocks may nest; the outermost one appends. An event
    recorded under a savepoint opened inside the block is appended at once instead, so that
    it rolls back with its savepoint; it then stands in the chain before the events the block
    recorded earlier. An event recorded inside the block has no seq, hash or pk until the
    block ends.

    ``head``: the chain's (seq, hash) as ``audit_chain_head(CHAIN_LOCK_KEY)`` returned it in this
    transaction, so under the chain's lock (PostgreSQL only): the events are appended onto it
    without reading it again, one round trip fewer. Only for the outermost block.
    """
    connection = transaction.get_connection()
    if not connection.in_atomic_block:
        raise AuditError("audit.batch must run inside the transaction of the change it records")
    if getattr(_batch, "events", None) is not None:
        if head is not None:
            raise AuditError("a head can only be handed to the outermost audit.batch")
        yield
        return
    if head is not None and connection.vendor != "postgresql":
        raise AuditError("a head read under the chain's lock is a PostgreSQL call")
    _batch.events, _batch.savepoints, _batch.head = [], _savepoints(connection), head
    try:
        yield
        events, head = _batch.events, _batch.head
    finally:
        _batch.events = _batch.savepoints = _batch.head = None
    _append(events, head=head)


def _append(events: list[AuditEvent], *, head: tuple[int, str] | None = None) -> None:
    """Chain ``events`` onto the head, in order, and insert them. Each event's ``before`` and
    ``after`` are encoded once (``json_text``), for its hash and, on PostgreSQL, for the row:
    a round's 20,000 events encoded them twice and went through a model object's fields one
    by one (``rows_insert``, still the embedded SQLite's way)."""
    if not events:
        return
    if head is None:
        seq, prev_hash = _head_locked()
    else:
        seq, prev_hash = (0, GENESIS_HASH) if head[0] is None else head
    key_id, key = signing_key()
    rows = []
    for event in events:
        seq += 1
        before, after = json_text(event.before), json_text(event.after)
        event.seq, event.prev_hash, event.key_id = seq, prev_hash, key_id
        event.hash = prev_hash = mac(
            key,
            canonical_encoded(
                seq=seq,
                created_at=event.created_at,
                actor_id=event.actor_id,
                actor_label=event.actor_label,
                tenant_id=event.tenant_id,
                action=event.action,
                object_type=event.object_type,
                object_id=event.object_id,
                before=before,
                after=after,
                prev_hash=event.prev_hash,
                key_id=key_id,
            ),
        )
        rows.append(
            (
                seq,
                event.created_at,
                event.actor_id,
                event.actor_label,
                event.tenant_id,
                event.action,
                event.object_type,
                event.object_id,
                None if event.before is None else before,  # SQL NULL, as a save writes None
                None if event.after is None else after,
                event.prev_hash,
                key_id,
                event.hash,
            )
        )
    if connection.vendor != "postgresql":
        rows_insert(events)
        return
    if len(events) < COPY_FROM_ROWS:  # one INSERT: fewer statements than COPY for a few events
        with prepared_cursor() as cursor:
            cursor.execute(_insert_sql(len(rows)), [value for row in rows for value in row])
            keys = [pk for (pk,) in cursor.fetchall()]
    else:
        keys = rows_copy(AuditEvent, _EVENT_FIELDS, rows, as_text=("before", "after"))
    for event, pk in zip(events, keys, strict=True):
        event.pk = pk
        event._state.adding = False
        event._state.db = connection.alias


_EVENT_FIELDS = (*FIELDS, "hash")  # by attribute name (actor_id), as a row of _append


@functools.cache
def _insert_sql(n: int) -> str:
    """PostgreSQL's INSERT of ``n`` rows of ``_append`` (``before`` and ``after`` as JSON
    text), returning their keys in order. Made once per size: the ORM's INSERT for a bid's two
    events (``bulk_create``, an array a column) was half the Python of appending them, under
    the chain's lock."""
    meta, quote = AuditEvent._meta, connection.ops.quote_name
    columns = [meta.get_field(name).column for name in _EVENT_FIELDS]
    row = ", ".join("%s::jsonb" if c in ("before", "after") else "%s" for c in columns)
    return (
        f"INSERT INTO {quote(meta.db_table)} ({', '.join(map(quote, columns))}) "
        f"VALUES {', '.join(f'({row})' for _ in range(n))} RETURNING {quote(meta.pk.column)}"
    )


_UNSET = {"id": None, "seq": None, "prev_hash": "", "key_id": "", "hash": ""}


def _event_new(**values: Any) -> AuditEvent:
    """A new, unsaved event with ``values`` (every field but its key, seq and hash), made as
    Django makes a model object less its per-field work: an event is a plain row (no
    defaults to compute, no signals on it), and ``AuditEvent(**values)`` was a fifth of
    appending a round's 20,000 events."""
    event = AuditEvent.__new__(AuditEvent)
    event._state = ModelState()
    event.__dict__.update(_UNSET, **values)
    return event


def record(
    *,
    actor: AbstractBaseUser | str | None,
    action: str,
    target: models.Model | None = None,
    object_type: str = "",
    object_id: str | int = "",
    tenant: models.Model | None = None,
    before: Any = None,
    after: Any = None,
) -> AuditEvent:
    """Append one event. ``actor`` is a user, a system label such as ``"beat"``, or None.

    ``before``/``after`` must be JSON values (ints, strings, lists, dicts); money is integer
    milli-credits. Must run inside the caller's transaction. Inside :func:`batch` the event
    is appended (and gets its seq and hash) when the batch ends.
    """
    if not transaction.get_connection().in_atomic_block:
        raise AuditError("audit.record must run inside the transaction of the change it records")
    if target is not None:
        object_type = object_type or target._meta.label_lower
        object_id = object_id or target.pk
    actor_id, actor_label = _actor_parts(actor)
    event = _event_new(
        created_at=timezone.now(),
        actor_id=actor_id,
        actor_label=actor_label,
        tenant_id=tenant.pk if tenant is not None else None,
        action=action,
        object_type=object_type,
        object_id=str(object_id),
        before=before,
        after=after,
    )
    pending = getattr(_batch, "events", None)
    if pending is not None and _savepoints(transaction.get_connection()) == _batch.savepoints:
        pending.append(event)
    else:
        _append([event])
        if pending is not None:
            _batch.head = None  # moved on: the batch reads it again
    return event
