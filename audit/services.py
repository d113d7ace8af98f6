"""Recording audit events. ``record`` is called by every state-changing service, inside that
service's transaction, so the event and the change commit or roll back together."""

from __future__ import annotations

from typing import Any

from django.contrib.auth.models import AbstractBaseUser
from django.db import connection, models, transaction
from django.utils import timezone

from audit.chain import GENESIS_HASH, event_hash
from audit.keys import signing_key
from audit.models import AuditEvent

# Any fixed 64-bit key: the advisory lock that serialises appends to the chain on PostgreSQL.
_CHAIN_LOCK_KEY = 7_412_001


class AuditError(Exception):
    """The audit log could not be written or read as asked."""


def _lock_chain() -> None:
    # Appends must be serial for the chain to be linear. On PostgreSQL a transaction-scoped
    # advisory lock does that without a table lock; SQLite already serialises writers.
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_advisory_xact_lock(%s)", [_CHAIN_LOCK_KEY])


def _actor_parts(actor: AbstractBaseUser | str | None) -> tuple[int | None, str]:
    if actor is None:
        return None, "system"
    if isinstance(actor, str):
        return None, actor
    return actor.pk, actor.get_username()


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
    milli-credits. Must run inside the caller's transaction.
    """
    if not transaction.get_connection().in_atomic_block:
        raise AuditError("audit.record must run inside the transaction of the change it records")
    if target is not None:
        object_type = object_type or target._meta.label_lower
        object_id = object_id or target.pk
    _lock_chain()
    last = AuditEvent.objects.order_by("-seq").values("seq", "hash").first()
    seq = (last["seq"] + 1) if last else 1
    prev_hash = last["hash"] if last else GENESIS_HASH
    actor_id, actor_label = _actor_parts(actor)
    key_id, key = signing_key()
    fields = {
        "seq": seq,
        "created_at": timezone.now(),
        "actor_id": actor_id,
        "actor_label": actor_label,
        "tenant_id": tenant.pk if tenant is not None else None,
        "action": action,
        "object_type": object_type,
        "object_id": str(object_id),
        "before": before,
        "after": after,
        "prev_hash": prev_hash,
        "key_id": key_id,
    }
    return AuditEvent.objects.create(hash=event_hash(key=key, **fields), **fields)
