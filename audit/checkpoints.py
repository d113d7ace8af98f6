"""Signed checkpoints of the audit log's head, exported to a file the application only appends
to (settings.GPUMARKET_AUDIT_CHECKPOINT_PATH).

A line says "at this moment the event with this seq had this hash", signed with the audit key.
The keyed chain stops anyone without the key from editing an event; a checkpoint also shows
when events were cut off the end of the log, or the tail rewritten, since it was taken.
"""

from __future__ import annotations

import fcntl
import json
import os
from dataclasses import dataclass
from datetime import datetime

from django.conf import settings
from django.utils import timezone

from audit.chain import checkpoint_body, mac, same
from audit.keys import UnknownKey, signing_key, verifying_key
from audit.models import AuditEvent, CheckpointRecord

# A checkpoint line is small; reading this much from the end always holds the last one.
_TAIL_BYTES = 4096


@dataclass(frozen=True)
class Checkpoint:
    line: int  # 1-based line number in the file, for messages
    seq: int
    hash: str
    taken_at: datetime
    key_id: str
    signature: str


class CheckpointError(ValueError):
    """A checkpoint line that is not what we wrote: unreadable, or its signature is wrong."""


def _path() -> str:
    return settings.GPUMARKET_AUDIT_CHECKPOINT_PATH


def _signature(*, seq: int, hash: str, taken_at: datetime, key_id: str, key: str) -> str:
    return mac(key, checkpoint_body(seq=seq, hash=hash, taken_at=taken_at, key_id=key_id))


def _parse(line_no: int, text: str) -> Checkpoint:
    try:
        raw = json.loads(text)
        checkpoint = Checkpoint(
            line=line_no,
            seq=int(raw["seq"]),
            hash=str(raw["hash"]),
            taken_at=datetime.fromisoformat(raw["taken_at"]),
            key_id=str(raw["key_id"]),
            signature=str(raw["signature"]),
        )
    except (ValueError, KeyError, TypeError) as exc:
        raise CheckpointError(f"checkpoint line {line_no} is unreadable ({exc})") from None
    try:
        key = verifying_key(checkpoint.key_id)
    except UnknownKey:
        raise CheckpointError(
            f"checkpoint line {line_no} names key {checkpoint.key_id!r}, which this "
            "installation does not hold (add it to GPUMARKET_AUDIT_KEYS)"
        ) from None
    if checkpoint.taken_at.tzinfo is None or not same(
        checkpoint.signature,
        _signature(
            seq=checkpoint.seq,
            hash=checkpoint.hash,
            taken_at=checkpoint.taken_at,
            key_id=checkpoint.key_id,
            key=key,
        ),
    ):
        raise CheckpointError(
            f"checkpoint line {line_no} (seq={checkpoint.seq}) has a bad signature: "
            "it was forged or edited"
        )
    return checkpoint


def checkpoints_read() -> list[Checkpoint]:
    """Every checkpoint in the file, each signature checked; [] when there is no file yet.

    Raises CheckpointError naming the first line that is not what we wrote.
    """
    try:
        with open(_path(), encoding="utf-8") as f:
            lines = f.read().splitlines()
    except FileNotFoundError:
        return []
    return [_parse(n, text) for n, text in enumerate(lines, start=1) if text.strip()]


def _last_seq(f) -> int:
    f.seek(0, os.SEEK_END)
    size = f.tell()
    f.seek(max(0, size - _TAIL_BYTES))
    tail = [line for line in f.read().decode("utf-8", "replace").splitlines() if line.strip()]
    if not tail:
        return 0
    try:
        return int(json.loads(tail[-1])["seq"])
    except (ValueError, KeyError, TypeError):
        return 0  # an unreadable last line: write a fresh checkpoint; verify-audit reports it


def checkpoint_write() -> Checkpoint | None:
    """Append a signed checkpoint of the current head, unless the head has not moved since the
    last one. Returns the checkpoint written, or None."""
    head = AuditEvent.objects.order_by("-seq").values("seq", "hash").first()
    if head is None:
        return None
    key_id, key = signing_key()
    taken_at = timezone.now()
    path = _path()
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    # Append mode only: this code never rewrites a line. The lock keeps two writers (beat and
    # the command) from interleaving or writing the same head twice.
    with open(path, "a+b") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        if _last_seq(f) >= head["seq"]:
            return None
        record = {
            "seq": head["seq"],
            "hash": head["hash"],
            "taken_at": taken_at.isoformat(timespec="microseconds"),
            "key_id": key_id,
            "signature": _signature(
                seq=head["seq"], hash=head["hash"], taken_at=taken_at, key_id=key_id, key=key
            ),
        }
        f.write((json.dumps(record, sort_keys=True) + "\n").encode())
        f.flush()
        os.fsync(f.fileno())
    CheckpointRecord.objects.get_or_create(seq=head["seq"], defaults={"taken_at": taken_at})
    return Checkpoint(
        line=0,
        seq=head["seq"],
        hash=head["hash"],
        taken_at=taken_at,
        key_id=key_id,
        signature=record["signature"],
    )


def checkpoint_store_problem(checkpoints: list[Checkpoint]) -> str:
    """Why the checkpoint file cannot vouch for the log's tail, or "" when it can.

    ``checkpoints`` is what ``checkpoints_read`` returned. Without a checkpoint a cut tail
    cannot be seen, so a file that is missing or empty while the log has events is a problem,
    and so is a file whose last checkpoint is older than the last one the database recorded.
    """
    path = _path()
    recorded = CheckpointRecord.objects.order_by("-seq").first()
    if not checkpoints:
        if not AuditEvent.objects.exists() and recorded is None:
            return ""
        state = "is missing" if not os.path.exists(path) else "is empty"
        after = (
            f"; the database recorded a checkpoint of seq {recorded.seq} at {recorded.taken_at:%Y-%m-%d %H:%M:%S %Z}"
            if recorded
            else "; on a new installation, run `gpumarket audit-checkpoint` to write the first"
        )
        return (
            f"the checkpoint file {path} {state}, so a cut or rewritten tail of the log cannot "
            f"be detected{after}. Restore the file from its copy, or check "
            "GPUMARKET_AUDIT_CHECKPOINT_PATH"
        )
    last = max(c.seq for c in checkpoints)
    if recorded is not None and last < recorded.seq:
        return (
            f"the checkpoint file {path} is behind: its last checkpoint is of seq {last}, but "
            f"the database recorded a checkpoint of seq {recorded.seq} at "
            f"{recorded.taken_at:%Y-%m-%d %H:%M:%S %Z}. The file lost lines (an old copy, or a "
            "cut tail): restore it from its copy"
        )
    return ""
