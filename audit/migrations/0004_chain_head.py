"""``audit_chain_head(lock_key)``: the chain's lock and its head in one round trip.

An append took the chain's advisory lock, then read the head (seq and hash of the last event)
in a second statement. Both now run in one call. The function is VOLATILE, so its second
statement takes a snapshot of its own, after the lock is granted, and sees the event that the
lock's previous holder committed; a single ``SELECT`` doing both would read the head as of
its start, before the wait. The application's role may execute it (functions are executable by
every role unless revoked), and it runs with the caller's rights."""

from django.db import migrations

PG_FORWARD = """
CREATE FUNCTION audit_chain_head(lock_key bigint, OUT seq bigint, OUT hash varchar)
VOLATILE LANGUAGE plpgsql AS $$
BEGIN
  PERFORM pg_advisory_xact_lock(lock_key);
  SELECT e.seq, e.hash INTO seq, hash FROM audit_auditevent AS e ORDER BY e.seq DESC LIMIT 1;
END;
$$;
"""
PG_REVERSE = "DROP FUNCTION IF EXISTS audit_chain_head(bigint);"


def forward(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(PG_FORWARD)


def reverse(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(PG_REVERSE)


class Migration(migrations.Migration):
    dependencies = [("audit", "0003_keyed_chain")]
    operations = [migrations.RunPython(forward, reverse)]
