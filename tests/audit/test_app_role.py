"""The deployment's database roles (deploy/postgres/10-app-role.sh): the application's role
reads and writes rows but owns no table, so it can neither switch the append-only trigger off
nor drop it; only the owner, who runs migrations, could."""

from __future__ import annotations

import os
import subprocess
import uuid
from pathlib import Path

import psycopg
import pytest
from django.db import connection, transaction

import audit.services as audit
from audit.models import AuditEvent

pytestmark = pytest.mark.django_db(transaction=True)

SCRIPT = Path(__file__).resolve().parents[2] / "deploy" / "postgres" / "10-app-role.sh"


@pytest.fixture
def app_role():
    settings = connection.settings_dict
    role = f"gm_app_{uuid.uuid4().hex[:10]}"
    env = dict(
        os.environ,
        POSTGRES_USER=settings["USER"],
        POSTGRES_DB=settings["NAME"],
        APP_DB_ROLE=role,
        APP_DB_PASSWORD=uuid.uuid4().hex,
        PGHOST=settings["HOST"] or "127.0.0.1",
        PGPORT=str(settings["PORT"] or 5432),
    )
    subprocess.run(["sh", str(SCRIPT)], env=env, check=True, capture_output=True, text=True)
    dsn = (
        f"host={env['PGHOST']} port={env['PGPORT']} dbname={settings['NAME']} user={role} "
        f"password={env['APP_DB_PASSWORD']}"
    )
    try:
        yield dsn
    finally:
        with connection.cursor() as cursor:
            cursor.execute(f'DROP OWNED BY "{role}"')
            cursor.execute(f'DROP ROLE "{role}"')


def test_the_application_role_writes_rows_but_cannot_get_around_the_append_only_log(app_role):
    with transaction.atomic():
        event = audit.record(actor="test", action="test.event", after={"amount": 5})
    with psycopg.connect(app_role, autocommit=True) as conn:
        assert conn.execute("SELECT count(*) FROM audit_auditevent").fetchone()[0] >= 1
        conn.execute("UPDATE tenants_tenant SET weight = weight WHERE false")  # may write rows
        refused = [
            ("SET session_replication_role = replica", psycopg.errors.InsufficientPrivilege),
            (
                "ALTER TABLE audit_auditevent DISABLE TRIGGER audit_event_append_only",
                psycopg.errors.InsufficientPrivilege,
            ),
            (
                "DROP TRIGGER audit_event_append_only ON audit_auditevent",
                psycopg.errors.InsufficientPrivilege,
            ),
            (
                f"UPDATE audit_auditevent SET action = 'forged' WHERE id = {event.pk}",
                psycopg.errors.InsufficientPrivilege,
            ),
            (
                f"DELETE FROM audit_auditevent WHERE id = {event.pk}",
                psycopg.errors.InsufficientPrivilege,
            ),
            ("DELETE FROM audit_checkpointrecord", psycopg.errors.InsufficientPrivilege),
            ("TRUNCATE audit_auditevent", psycopg.errors.InsufficientPrivilege),
            ("CREATE TABLE forged (id int)", psycopg.errors.InsufficientPrivilege),
        ]
        for sql, error in refused:
            with pytest.raises(error):
                conn.execute(sql)
    assert AuditEvent.objects.get(pk=event.pk).action == "test.event"


def test_the_application_role_takes_the_chains_lock_and_reads_its_head(app_role):
    with transaction.atomic():
        event = audit.record(actor="test", action="test.event")
    with psycopg.connect(app_role) as conn:  # a transaction, as an append runs in
        head = conn.execute("SELECT seq, hash FROM audit_chain_head(%s)", [audit._CHAIN_LOCK_KEY])
        assert head.fetchone() == (event.seq, event.hash)


AUDIT_TABLES = ("audit_auditevent", "audit_checkpointrecord")


def _privileges(role: str, table: str) -> set[str]:
    held = set()
    with connection.cursor() as cursor:
        for privilege in ("SELECT", "INSERT", "UPDATE", "DELETE", "TRUNCATE"):
            cursor.execute("SELECT has_table_privilege(%s, %s, %s)", [role, table, privilege])
            if cursor.fetchone()[0]:
                held.add(privilege)
    return held


def test_the_application_role_may_only_insert_and_select_audit_rows(app_role):
    role = app_role.split("user=")[1].split()[0]
    for table in AUDIT_TABLES:
        assert _privileges(role, table) == {"SELECT", "INSERT"}, table


def test_audit_tables_created_after_the_role_are_insert_and_select_only(app_role):
    """compose runs the script on an empty database, before migrate creates the tables: the
    default privileges grant UPDATE and DELETE on them, and the audit migration takes those
    back from every role but the owner."""
    import importlib

    role = app_role.split("user=")[1].split()[0]
    revoke = importlib.import_module("audit.migrations.0006_app_role_insert_only").REVOKE
    with connection.cursor() as cursor:
        for table in AUDIT_TABLES:  # what the default privileges give a table created later
            cursor.execute(f'GRANT SELECT, INSERT, UPDATE, DELETE ON {table} TO "{role}"')
        cursor.execute(revoke)
    for table in AUDIT_TABLES:
        assert _privileges(role, table) == {"SELECT", "INSERT"}, table
