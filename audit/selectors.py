"""Reading the audit log: chain verification and filtered review."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from django.apps import apps
from django.db.models import QuerySet

from audit.access import AuditScope
from audit.chain import GENESIS_HASH, event_hash, fields_of, same
from audit.checkpoints import CheckpointError, checkpoints_read
from audit.keys import UnknownKey, verifying_key
from audit.models import AuditEvent


@dataclass(frozen=True)
class ChainReport:
    checked: int
    ok: bool
    first_bad_seq: int | None = None
    first_bad_id: int | None = None
    problem: str = ""
    # Signed head checkpoints the log was checked against (audit/checkpoints.py).
    checkpoints: int = 0

    def describe(self) -> str:
        if self.ok:
            against = (
                f" against {self.checkpoints} signed checkpoints"
                if self.checkpoints
                else " (no signed checkpoints yet: a cut tail could not be detected)"
            )
            return f"audit chain intact: {self.checked} events verified{against}"
        where = f"seq={self.first_bad_seq}"
        if self.first_bad_id is not None:
            where += f" (id={self.first_bad_id})"
        return f"audit chain broken at event {where}: {self.problem}"


def _iter_events() -> Iterator[AuditEvent]:
    # Physical id order: an attacker who rewrites seq numbers to hide a reordering still has
    # to keep ids, which come from the database sequence.
    return AuditEvent.objects.order_by("id").iterator(chunk_size=2000)


def _when(moment: datetime) -> str:
    return moment.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def _recomputed(event: AuditEvent) -> str:
    return event_hash(key=verifying_key(event.key_id), **fields_of(event))


def chain_verify() -> ChainReport:
    """Walk the whole log and name the first event that is not what the chain says.

    Detects an edited event (its keyed hash no longer matches its content: whoever edited it
    did not hold the key), a deleted one (a gap in seq, or a prev_hash that is not the previous
    event's hash), an inserted one, a reordering (seq out of order, or links that do not
    follow), and, against the signed checkpoints, a tail cut off or rewritten since one was
    taken.
    """
    try:
        checkpoints = {c.seq: c for c in checkpoints_read()}
    except CheckpointError as exc:
        return ChainReport(checked=0, ok=False, problem=str(exc))
    prev_hash = GENESIS_HASH
    expected_seq = 1
    checked = 0
    for event in _iter_events():
        checked += 1

        def bad(problem: str, event: AuditEvent = event, checked: int = checked) -> ChainReport:
            return ChainReport(
                checked=checked,
                ok=False,
                first_bad_seq=event.seq,
                first_bad_id=event.pk,
                problem=problem,
                checkpoints=len(checkpoints),
            )

        try:
            recomputed = _recomputed(event)
        except UnknownKey:
            return bad(
                f"it names key {event.key_id!r}, which this installation does not hold: it was "
                "forged, or GPUMARKET_AUDIT_KEYS lost a key that signed it"
            )
        if not same(recomputed, event.hash):
            return bad(
                "its content does not match its keyed hash: the event was edited, or its hash "
                "recomputed by someone without the audit key"
            )
        if event.seq != expected_seq:
            if event.seq > expected_seq:
                return bad(
                    f"expected seq {expected_seq} here: event(s) before it were deleted"
                    " or the log was reordered"
                )
            return bad(f"seq {event.seq} comes after seq {expected_seq - 1}: the log was reordered")
        if event.prev_hash != prev_hash:
            return bad("its link to the previous event is wrong (an event was inserted or removed)")
        checkpoint = checkpoints.get(event.seq)
        if checkpoint is not None and not same(checkpoint.hash, event.hash):
            return bad(
                f"checkpoint line {checkpoint.line}, signed at {_when(checkpoint.taken_at)}, "
                "holds another hash for this event: the log was rewritten"
            )
        prev_hash = event.hash
        expected_seq += 1
    head = expected_seq - 1
    beyond = [c for c in checkpoints.values() if c.seq > head]
    if beyond:
        last = max(beyond, key=lambda c: c.seq)
        return ChainReport(
            checked=checked,
            ok=False,
            first_bad_seq=last.seq,
            problem=(
                f"the log was truncated: it ends at seq {head}, but checkpoint line {last.line}, "
                f"signed at {_when(last.taken_at)}, saw it reach seq {last.seq}"
            ),
            checkpoints=len(checkpoints),
        )
    return ChainReport(checked=checked, ok=True, checkpoints=len(checkpoints))


def events_filter(
    *,
    actor: str = "",
    tenant_id: int | None = None,
    action: str = "",
    object_type: str = "",
    object_id: str = "",
    since: datetime | None = None,
    until: datetime | None = None,
) -> QuerySet[AuditEvent]:
    qs = AuditEvent.objects.select_related("tenant").order_by("-seq")
    if actor:
        qs = qs.filter(actor_label__icontains=actor)
    if tenant_id is not None:
        qs = qs.filter(tenant_id=tenant_id)
    if action:
        qs = qs.filter(action__icontains=action)
    if object_type:
        qs = qs.filter(object_type__icontains=object_type)
    if object_id:
        qs = qs.filter(object_id=object_id)
    if since is not None:
        qs = qs.filter(created_at__gte=since)
    if until is not None:
        qs = qs.filter(created_at__lt=until)
    return qs


def tenants_in_scope(*, scope: AuditScope | None) -> QuerySet[Any]:
    """The tenants a reader with ``scope`` may filter the log by, by name: every tenant, or
    the manager's own team."""
    # audit sits below tenants in the import order, so the model is looked up, not imported.
    tenants = apps.get_model("tenants", "Tenant").objects.order_by("name")
    if scope is not None and scope.tenant_id is not None:
        tenants = tenants.filter(pk=scope.tenant_id)
    return tenants


def events_in_scope(*, scope: AuditScope) -> QuerySet[AuditEvent]:
    """The events a reader with ``scope`` may open: the whole log, or the manager's team's."""
    events = AuditEvent.objects.all()
    return events if scope.tenant_id is None else events.filter(tenant_id=scope.tenant_id)
