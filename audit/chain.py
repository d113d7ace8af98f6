"""Canonical form and keyed hashing of audit events and checkpoints. Pure: no database access.

Each event's hash is an HMAC-SHA256, under a key kept outside the database, of its canonical
form, which includes the previous event's hash. Whoever can rewrite the table can still not
produce the hashes of an edited event or of the events after it.
"""

import hashlib
import hmac
import json
from datetime import UTC, datetime
from typing import Any

GENESIS_HASH = "0" * 64

# What json.dumps(sort_keys=True, separators=(",", ":"), ensure_ascii=False) uses, made once:
# json.dumps makes a new encoder on every call with arguments of its own, a third of the cost
# of hashing a round's 20,000 events.
_ENCODER = json.JSONEncoder(sort_keys=True, separators=(",", ":"), ensure_ascii=False)
_encode_string = json.encoder.encode_basestring  # what _ENCODER writes a string as


def _dumps(body: dict[str, Any]) -> bytes:
    return _ENCODER.encode(body).encode()


def _utc(moment: datetime) -> str:
    if moment.tzinfo is None:
        raise ValueError("audit timestamps must be timezone-aware")
    return moment.astimezone(UTC).isoformat(timespec="microseconds")


def canonical(
    *,
    seq: int,
    created_at: datetime,
    actor_id: int | None,
    actor_label: str,
    tenant_id: int | None,
    action: str,
    object_type: str,
    object_id: str,
    before: Any,
    after: Any,
    prev_hash: str,
    key_id: str,
) -> bytes:
    """The bytes that are hashed: sorted keys, no whitespace, UTC microsecond timestamps.

    ``created_at`` must be timezone-aware.
    """
    return _dumps(
        {
            "seq": seq,
            "created_at": _utc(created_at),
            "actor_id": actor_id,
            "actor_label": actor_label,
            "tenant_id": tenant_id,
            "action": action,
            "object_type": object_type,
            "object_id": object_id,
            "before": before,
            "after": after,
            "prev_hash": prev_hash,
            "key_id": key_id,
        }
    )


def json_text(value: Any) -> str:
    """``value`` as the canonical form writes it: sorted keys, no whitespace. Also valid text
    for a JSON column, so an event's ``before`` and ``after`` are encoded once for both."""
    return "null" if value is None else _ENCODER.encode(value)


def canonical_encoded(*, before: str, after: str, **fields: Any) -> bytes:
    """The bytes of :func:`canonical` (``fields``: the others it takes), with ``before`` and
    ``after`` given as their ``json_text``: the keys written in their sorted order rather
    than sorted for each event, for the writer of many events at once. The verifier
    recomputes with :func:`canonical` itself, so a difference between the two would show
    as a broken chain."""
    text, key, v = _string, _key, fields
    return (
        f'{{"action":{text(v["action"])},"actor_id":{key(v["actor_id"])},'
        f'"actor_label":{text(v["actor_label"])},"after":{after},"before":{before},'
        f'"created_at":"{_utc(v["created_at"])}","key_id":{text(v["key_id"])},'
        f'"object_id":{text(v["object_id"])},"object_type":{text(v["object_type"])},'
        f'"prev_hash":{text(v["prev_hash"])},"seq":{key(v["seq"])},'
        f'"tenant_id":{key(v["tenant_id"])}}}'
    ).encode()


def _string(value: str) -> str:
    return _encode_string(value) if type(value) is str else _ENCODER.encode(value)


def _key(value: int | None) -> str:
    if value is None:
        return "null"
    return int.__repr__(value) if type(value) is int else _ENCODER.encode(value)


# What canonical() takes, as attributes of a stored event.
FIELDS = (
    "seq",
    "created_at",
    "actor_id",
    "actor_label",
    "tenant_id",
    "action",
    "object_type",
    "object_id",
    "before",
    "after",
    "prev_hash",
    "key_id",
)


def fields_of(event: Any) -> dict[str, Any]:
    """The hashed fields of a stored event (a model instance, or any object with them)."""
    return {name: getattr(event, name) for name in FIELDS}


def mac(key: str, body: bytes) -> str:
    return hmac.digest(key.encode(), body, hashlib.sha256).hex()


def event_hash(*, key: str, **fields: Any) -> str:
    """The keyed hash of one event; ``fields`` are those of :func:`canonical`."""
    return mac(key, canonical(**fields))


def checkpoint_body(*, seq: int, hash: str, taken_at: datetime, key_id: str) -> bytes:
    """What a checkpoint's signature covers: the head of the log at one moment."""
    return _dumps({"seq": seq, "hash": hash, "taken_at": _utc(taken_at), "key_id": key_id})


def same(a: str, b: str) -> bool:
    return hmac.compare_digest(a.encode(), b.encode())
