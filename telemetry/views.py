"""Allocation usage (tenants) and the fleet and enforcement pages (platform staff).

Allocations are shown here rather than in market because their utilisation comes from
telemetry, and telemetry is the app allowed to read both.
"""

from __future__ import annotations

from collections import defaultdict
from datetime import datetime, timedelta

from django.conf import settings
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.paginator import Paginator
from django.db.models import OuterRef, Subquery
from django.http import HttpRequest, HttpResponse, HttpResponseBadRequest
from django.shortcuts import get_object_or_404, redirect, render
from django.utils import timezone
from django.utils.crypto import constant_time_compare
from django.views.decorators.http import require_GET, require_POST

from core.auth import staff_required
from core.charts import figure_html
from market.models import Allocation
from telemetry.charts import gpu_heatmap, utilisation_lines
from telemetry.errors import TelemetryError
from telemetry.metrics import metrics_render
from telemetry.models import EnforcementAction, Gpu, ProcessObservation, Sample, SampleMinute
from telemetry.selectors import actions_for_tenant, actions_recent, gpus_list, nodes_list
from telemetry.services import gpu_maintenance_set
from tenants.access import access_object, require_tenant, scoped

RUNNING = (Allocation.Status.ACTIVE, Allocation.Status.PAUSED)
HEATMAP_MINUTES = 60
LIVE_WINDOW = timedelta(minutes=5)


def _gpu_label(gpu: Gpu) -> str:
    return f"{gpu.node.name}/{gpu.index}" + (" (simulated)" if gpu.node.simulated else "")


def _allocation_gpu_ids(allocation_ids: list[int]) -> dict[int, set[int]]:
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


def _latest_utilisation(gpu_ids: set[int], *, since: datetime) -> dict[int, float]:
    latest = Sample.objects.filter(gpu=OuterRef("pk"), at__gte=since).order_by("-at")
    rows = (
        Gpu.objects.filter(pk__in=gpu_ids)
        .annotate(util=Subquery(latest.values("utilization_pct")[:1]))
        .values_list("pk", "util")
    )
    return {pk: util for pk, util in rows if util is not None}


def _running_rows(tenant) -> list[dict]:
    allocations = list(
        scoped(Allocation.objects.filter(status__in=RUNNING), tenant=tenant).select_related(
            "tier", "round"
        )
    )
    gpus = _allocation_gpu_ids([a.pk for a in allocations])
    utilisation = _latest_utilisation(
        set().union(*gpus.values()) if gpus else set(), since=timezone.now() - LIVE_WINDOW
    )
    rows = []
    for a in allocations:
        values = [utilisation[g] for g in gpus.get(a.pk, ()) if g in utilisation]
        rows.append(
            {
                "allocation": a,
                "gpus_seen": len(values),
                "utilisation": sum(values) / len(values) if values else None,
            }
        )
    return rows


@require_GET
@login_required
def allocations_live(request: HttpRequest) -> HttpResponse:
    """The dashboard's live panel (htmx fragment): running allocations and their utilisation now."""
    tenant = require_tenant(request.user)
    return render(request, "telemetry/_allocations_live.html", {"rows": _running_rows(tenant)})


@require_GET
@login_required
def allocation_list(request: HttpRequest) -> HttpResponse:
    tenant = require_tenant(request.user)
    finished = scoped(Allocation.objects.exclude(status__in=RUNNING), tenant=tenant).select_related(
        "tier", "round"
    )
    return render(
        request,
        "telemetry/allocation_list.html",
        {
            "rows": _running_rows(tenant),
            "page": Paginator(finished, 25).get_page(request.GET.get("page")),
            "actions": actions_for_tenant(tenant=tenant)[:20],
        },
    )


def _utilisation_series(gpus: list[Gpu], *, start: datetime, end: datetime) -> dict[str, list]:
    """Per-GPU utilisation over [start, end): minute rollups, or raw samples for GPUs whose
    minutes are not rolled up yet."""
    labels = {g.pk: _gpu_label(g) for g in gpus}
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


@require_GET
@login_required
def allocation_detail(request: HttpRequest, pk: int) -> HttpResponse:
    tenant = require_tenant(request.user)
    allocation = access_object(
        Allocation.objects.select_related("tier", "round", "bid"), tenant=tenant, pk=pk
    )
    gpu_ids = _allocation_gpu_ids([allocation.pk]).get(allocation.pk, set())
    gpus = list(Gpu.objects.filter(pk__in=gpu_ids).select_related("node"))
    end = min(timezone.now(), allocation.ends_at)
    series = (
        _utilisation_series(gpus, start=allocation.starts_at, end=end)
        if end > allocation.starts_at
        else {}
    )
    chart = (
        figure_html(utilisation_lines(series), element_id="allocation-utilisation")
        if series
        else ""
    )
    return render(
        request,
        "telemetry/allocation_detail.html",
        {
            "allocation": allocation,
            "gpus": [_gpu_label(g) for g in gpus],
            "chart": chart,
            "actions": actions_for_tenant(tenant=tenant).filter(allocation=allocation),
        },
    )


