"""The audit tables are insert-and-select only for every role but their owner.

deploy/postgres/10-app-role.sh gives the application's role SELECT, INSERT, UPDATE and DELETE
on tables, including, through default privileges, tables that migrate creates later (compose
runs the script on the empty database, before migrate). On the audit tables only the
append-only trigger then stood between that role and an UPDATE or DELETE. This takes UPDATE,
DELETE and TRUNCATE on them back from every role that holds them other than the owner.
The script revokes them too, for a database migrated before it runs.
"""

from django.db import migrations

REVOKE = """
DO $$
DECLARE
  t text;
  r record;
BEGIN
  FOREACH t IN ARRAY ARRAY['audit_auditevent', 'audit_checkpointrecord'] LOOP
    FOR r IN
      SELECT DISTINCT grantee FROM information_schema.role_table_grants
      WHERE table_schema = current_schema() AND table_name = t
        AND privilege_type IN ('UPDATE', 'DELETE', 'TRUNCATE')
        AND grantee <> (SELECT tableowner FROM pg_tables
                        WHERE schemaname = current_schema() AND tablename = t)
    LOOP
      EXECUTE format('REVOKE UPDATE, DELETE, TRUNCATE ON %I FROM %I', t, r.grantee);
    END LOOP;
  END LOOP;
END
$$;
"""


def forward(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(REVOKE, params=None)  # no placeholders: %I is format()'s


class Migration(migrations.Migration):
    dependencies = [("audit", "0005_checkpoint_record")]
    operations = [migrations.RunPython(forward, migrations.RunPython.noop)]
