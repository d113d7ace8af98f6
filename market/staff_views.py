"""Staff pages of the market: tiers (create, change capacity and offer) and rounds.

Staff only (``core.auth.staff_required``); each view parses, calls one service or reads,
and renders. A refusal from a service (any DomainError) becomes a form error on the tier that caused it.
"""

from __future__ import annotations

from collections import defaultdict

from django.contrib import messages
from django.core.paginator import Paginator
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.views.decorators.http import require_GET, require_http_methods, require_POST

from core.auth import staff_or_auditor_required, staff_required
from core.charts import figure_html
from core.errors import DomainError
from market.charts import round_utilisation
from market.diagnostics import diagnostics_rows, shadow_rows
from market.forms import TierCreateForm, TierForm
from market.models import Tier
from market.selectors import (
    CLEARED,
    policy_active_get,
    round_allocations,
    round_bid_counts,
    rounds_all,
    tiers_all,
)
from market.services.tiers import tier_create, tier_update
from market.views import supply_demand_charts
from tenants.approvals import NEEDS_APPROVAL, approval_form_url, approval_needed
from tenants.selectors import tenant_names


def _tiers_page(request, *, create_form=None, forms_by_pk=None, status=200):
    policy = policy_active_get()
    rows = []
    for tier in tiers_all():
        form = (forms_by_pk or {}).get(tier.pk) or TierForm(
            initial={name: getattr(tier, name) for name in TierForm.base_fields},
            prefix=f"t{tier.pk}",
        )
        rows.append(
            {
                "tier": tier,
                "form": form,
                "reserve": policy.reserve_for(tier.slug) if policy else 0,
                "max_share": policy.max_share_for(tier.slug) if policy else 100,
            }
        )
    return render(
        request,
        "market/staff_tiers.html",
        {
            "rows": rows,
            "policy": policy,
            "create_form": create_form or TierCreateForm(prefix="new"),
        },
        status=status,
    )


@require_http_methods(["GET", "POST"])
@staff_or_auditor_required
def staff_tiers(request: HttpRequest) -> HttpResponse:
    if request.method == "GET":
        return _tiers_page(request)
    form = TierCreateForm(request.POST, prefix="new")
    if form.is_valid():
        try:
            tier = tier_create(actor=request.user, **form.cleaned_data)
        except DomainError as exc:
            form.add_error(None, str(exc))
        else:
            messages.success(request, f"Tier {tier.slug} created.")
            return redirect("staff_tiers")
    return _tiers_page(request, create_form=form, status=400)


@require_POST
@staff_required
def staff_tier_update(request: HttpRequest, pk: int) -> HttpResponse:
    tier = get_object_or_404(Tier, pk=pk)
    form = TierForm(request.POST, prefix=f"t{tier.pk}")
    if form.is_valid():
        changes = dict(form.cleaned_data)
        gated = {n: changes.pop(n) for n in ("capacity", "maintenance_gpus")}
        if any(getattr(tier, n) != v for n, v in gated.items()) and approval_needed("tier_change"):
            # The other fields apply now; the capacity waits for a second administrator.
            try:
                tier_update(tier=tier, actor=request.user, **changes)
            except DomainError as exc:
                form.add_error(None, str(exc))
                return _tiers_page(request, forms_by_pk={tier.pk: form}, status=400)
            messages.info(request, NEEDS_APPROVAL)
            return redirect(approval_form_url("tier_change", tier=tier.pk, **gated))
        try:
            tier_update(tier=tier, actor=request.user, **form.cleaned_data)
        except DomainError as exc:
            form.add_error(None, str(exc))
        else:
            messages.success(request, f"Tier {tier.slug} saved.")
            return redirect("staff_tiers")
    return _tiers_page(request, forms_by_pk={tier.pk: form}, status=400)


@require_GET
@staff_or_auditor_required
def staff_rounds(request: HttpRequest) -> HttpResponse:
    page = Paginator(rounds_all(), 25).get_page(request.GET.get("page"))
    return render(request, "market/staff_rounds.html", {"page": page})


def _team_names(shadow: dict | None) -> dict[int, str]:
    ids = [int(pk) for pk in (shadow or {}).get("gpus_by_tenant") or {}]
    return tenant_names(ids=ids)


@require_GET
@staff_or_auditor_required
def staff_round_detail(request: HttpRequest, pk: int) -> HttpResponse:
    rnd = get_object_or_404(rounds_all(), pk=pk)
    allocations = round_allocations(rnd=rnd)
    allocated: dict[str, int] = defaultdict(int)
    for a in allocations:
        allocated[a.tier.slug] += a.gpus
    charts = []
    if rnd.status in CLEARED:
        charts.append(
            figure_html(
                round_utilisation(capacities=rnd.capacities, allocated=allocated),
                element_id="round-utilisation",
            )
        )
    charts += supply_demand_charts(rnd)
    shadow = rnd.shadow_result if isinstance(rnd.shadow_result, dict) else None
    return render(
        request,
        "market/staff_round_detail.html",
        {
            "round": rnd,
            "allocations": allocations,
            "bid_counts": round_bid_counts(rnd=rnd),
            "charts": charts,
            "prices": sorted(rnd.prices.items()),
            "capacities": sorted(rnd.capacities.items()),
            "diagnostics": diagnostics_rows(
                rnd.diagnostics if isinstance(rnd.diagnostics, dict) else {}
            ),
            "shadow": shadow_rows(shadow, team_names=_team_names(shadow)),
        },
    )
