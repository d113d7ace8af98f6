"""Canonical form and hashing of audit events. Pure: no database access."""

import hashlib
import json
from datetime import UTC, datetime
from typing import Any

GENESIS_HASH = "0" * 64


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
) -> bytes:
    """The bytes that are hashed: sorted keys, no whitespace, UTC microsecond timestamps.

    ``created_at`` must be timezone-aware.
    """
    if created_at.tzinfo is None:
        raise ValueError("audit timestamps must be timezone-aware")
    body = {
        "seq": seq,
        "created_at": created_at.astimezone(UTC).isoformat(timespec="microseconds"),
        "actor_id": actor_id,
        "actor_label": actor_label,
        "tenant_id": tenant_id,
        "action": action,
        "object_type": object_type,
        "object_id": object_id,
        "before": before,
        "after": after,
        "prev_hash": prev_hash,
    }
    return json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


def event_hash(**fields: Any) -> str:
    return hashlib.sha256(canonical(**fields)).hexdigest()
