"""Reads for the allocation, fleet and enforcement pages and the API, already scoped and joined."""

from __future__ import annotations

from collections import defaultdict
from datetime import datetime

from django.db.models import OuterRef, QuerySet, Subquery

from market.models import Allocation
from market.placement import FreeGpu
from telemetry.models import (
    EnforcementAction,
    Gpu,
    Node,
    ProcessObservation,
    Sample,
    SampleMinute,
)
from tenants.access import access_object, scoped
from tenants.models import Tenant


def actions_for_tenant(*, tenant: Tenant) -> QuerySet[EnforcementAction]:
    """The enforcement actions taken on this tenant's work, newest first."""
    return scoped(
        EnforcementAction.objects.select_related("node", "gpu", "allocation"), tenant=tenant
    ).order_by("-created_at", "-id")


def actions_for_allocation(
    *, tenant: Tenant, allocation: Allocation
) -> QuerySet[EnforcementAction]:
    """The enforcement actions taken on one of the tenant's allocations, newest first."""
    return actions_for_tenant(tenant=tenant).filter(allocation=allocation)


def actions_recent(
    *,
    node: Node | None = None,
    action: str = "",
    state: str = "",
    tenant_id: int | None = None,
) -> QuerySet[EnforcementAction]:
    """Enforcement actions (admins), newest first, filtered by what is given."""
    qs = EnforcementAction.objects.select_related("node", "gpu", "tenant", "allocation")
    if node is not None:
        qs = qs.filter(node=node)
    if action:
        qs = qs.filter(action=action)
    if state:
        qs = qs.filter(state=state)
    if tenant_id is not None:
        qs = qs.filter(tenant_id=tenant_id)
    return qs.order_by("-created_at", "-id")


def nodes_list() -> QuerySet[Node]:
    return Node.objects.select_related("tier").order_by("name")


def gpus_list(*, node: Node | None = None) -> QuerySet[Gpu]:
    qs = Gpu.objects.select_related("node", "tier")
    if node is not None:
        qs = qs.filter(node=node)
    return qs.order_by("node__name", "index")


RUNNING = (Allocation.Status.ACTIVE, Allocation.Status.PAUSED)


def allocations_running_for_tenant(*, tenant: Tenant) -> list[Allocation]:
    """The tenant's active and paused allocations (whatever their window)."""
    return list(
        scoped(Allocation.objects.filter(status__in=RUNNING), tenant=tenant).select_related(
            "tier", "round"
        )
    )


def allocations_past_for_tenant(*, tenant: Tenant) -> QuerySet[Allocation]:
    return scoped(Allocation.objects.exclude(status__in=RUNNING), tenant=tenant).select_related(
        "tier", "round"
    )


def allocation_get(*, tenant: Tenant, allocation_id: object) -> Allocation:
    """The tenant's allocation, or Http404 (another tenant's looks missing)."""
    return access_object(
        Allocation.objects.select_related("tier", "round", "bid"), tenant=tenant, pk=allocation_id
    )


def allocation_gpu_ids(allocation_ids: list[int]) -> dict[int, set[int]]:
    """GPUs each allocation runs on: where its tagged processes were last seen, and where
    enforcement acted on it."""
    gpus: dict[int, set[int]] = defaultdict(set)
    for ref, gpu_id in ProcessObservation.objects.filter(
        allocation_ref__in=allocation_ids
    ).values_list("allocation_ref", "gpu_id"):
        gpus[ref].add(gpu_id)
    for ref, gpu_id in EnforcementAction.objects.filter(
        allocation_id__in=allocation_ids
    ).values_list("allocation_id", "gpu_id"):
        gpus[ref].add(gpu_id)
    return gpus


def gpus_get(*, gpu_ids: set[int]) -> list[Gpu]:
    return list(Gpu.objects.filter(pk__in=gpu_ids).select_related("node"))


def utilisation_latest(gpu_ids: set[int], *, since: datetime) -> dict[int, float]:
    """Each GPU's utilisation (percent) in its newest sample since ``since``."""
    latest = Sample.objects.filter(gpu=OuterRef("pk"), at__gte=since).order_by("-at")
    rows = (
        Gpu.objects.filter(pk__in=gpu_ids)
        .annotate(util=Subquery(latest.values("utilization_pct")[:1]))
        .values_list("pk", "util")
    )
    return {pk: util for pk, util in rows if util is not None}


def utilisation_series(
    labels: dict[int, str], *, start: datetime, end: datetime
) -> dict[str, list[tuple[datetime, float]]]:
    """Per-GPU utilisation over [start, end), keyed by ``labels[gpu id]``: minute rollups, or
    raw samples for GPUs whose minutes are not rolled up yet."""
    series: dict[str, list] = defaultdict(list)
    for gpu_id, minute, util in (
        SampleMinute.objects.filter(gpu_id__in=labels, minute__gte=start, minute__lt=end)
        .order_by("gpu_id", "minute")
        .values_list("gpu_id", "minute", "utilization_avg")
    ):
        series[labels[gpu_id]].append((minute, util))
    missing = [pk for pk, label in labels.items() if label not in series]
    for gpu_id, at, util in (
        Sample.objects.filter(gpu_id__in=missing, at__gte=start, at__lt=end)
        .order_by("gpu_id", "at")
        .values_list("gpu_id", "at", "utilization_pct")
    ):
        series[labels[gpu_id]].append((at, util))
    return dict(series)


def utilisation_by_minute(
    gpu_ids: list[int], *, minutes: list[datetime]
) -> dict[tuple[int, datetime], float]:
    """{(gpu id, minute): utilisation} from ``minutes[0]`` on: the minute rollup, or for a
    minute not rolled up yet the mean of its raw samples."""
    wanted = set(minutes)
    values: dict[tuple[int, datetime], float] = {}
    for gpu_id, minute, util in SampleMinute.objects.filter(
        gpu_id__in=gpu_ids, minute__gte=minutes[0]
    ).values_list("gpu_id", "minute", "utilization_avg"):
        if minute in wanted:
            values[(gpu_id, minute)] = util
    raw: dict[tuple[int, datetime], list[float]] = defaultdict(list)
    for gpu_id, at, util in Sample.objects.filter(
        gpu_id__in=gpu_ids, at__gte=minutes[0]
    ).values_list("gpu_id", "at", "utilization_pct"):
        raw[(gpu_id, at.replace(second=0, microsecond=0))].append(util)
    for key, utils in raw.items():
        if key[1] in wanted and values.get(key) is None:
            values[key] = sum(utils) / len(utils)
    return values


def placeable_gpus(tier_slug: str) -> list[FreeGpu]:
    """GPUs of a tier placement may use: healthy, not in maintenance, on a healthy node that
    is not revoked. One query."""
    rows = (
        Gpu.objects.filter(
            tier__slug=tier_slug,
            healthy=True,
            maintenance=False,
            node__healthy=True,
            node__revoked_at__isnull=True,
        )
        .order_by("node__name", "index")
        .values_list("node__name", "index", "uuid", "nvlink_domain")
    )
    return [FreeGpu(node, index, uuid, domain) for node, index, uuid, domain in rows]
