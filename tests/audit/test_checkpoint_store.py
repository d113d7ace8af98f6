"""verify-audit refuses to call a log intact when it cannot check the tail: the checkpoint
file is missing or empty, or it is behind the checkpoints the database recorded."""

from __future__ import annotations

from pathlib import Path

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

from audit.checkpoints import checkpoint_write
from tests.audit import chainkit

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def checkpoint_file(tmp_path, settings) -> Path:
    path = tmp_path / "audit-checkpoints.jsonl"
    settings.GPUMARKET_AUDIT_CHECKPOINT_PATH = str(path)
    return path


def _cut_from(event) -> None:
    """Delete ``event`` and every later one, as the owner."""
    chainkit.as_owner(("DELETE FROM audit_auditevent WHERE seq >= %s", [event.seq]))


def test_verify_audit_fails_when_the_checkpoint_file_is_missing(checkpoint_file):
    events = chainkit.events(6)
    _cut_from(events[3])
    assert not checkpoint_file.exists()
    with pytest.raises(CommandError, match="checkpoint file .* is missing"):
        call_command("verify_audit")


def test_verify_audit_fails_when_the_checkpoint_file_is_empty(checkpoint_file):
    events = chainkit.events(6)
    checkpoint_write()
    checkpoint_file.write_text("")
    _cut_from(events[3])
    with pytest.raises(CommandError, match="checkpoint file .* is empty"):
        call_command("verify_audit")


def test_verify_audit_fails_when_the_file_is_behind_the_databases_record(checkpoint_file):
    chainkit.events(3)
    checkpoint_write()
    first = checkpoint_file.read_text()
    events = chainkit.events(3)
    checkpoint_write()
    checkpoint_file.write_text(first)  # an old copy of the file, or its last line cut
    _cut_from(events[0])
    with pytest.raises(CommandError, match="behind"):
        call_command("verify_audit")


def test_verify_audit_passes_an_intact_log_with_its_checkpoints(capsys):
    chainkit.events(4)
    checkpoint_write()
    call_command("verify_audit")
    assert "audit chain intact" in capsys.readouterr().out
