#!/bin/sh
# Runs once, when the database volume is created (the postgres image runs this directory's
# scripts as the owner, POSTGRES_USER). The application connects as a second role that may
# read and write rows but owns no table: it cannot drop or alter the audit log's append-only
# trigger, nor switch triggers off (session_replication_role needs a superuser). On the audit
# tables it may only insert and read. Only the migrate service connects as the owner.
# Outside compose, run it once against an existing database as its owner (the two GRANT ... ON
# ALL lines cover the tables already there):
#   POSTGRES_USER=owner POSTGRES_DB=gpumarket APP_DB_PASSWORD=... sh deploy/postgres/10-app-role.sh
set -eu
APP_DB_ROLE=${APP_DB_ROLE:-gpumarket_app}
psql -v ON_ERROR_STOP=1 --username "$POSTGRES_USER" --dbname "$POSTGRES_DB" <<SQL
CREATE ROLE "${APP_DB_ROLE}" LOGIN PASSWORD '${APP_DB_PASSWORD}';
GRANT CONNECT ON DATABASE "${POSTGRES_DB}" TO "${APP_DB_ROLE}";
GRANT USAGE ON SCHEMA public TO "${APP_DB_ROLE}";
GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA public TO "${APP_DB_ROLE}";
GRANT USAGE, SELECT ON ALL SEQUENCES IN SCHEMA public TO "${APP_DB_ROLE}";
ALTER DEFAULT PRIVILEGES FOR ROLE "${POSTGRES_USER}" IN SCHEMA public
  GRANT SELECT, INSERT, UPDATE, DELETE ON TABLES TO "${APP_DB_ROLE}";
ALTER DEFAULT PRIVILEGES FOR ROLE "${POSTGRES_USER}" IN SCHEMA public
  GRANT USAGE, SELECT ON SEQUENCES TO "${APP_DB_ROLE}";
-- The audit tables are insert-and-select only. On a database migrated already, take UPDATE
-- and DELETE back here; on an empty one, migration audit/0006 does it once it creates them.
DO \$\$
DECLARE t text;
BEGIN
  FOREACH t IN ARRAY ARRAY['audit_auditevent', 'audit_checkpointrecord'] LOOP
    IF to_regclass(t) IS NOT NULL THEN
      EXECUTE format('REVOKE UPDATE, DELETE, TRUNCATE ON %I FROM %I', t, '${APP_DB_ROLE}');
    END IF;
  END LOOP;
END
\$\$;
SQL
