"""Reads for the fleet and enforcement pages and the API, already scoped and joined."""

from __future__ import annotations

from datetime import datetime

from django.db.models import QuerySet

from market.models import Allocation
from telemetry.models import EnforcementAction, Gpu, Node, ProcessObservation, Sample
from tenants.access import scoped
from tenants.models import Tenant


def actions_for_tenant(*, tenant: Tenant) -> QuerySet[EnforcementAction]:
    """The enforcement actions taken on this tenant's work, newest first."""
    return scoped(
        EnforcementAction.objects.select_related("node", "gpu", "allocation"), tenant=tenant
    ).order_by("-created_at", "-id")


def actions_recent(*, node: Node | None = None) -> QuerySet[EnforcementAction]:
    """Every enforcement action (admins), newest first."""
    qs = EnforcementAction.objects.select_related("node", "gpu", "tenant", "allocation")
    if node is not None:
        qs = qs.filter(node=node)
    return qs.order_by("-created_at", "-id")


def nodes_list() -> QuerySet[Node]:
    return Node.objects.select_related("tier").order_by("name")


def gpus_list(*, node: Node | None = None) -> QuerySet[Gpu]:
    qs = Gpu.objects.select_related("node", "tier")
    if node is not None:
        qs = qs.filter(node=node)
    return qs.order_by("node__name", "index")


def processes_for_tenant(*, tenant: Tenant) -> QuerySet[ProcessObservation]:
    """This tenant's processes as last observed (those tagged with one of its allocations)."""
    allocation_ids = Allocation.objects.filter(tenant=tenant).values("pk")
    return (
        ProcessObservation.objects.filter(allocation_ref__in=allocation_ids)
        .select_related("gpu", "node")
        .order_by("gpu__node__name", "gpu__index", "pid")
    )


def samples_between(*, gpu: Gpu, start: datetime, end: datetime) -> QuerySet[Sample]:
    return Sample.objects.filter(gpu=gpu, at__gte=start, at__lt=end).order_by("at")