# Platform staff ----------------------------------------------------------------------------


def _heatmap(gpus: list[Gpu], *, now: datetime) -> str:
    """Utilisation of every GPU over the last hour, one cell per minute."""
    start = (now - timedelta(minutes=HEATMAP_MINUTES)).replace(second=0, microsecond=0)
    minutes = [start + timedelta(minutes=i) for i in range(HEATMAP_MINUTES + 1)]
    index = {m: i for i, m in enumerate(minutes)}
    rows = {g.pk: i for i, g in enumerate(gpus)}
    values: list[list[float | None]] = [[None] * len(minutes) for _ in gpus]
    for gpu_id, minute, util in SampleMinute.objects.filter(
        gpu_id__in=rows, minute__gte=start
    ).values_list("gpu_id", "minute", "utilization_avg"):
        if minute in index:
            values[rows[gpu_id]][index[minute]] = util
    # Minutes not rolled up yet: average the raw samples of that minute.
    raw: dict[tuple[int, datetime], list[float]] = defaultdict(list)
    for gpu_id, at, util in Sample.objects.filter(gpu_id__in=rows, at__gte=start).values_list(
        "gpu_id", "at", "utilization_pct"
    ):
        raw[(gpu_id, at.replace(second=0, microsecond=0))].append(util)
    for (gpu_id, minute), utils in raw.items():
        if minute in index and values[rows[gpu_id]][index[minute]] is None:
            values[rows[gpu_id]][index[minute]] = sum(utils) / len(utils)
    fig = gpu_heatmap(gpus=[_gpu_label(g) for g in gpus], minutes=minutes, values=values)
    return figure_html(fig, element_id="gpu-heatmap")


@require_GET
@staff_required
def fleet(request: HttpRequest) -> HttpResponse:
    now = timezone.now()
    gpus = list(gpus_list())
    per_node: dict[int, int] = defaultdict(int)
    for g in gpus:
        per_node[g.node_id] += 1
    nodes = [{"node": n, "gpus": per_node.get(n.pk, 0)} for n in nodes_list()]
    return render(
        request,
        "telemetry/fleet.html",
        {
            "nodes": nodes,
            "gpus": gpus,
            "heatmap": _heatmap(gpus, now=now) if gpus else "",
            "any_simulated": any(row["node"].simulated for row in nodes),
        },
    )


# The form posts the state wanted, not "toggle": a double submit or a stale page cannot flip
# a GPU back the other way.
MAINTENANCE_CHOICES = {"on": True, "off": False}


@require_POST
@staff_required
def gpu_maintenance(request: HttpRequest, pk: int) -> HttpResponse:
    """Put a GPU in maintenance or return it to service (out of / back in its tier's capacity)."""
    gpu = get_object_or_404(Gpu.objects.select_related("node", "tier"), pk=pk)
    wanted = request.POST.get("maintenance", "")
    if wanted not in MAINTENANCE_CHOICES:
        return HttpResponseBadRequest(
            f"maintenance must be 'on' or 'off', got {wanted!r}\n", content_type="text/plain"
        )
    try:
        gpu_maintenance_set(gpu=gpu, maintenance=MAINTENANCE_CHOICES[wanted], actor=request.user)
    except TelemetryError as exc:
        messages.error(request, str(exc))
    else:
        gpu.tier.refresh_from_db()
        state = "is in maintenance" if gpu.maintenance else "is back in service"
        messages.success(
            request,
            f"GPU {_gpu_label(gpu)} {state}; tier {gpu.tier.slug} now offers "
            f"{gpu.tier.offered} GPU(s) to the next rounds.",
        )
    return redirect("fleet")


@require_GET
@staff_required
def enforcement_list(request: HttpRequest) -> HttpResponse:
    page = Paginator(actions_recent(), 50).get_page(request.GET.get("page"))
    return render(request, "telemetry/enforcement_list.html", {"page": page})


@require_GET
def metrics(request: HttpRequest) -> HttpResponse:
    """Prometheus scrape endpoint. With GPUMARKET_METRICS_TOKEN set, it asks for that bearer
    token; the figures are platform-wide aggregates with no tenant names either way."""
    token = settings.GPUMARKET_METRICS_TOKEN
    if token:
        given = request.headers.get("Authorization", "").removeprefix("Bearer ").strip()
        if not constant_time_compare(given, token):
            return HttpResponse(
                "metrics need the bearer token\n", status=401, content_type="text/plain"
            )
    return HttpResponse(metrics_render(), content_type="text/plain; version=0.0.4; charset=utf-8")
