"""Reads of change requests: the staff queue, a team's own requests."""

from __future__ import annotations

from django.db.models import QuerySet

from governance.models import ChangeRequest
from tenants.models import Tenant


def requests_all(*, status: str = "") -> QuerySet[ChangeRequest]:
    qs = ChangeRequest.objects.select_related("requested_by", "decided_by", "tenant")
    return qs.filter(status=status) if status else qs


def requests_pending() -> QuerySet[ChangeRequest]:
    """The requests awaiting a decision, the soonest to expire first."""
    return requests_all(status=ChangeRequest.Status.PENDING).order_by("expires_at", "pk")


def requests_decided(*, status: str = "") -> QuerySet[ChangeRequest]:
    """The requests in ``status``, or every request no longer pending when it is empty."""
    if status:
        return requests_all(status=status)
    return requests_all().exclude(status=ChangeRequest.Status.PENDING)


def requests_of_team(*, tenant: Tenant) -> QuerySet[ChangeRequest]:
    """The team's requests: the credits its managers asked for and every change about it."""
    return requests_all().filter(tenant=tenant)
