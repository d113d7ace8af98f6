"""Make audit events append-only in the database itself: an UPDATE or DELETE from any client
raises. (TRUNCATE, used by test isolation, is a separate privilege and stays possible.)"""

from django.db import migrations

PG_FORWARD = """
CREATE OR REPLACE FUNCTION audit_event_append_only() RETURNS trigger AS $$
BEGIN
  RAISE EXCEPTION 'audit events are append-only: %% refused on audit_auditevent', TG_OP;
END;
$$ LANGUAGE plpgsql;
CREATE TRIGGER audit_event_append_only
  BEFORE UPDATE OR DELETE ON audit_auditevent
  FOR EACH ROW EXECUTE FUNCTION audit_event_append_only();
"""
PG_REVERSE = """
DROP TRIGGER IF EXISTS audit_event_append_only ON audit_auditevent;
DROP FUNCTION IF EXISTS audit_event_append_only();
"""
SQLITE_FORWARD = [
    "CREATE TRIGGER audit_event_no_update BEFORE UPDATE ON audit_auditevent "
    "BEGIN SELECT RAISE(ABORT, 'audit events are append-only: UPDATE refused'); END;",
    "CREATE TRIGGER audit_event_no_delete BEFORE DELETE ON audit_auditevent "
    "BEGIN SELECT RAISE(ABORT, 'audit events are append-only: DELETE refused'); END;",
]
SQLITE_REVERSE = [
    "DROP TRIGGER IF EXISTS audit_event_no_update;",
    "DROP TRIGGER IF EXISTS audit_event_no_delete;",
]


def forward(apps, schema_editor):
    vendor = schema_editor.connection.vendor
    if vendor == "postgresql":
        schema_editor.execute(PG_FORWARD)
    elif vendor == "sqlite":
        for statement in SQLITE_FORWARD:
            schema_editor.execute(statement)


def reverse(apps, schema_editor):
    vendor = schema_editor.connection.vendor
    if vendor == "postgresql":
        schema_editor.execute(PG_REVERSE)
    elif vendor == "sqlite":
        for statement in SQLITE_REVERSE:
            schema_editor.execute(statement)


class Migration(migrations.Migration):
    dependencies = [("audit", "0001_initial")]
    operations = [migrations.RunPython(forward, reverse)]
