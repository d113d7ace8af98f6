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
from django.http import HttpRequest, HttpResponse, HttpResponseBadRequest
from django.shortcuts import get_object_or_404, redirect, render
from django.utils import timezone
from django.utils.crypto import constant_time_compare
from django.views.decorators.http import require_GET, require_POST

from core.auth import staff_required
from core.charts import figure_html
from core.errors import DomainError
from market.services.launch import placement_text, ready_commands
from market.services.placement import tier_fragmentation
from telemetry.charts import gpu_heatmap, utilisation_lines
from telemetry.forms import EnforcementFilterForm
from telemetry.metrics import metrics_render
from telemetry.models import Gpu
from telemetry.selectors import (
    actions_for_allocation,
    actions_for_tenant,
    actions_recent,
    allocation_get,
    allocation_gpu_ids,
    allocations_past_for_tenant,
    allocations_running_for_tenant,
    gpus_get,
    gpus_list,
    nodes_list,
    utilisation_by_minute,
    utilisation_latest,
    utilisation_series,
)
from telemetry.services import gpu_maintenance_set
from tenants.access import require_tenant

HEATMAP_MINUTES = 60
LIVE_WINDOW = timedelta(minutes=5)


def _gpu_label(gpu: Gpu) -> str:
    return f"{gpu.node.name}/{gpu.index}" + (" (simulated)" if gpu.node.simulated else "")


def _running_rows(tenant) -> list[dict]:
    allocations = allocations_running_for_tenant(tenant=tenant)
    gpus = allocation_gpu_ids([a.pk for a in allocations])
    utilisation = utilisation_latest(
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
    finished = allocations_past_for_tenant(tenant=tenant)
    return render(
        request,
        "telemetry/allocation_list.html",
        {
            "rows": _running_rows(tenant),
            "page": Paginator(finished, 25).get_page(request.GET.get("page")),
            "actions": actions_for_tenant(tenant=tenant)[:20],
        },
    )


@require_GET
@login_required
def allocation_detail(request: HttpRequest, pk: int) -> HttpResponse:
    tenant = require_tenant(request.user)
    allocation = allocation_get(tenant=tenant, allocation_id=pk)
    gpus = gpus_get(gpu_ids=allocation_gpu_ids([allocation.pk]).get(allocation.pk, set()))
    end = min(timezone.now(), allocation.ends_at)
    series = (
        utilisation_series({g.pk: _gpu_label(g) for g in gpus}, start=allocation.starts_at, end=end)
        if end > allocation.starts_at
        else {}
    )
    chart = (
        figure_html(
            utilisation_lines(series, window=(allocation.starts_at, allocation.ends_at)),
            element_id="allocation-utilisation",
        )
        if series
        else ""
    )
    return render(
        request,
        "telemetry/allocation_detail.html",
        {
            "allocation": allocation,
            "placement": placement_text(allocation),
            "ready": ready_commands(allocation) if allocation.status == "active" else [],
            "gpus": [_gpu_label(g) for g in gpus],
            "chart": chart,
            "actions": actions_for_allocation(tenant=tenant, allocation=allocation),
        },
    )


# Platform staff ----------------------------------------------------------------------------


def _heatmap(gpus: list[Gpu], *, now: datetime) -> str:
    """Utilisation of every GPU over the last hour, one cell per minute."""
    start = (now - timedelta(minutes=HEATMAP_MINUTES)).replace(second=0, microsecond=0)
    minutes = [start + timedelta(minutes=i) for i in range(HEATMAP_MINUTES + 1)]
    by_minute = utilisation_by_minute([g.pk for g in gpus], minutes=minutes)
    values = [[by_minute.get((g.pk, m)) for m in minutes] for g in gpus]
    fig = gpu_heatmap(gpus=[_gpu_label(g) for g in gpus], minutes=minutes, values=values)
    return figure_html(fig, element_id="gpu-heatmap")


REFUSAL_ALERT_WINDOW = timedelta(hours=1)


@require_GET
@staff_required
def fleet(request: HttpRequest) -> HttpResponse:
    now = timezone.now()
    gpus = list(gpus_list())
    per_node: dict[int, int] = defaultdict(int)
    for g in gpus:
        per_node[g.node_id] += 1
    nodes = [{"node": n, "gpus": per_node.get(n.pk, 0)} for n in nodes_list()]
    # Nodes whose batches were refused in the last hour: their reports may not be getting in.
    recent = now - REFUSAL_ALERT_WINDOW
    refusing = [
        row["node"]
        for row in nodes
        if row["node"].last_refusal_at is not None and row["node"].last_refusal_at >= recent
    ]
    tiers = sorted({g.tier.slug for g in gpus})
    fragmentation = []
    for slug in tiers:
        free, on_node, in_domain = tier_fragmentation(slug, at=now)
        fragmentation.append(
            {
                "tier": slug,
                "gpus": sum(1 for g in gpus if g.tier.slug == slug),
                "free": free,
                "node": on_node,
                "domain": in_domain,
            }
        )
    return render(
        request,
        "telemetry/fleet.html",
        {
            "fragmentation": fragmentation,
            "nodes": nodes,
            "gpus": gpus,
            "heatmap": _heatmap(gpus, now=now) if gpus else "",
            "any_simulated": any(row["node"].simulated for row in nodes),
            "refusing": refusing,
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
    except DomainError as exc:
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
    form = EnforcementFilterForm(request.GET or None)
    if form.is_bound and not form.is_valid():
        return render(
            request,
            "telemetry/enforcement_list.html",
            {"page": [], "form": form, "query": ""},
            status=400,
        )
    data = form.cleaned_data if form.is_bound else {}
    actions = actions_recent(
        node=data.get("node"),
        action=data.get("action") or "",
        state=data.get("state") or "",
        tenant_id=data["tenant"].pk if data.get("tenant") else None,
    )
    query = request.GET.copy()
    query.pop("page", None)
    page = Paginator(actions, 50).get_page(request.GET.get("page"))
    return render(
        request,
        "telemetry/enforcement_list.html",
        {"page": page, "form": form, "query": query.urlencode()},
    )


@require_GET
def metrics(request: HttpRequest) -> HttpResponse:
    """Prometheus scrape endpoint: it asks for the GPUMARKET_METRICS_TOKEN bearer token, which
    only the development server (DEBUG) may run without. Per-team series are labelled with
    the team's slug (never its name) and carry its balances and spend, so the token and the
    Prometheus storage need the access control of the staff pages (docs/security.md)."""
    token = settings.GPUMARKET_METRICS_TOKEN
    if token or not settings.DEBUG:
        given = request.headers.get("Authorization", "").removeprefix("Bearer ").strip()
        if not token or not constant_time_compare(given, token):
            return HttpResponse(
                "metrics need the bearer token\n", status=401, content_type="text/plain"
            )
    return HttpResponse(metrics_render(), content_type="text/plain; version=0.0.4; charset=utf-8")
