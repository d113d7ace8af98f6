"""Key the audit chain: every event gets the id of the key that signs it, and the events
already recorded (chained with plain SHA-256) are verified, then signed again with the current
key, in order, inside this migration's transaction. A broken unkeyed chain is refused rather
than blessed with a valid signature."""

import hashlib
import importlib
import json
from datetime import UTC

from django.db import migrations, models

from audit.chain import GENESIS_HASH, event_hash, fields_of
from audit.keys import signing_key

append_only = importlib.import_module("audit.migrations.0002_append_only")


def _unkeyed_hash(event) -> str:
    body = {
        "seq": event.seq,
        "created_at": event.created_at.astimezone(UTC).isoformat(timespec="microseconds"),
        "actor_id": event.actor_id,
        "actor_label": event.actor_label,
        "tenant_id": event.tenant_id,
        "action": event.action,
        "object_type": event.object_type,
        "object_id": event.object_id,
        "before": event.before,
        "after": event.after,
        "prev_hash": event.prev_hash,
    }
    encoded = json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(encoded.encode()).hexdigest()


def sign_existing(apps, schema_editor):
    AuditEvent = apps.get_model("audit", "AuditEvent")
    events = list(AuditEvent.objects.order_by("seq"))
    if not events:
        return
    prev = GENESIS_HASH
    for expected_seq, event in enumerate(events, start=1):
        if (
            event.seq != expected_seq
            or event.prev_hash != prev
            or _unkeyed_hash(event) != event.hash
        ):
            raise RuntimeError(
                f"the audit chain is already broken at seq={event.seq} (verify_audit of the "
                "previous release names the problem); it will not be signed with the new key"
            )
        prev = event.hash
    key_id, key = signing_key()
    # The append-only trigger refuses these updates; the migration runs as the tables' owner
    # and lifts it for this transaction only.
    vendor = schema_editor.connection.vendor
    if vendor == "postgresql":
        schema_editor.execute("ALTER TABLE audit_auditevent DISABLE TRIGGER audit_event_append_only")
    elif vendor == "sqlite":
        for statement in append_only.SQLITE_REVERSE:
            schema_editor.execute(statement)
    prev = GENESIS_HASH
    for event in events:
        event.prev_hash, event.key_id = prev, key_id
        event.hash = event_hash(key=key, **fields_of(event))
        prev = event.hash
    AuditEvent.objects.bulk_update(events, ["prev_hash", "hash", "key_id"], batch_size=500)
    if vendor == "postgresql":
        schema_editor.execute("ALTER TABLE audit_auditevent ENABLE TRIGGER audit_event_append_only")
    elif vendor == "sqlite":
        for statement in append_only.SQLITE_FORWARD:
            schema_editor.execute(statement)


class Migration(migrations.Migration):
    dependencies = [("audit", "0002_append_only")]
    operations = [
        migrations.AddField(
            model_name="auditevent",
            name="key_id",
            field=models.CharField(default="", max_length=32),
            preserve_default=False,
        ),
        migrations.RunPython(sign_existing, migrations.RunPython.noop),
    ]
