"""Change requests: asked for, approved (and applied) or rejected by a second person, expired.

Each step is one transaction with its audit event, which names both people. The request row is
locked while it is decided, so a replayed or concurrent approval finds it decided and is
refused, and a change is applied at most once.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.contrib.auth.models import AbstractBaseUser
from django.db import transaction
from django.utils import timezone

import audit.services as audit
from core.auth import is_auditor
from governance.errors import GovernanceError
from governance.kinds import KINDS
from governance.models import ChangeRequest
from governance.rules import approval_needed
from tenants.access import manager_tenant_of

Kind = ChangeRequest.Kind
Status = ChangeRequest.Status
JUSTIFICATION_MAX = 1000


def approval_ttl() -> timedelta:
    return timedelta(hours=getattr(settings, "GPUMARKET_APPROVAL_HOURS", 72))


def _who(user: AbstractBaseUser | None) -> str | None:
    return user.get_username() if user is not None else None


def _may_request(kind: str, actor: AbstractBaseUser, tenant) -> None:
    if is_auditor(actor):
        raise GovernanceError("The auditor role reads; it requests no changes.")
    if kind == Kind.TEAM_CREDITS:
        team = manager_tenant_of(actor)
        if team is None or tenant is None or team.pk != tenant.pk:
            raise GovernanceError("tenant: only the team's own manager asks credits for it")
    elif not actor.is_staff:
        raise GovernanceError("Only platform administrators request this change.")


@transaction.atomic
def change_request(
    *,
    kind: str,
    actor: AbstractBaseUser,
    justification: str,
    payload: dict[str, Any],
    now: datetime | None = None,
) -> ChangeRequest:
    """Ask for a change; it waits for someone else's approval until it expires. When the rule
    in force needs no second person for it (a kind left out, a grant below the threshold), it
    is applied at once, in this transaction, and recorded as such."""
    spec = KINDS.get(kind)
    if spec is None:
        raise GovernanceError(f"kind: one of {sorted(KINDS)}, got {kind!r}")
    justification = (justification or "").strip()
    if not justification:
        raise GovernanceError("justification: say why the change is needed")
    if len(justification) > JUSTIFICATION_MAX:
        raise GovernanceError(f"justification: at most {JUSTIFICATION_MAX} characters")
    prepared = spec.prepare(dict(payload))
    _may_request(kind, actor, prepared.tenant)
    needed = approval_needed(kind, amount=prepared.amount, raise_by=prepared.raise_by)
    now = now or timezone.now()
    req = ChangeRequest.objects.create(
        needed_approval=needed,
        kind=kind,
        tenant=prepared.tenant,
        payload=prepared.payload,
        before=prepared.before,
        summary=prepared.summary[:300],
        justification=justification,
        requested_by=actor,
        created_at=now,
        expires_at=now + approval_ttl(),
    )
    audit.record(
        actor=actor,
        action="approval.request",
        target=req,
        tenant=prepared.tenant,
        before=prepared.before,
        after={
            "kind": kind,
            "change": prepared.payload,
            "summary": req.summary,
            "justification": justification,
            "requested_by": actor.get_username(),
            "expires_at": req.expires_at.isoformat(),
            "needs_approval": needed,
        },
    )
    if not needed:
        # The rule in force asks no second person: one administrator's change, applied now.
        result = KINDS[kind].apply(req, actor)
        req.status, req.decided_at = Status.APPLIED, now
        req.decision_note = "No second approval needed under the rule in force."
        req.save(update_fields=["status", "decided_at", "decision_note"])
        audit.record(
            actor=actor,
            action="approval.apply",
            target=req,
            tenant=prepared.tenant,
            before={"status": Status.PENDING},
            after=_event(req, status=req.status, result=result),
        )
    return req


def _locked_pending(pk: int) -> ChangeRequest:
    """The request, locked; refused unless it still waits."""
    req = (
        ChangeRequest.objects.select_for_update(of=("self",))
        .select_related("requested_by", "decided_by", "tenant")
        .filter(pk=pk)
        .first()
    )
    if req is None:
        raise GovernanceError(f"No change request #{pk}.")
    if req.status != Status.PENDING:
        by = f" by {_who(req.decided_by)}" if req.decided_by_id else ""
        when = f" on {req.decided_at:%Y-%m-%d %H:%M} UTC" if req.decided_at else ""
        raise GovernanceError(
            f"Change request #{req.pk} is already {req.get_status_display().lower()}{by}{when}; "
            "it cannot be decided again."
        )
    return req


def _locked_for_decision(*, pk: int, actor: AbstractBaseUser, now: datetime) -> ChangeRequest:
    if not actor.is_staff or is_auditor(actor):
        raise GovernanceError("Only platform administrators approve or reject changes.")
    req = _locked_pending(pk)
    if req.expires_at <= now:
        raise GovernanceError(
            f"Change request #{req.pk} expired on {req.expires_at:%Y-%m-%d %H:%M} UTC; "
            "request it again if it is still needed."
        )
    if req.requested_by_id == actor.pk:
        raise GovernanceError(
            f"You asked for change request #{req.pk}; another administrator must decide it."
        )
    return req


def _event(req: ChangeRequest, **extra: Any) -> dict[str, Any]:
    return {
        "kind": req.kind,
        "summary": req.summary,
        "requested_by": _who(req.requested_by),
        "decided_by": _who(req.decided_by),
        **extra,
    }


@transaction.atomic
def change_approve(
    *, pk: int, actor: AbstractBaseUser, note: str = "", now: datetime | None = None
) -> ChangeRequest:
    """Approve someone else's pending request and apply it, in this one transaction: if the
    change is refused (it moved since, or its service says no) nothing is written and the
    request stays pending."""
    now = now or timezone.now()
    req = _locked_for_decision(pk=pk, actor=actor, now=now)
    result = KINDS[req.kind].apply(req, actor)
    req.status, req.decided_by, req.decided_at = Status.APPLIED, actor, now
    req.decision_note = (note or "").strip()[:500]
    req.save(update_fields=["status", "decided_by", "decided_at", "decision_note"])
    audit.record(
        actor=actor,
        action="approval.approve",
        target=req,
        tenant=req.tenant,
        before={"status": Status.PENDING},
        after=_event(req, status=req.status, result=result, note=req.decision_note),
    )
    return req


@transaction.atomic
def change_reject(
    *, pk: int, actor: AbstractBaseUser, note: str, now: datetime | None = None
) -> ChangeRequest:
    now = now or timezone.now()
    note = (note or "").strip()
    if not note:
        raise GovernanceError("note: say why the change is rejected")
    req = _locked_for_decision(pk=pk, actor=actor, now=now)
    req.status, req.decided_by, req.decided_at = Status.REJECTED, actor, now
    req.decision_note = note[:500]
    req.save(update_fields=["status", "decided_by", "decided_at", "decision_note"])
    audit.record(
        actor=actor,
        action="approval.reject",
        target=req,
        tenant=req.tenant,
        before={"status": Status.PENDING},
        after=_event(req, status=req.status, note=req.decision_note),
    )
    return req


@transaction.atomic
def change_withdraw(
    *, pk: int, actor: AbstractBaseUser, now: datetime | None = None
) -> ChangeRequest:
    """The person who asked takes a request back while it waits; it is never applied. Nobody
    decides it, so it names no second person."""
    now = now or timezone.now()
    req = _locked_pending(pk)
    if req.requested_by_id != actor.pk:
        raise GovernanceError(
            f"{_who(req.requested_by)} asked for change request #{req.pk}; only they withdraw it."
        )
    req.status, req.decided_at = Status.WITHDRAWN, now
    req.save(update_fields=["status", "decided_at"])
    audit.record(
        actor=actor,
        action="approval.withdraw",
        target=req,
        tenant=req.tenant,
        before={"status": Status.PENDING},
        after=_event(req, status=req.status),
    )
    return req


@transaction.atomic
def changes_expire(*, now: datetime | None = None) -> int:
    """Mark every pending request past its expiry as expired (beat runs this); returns how many."""
    now = now or timezone.now()
    due = list(
        ChangeRequest.objects.select_for_update(skip_locked=True, of=("self",))
        .select_related("requested_by", "tenant")
        .filter(status=Status.PENDING, expires_at__lte=now)
        .order_by("pk")
    )
    with audit.batch():
        for req in due:
            req.status, req.decided_at = Status.EXPIRED, now
            req.save(update_fields=["status", "decided_at"])
            audit.record(
                actor="beat",
                action="approval.expire",
                target=req,
                tenant=req.tenant,
                before={"status": Status.PENDING},
                after=_event(req, status=req.status, expires_at=req.expires_at.isoformat()),
            )
    return len(due)
