"""``audit_chain_head`` runs the transaction's pending foreign-key checks before it takes the
chain's lock.

Every foreign key is checked at COMMIT (Django declares them ``DEFERRABLE INITIALLY
DEFERRED``), and the chain's lock is held until COMMIT: a transaction that wrote thousands of
rows before its events (a round's opening or settlement) checked them all while every other
audited write waited for the lock. ``SET CONSTRAINTS ALL IMMEDIATE`` runs the checks pending so
far, there and then; ``SET CONSTRAINTS ALL DEFERRED`` puts the rest of the transaction back as
it was (no constraint here is ``INITIALLY IMMEDIATE``; Django's own ``check_constraints`` uses
the same pair). A broken key is refused before the lock instead of at COMMIT; the events and
any row written after them are still checked at COMMIT."""

from django.db import migrations

PG_FORWARD = """
CREATE OR REPLACE FUNCTION audit_chain_head(lock_key bigint, OUT seq bigint, OUT hash varchar)
VOLATILE LANGUAGE plpgsql AS $$
BEGIN
  SET CONSTRAINTS ALL IMMEDIATE;
  SET CONSTRAINTS ALL DEFERRED;
  PERFORM pg_advisory_xact_lock(lock_key);
  SELECT e.seq, e.hash INTO seq, hash FROM audit_auditevent AS e ORDER BY e.seq DESC LIMIT 1;
END;
$$;
"""
PG_REVERSE = """
CREATE OR REPLACE FUNCTION audit_chain_head(lock_key bigint, OUT seq bigint, OUT hash varchar)
VOLATILE LANGUAGE plpgsql AS $$
BEGIN
  PERFORM pg_advisory_xact_lock(lock_key);
  SELECT e.seq, e.hash INTO seq, hash FROM audit_auditevent AS e ORDER BY e.seq DESC LIMIT 1;
END;
$$;
"""


def forward(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(PG_FORWARD)


def reverse(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(PG_REVERSE)


class Migration(migrations.Migration):
    dependencies = [("audit", "0006_app_role_insert_only")]
    operations = [migrations.RunPython(forward, reverse)]
