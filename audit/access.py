"""Who reads which part of the audit log.

Platform staff and auditors read all of it; a team's manager reads the events about the team
(filtered here, on the server, so another team's events never reach the page, the CSV or the
API); anyone else reads none. The audit app sits below tenants in the import order, so the
membership is read from the user (``user.membership``), not through tenants' helpers.
"""

from __future__ import annotations

from dataclasses import dataclass

from django.core.exceptions import ObjectDoesNotExist, PermissionDenied

from core.auth import is_auditor

MANAGER = "manager"


@dataclass(frozen=True)
class AuditScope:
    # None: the whole log; otherwise only this tenant's events.
    tenant_id: int | None
    # Verifying the chain reads every event, so it is for whole-log readers.
    may_verify: bool


def audit_scope(user) -> AuditScope:
    """The part of the log ``user`` may read; PermissionDenied if none."""
    if user is not None and user.is_authenticated:
        if user.is_staff or is_auditor(user):
            return AuditScope(tenant_id=None, may_verify=True)
        try:
            membership = user.membership
        except ObjectDoesNotExist:
            membership = None
        if membership is not None and membership.role == MANAGER:
            return AuditScope(tenant_id=membership.tenant_id, may_verify=False)
    raise PermissionDenied(
        "The audit log is for platform administrators, auditors, and a team's managers."
    )
