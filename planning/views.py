"""Planning pages: a team's planned campaigns; staff capacity scenarios."""

from __future__ import annotations

import json

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.views.decorators.http import require_GET, require_http_methods, require_POST

from core.auth import staff_required
from core.charts import figure_html
from core.errors import DomainError
from planning import charts
from planning.forms import PlannedCampaignForm, ScenarioForm
from planning.models import Scenario
from planning.selectors import (
    planned_campaigns_of,
    scenario_spend_rows,
    scenarios_recent,
    tier_slugs_active,
)
from planning.services.campaigns import planned_campaign_declare, planned_campaign_withdraw
from planning.services.scenarios import scenario_create
from tenants.access import require_tenant


def _campaigns_page(request, tenant, *, form=None, status=200):
    return render(
        request,
        "planning/campaigns.html",
        {
            "campaigns": planned_campaigns_of(tenant),
            "form": form or PlannedCampaignForm(),
            "is_manager": request.user.membership.is_manager,
        },
        status=status,
    )


@require_http_methods(["GET", "POST"])
@login_required
def planned_campaigns(request: HttpRequest) -> HttpResponse:
    """Every member sees the team's declarations; managers declare them."""
    tenant = require_tenant(request.user)
    if request.method == "GET":
        return _campaigns_page(request, tenant)
    if not request.user.membership.is_manager:
        raise PermissionDenied("Only the team's managers declare planned campaigns.")
    form = PlannedCampaignForm(request.POST)
    if form.is_valid():
        data = form.cleaned_data
        try:
            campaign = planned_campaign_declare(
                tenant=tenant,
                actor=request.user,
                name=data["name"],
                starts_at=data["starts_at"],
                ends_at=data["ends_at"],
                gpu_hours=data["gpu_hours"],
                tiers=[t.slug for t in data["tiers"]],
                priority=data["priority"],
            )
        except DomainError as exc:
            form.add_error(None, str(exc))
        else:
            messages.success(
                request,
                f"Planned campaign {campaign.name} declared: {campaign.gpu_hours:,} GPU-hours. "
                "Capacity planning counts it from now on.",
            )
            return redirect("planned_campaigns")
    return _campaigns_page(request, tenant, form=form, status=400)


@require_POST
@login_required
def planned_campaign_withdraw_view(request: HttpRequest, pk: int) -> HttpResponse:
    tenant = require_tenant(request.user)
    if not request.user.membership.is_manager:
        raise PermissionDenied("Only the team's managers withdraw planned campaigns.")
    try:
        campaign = planned_campaign_withdraw(tenant=tenant, actor=request.user, campaign_id=pk)
    except DomainError as exc:
        raise Http404(str(exc)) from exc
    messages.success(request, f"Planned campaign {campaign.name} withdrawn.")
    return redirect("planned_campaigns")


def example_document() -> dict:
    """A starting scenario on the platform's own tiers: 8 more GPUs on the first tier, and an
    option of each kind to price against on every tier (a plan must cover each tier's demand,
    so an example pricing one tier only fails as soon as another is short)."""
    slugs = tier_slugs_active() or ["a100"]
    options: list[dict] = []
    for slug in slugs:
        options += [
            {"tier": slug, "kind": "purchase", "price": "25000", "amortisation_months": 36},
            {"tier": slug, "kind": "reserved", "per_hour": "2.2", "term_months": 12},
            {"tier": slug, "kind": "on_demand", "per_hour": "4"},
            {"tier": slug, "kind": "spot", "per_hour": "1.4", "interruption_rate": 0.3},
        ]
    return {
        "name": f"8 more {slugs[0]}",
        "horizon_weeks": 2,
        "changes": [{"tier": slugs[0], "add_gpus": 8}],
        "job_gpus": 2,
        "targets": {"max_unmet_pct": 5, "max_wait_rounds": 1},
        "kwh_price": "0.2",
        "options": options,
    }


def _backtest_rows(backtest: dict) -> list[dict]:
    """Per tier: the chosen model, its error beside the seasonal-naive rule's per horizon,
    and the warning when the history is too short to score it."""
    return [
        {
            "tier": slug,
            "label": b.get("label", ""),
            "season": b.get("season", ""),
            "warning": b.get("warning", ""),
            "horizons": b.get("beside_baseline", []),
        }
        for slug, b in sorted(backtest.items())
    ]


@require_http_methods(["GET", "POST"])
@staff_required
def scenarios(request: HttpRequest) -> HttpResponse:
    form = ScenarioForm(
        request.POST or None,
        initial={"document": json.dumps(example_document(), indent=2)},
    )
    if request.method == "POST" and form.is_valid():
        try:
            scenario = scenario_create(actor=request.user, document=form.cleaned_data["document"])
        except DomainError as exc:
            form.add_error("document", str(exc))
        else:
            messages.success(request, f"Scenario {scenario.name} queued; this page follows it.")
            return redirect("scenario_detail", pk=scenario.pk)
    return render(
        request,
        "planning/scenarios.html",
        {"form": form, "scenarios": scenarios_recent()},
        status=400 if request.method == "POST" else 200,
    )


@require_GET
@staff_required
def scenario_detail(request: HttpRequest, pk: int) -> HttpResponse:
    scenario = get_object_or_404(Scenario, pk=pk)
    results = scenario.results or {}
    context = {
        "scenario": scenario,
        "inputs": json.dumps(scenario.inputs, indent=2),
        "results": results,
        "running": scenario.status in (Scenario.Status.QUEUED, Scenario.Status.RUNNING),
    }
    if results:
        target = results.get("targets", {}).get("max_unmet_pct", 0)
        context["price_wait_chart"] = figure_html(
            charts.price_wait(results["tiers"]), element_id="price-wait-chart"
        )
        context["tradeoff_chart"] = figure_html(
            charts.tradeoff(results["tradeoff"], chosen_pct=target), element_id="tradeoff-chart"
        )
        context["backtest_rows"] = _backtest_rows(results.get("backtest", {}))
        if results.get("forecast"):
            context["forecast_chart"] = figure_html(
                charts.demand_forecast(results["forecast"]), element_id="forecast-chart"
            )
        feasible = [p["cost"] for p in results.get("tradeoff", []) if p.get("cost") is not None]
        # The curve is worth drawing only with a cost on it; a flat zero or nothing reads empty.
        context["tradeoff_state"] = "costs" if any(feasible) else "free" if feasible else "none"
        context["tier_rows"] = [
            (slug, tier, list(zip(tier["weeks_before"], tier["weeks_after"], strict=False)))
            for slug, tier in sorted(results["tiers"].items())
        ]
        context["spend_rows"] = scenario_spend_rows(
            results=results, weeks=int((scenario.inputs or {}).get("horizon_weeks") or 1)
        )
    return render(request, "planning/scenario_detail.html", context)


@require_GET
@staff_required
def scenario_csv(request: HttpRequest, pk: int) -> HttpResponse:
    scenario = get_object_or_404(Scenario, pk=pk)
    plan = (scenario.results or {}).get("recommendation", {})
    if "csv" not in plan:
        raise Http404(
            "This scenario has no plan to export (not run yet, or no mix met the targets)."
        )
    response = HttpResponse(plan["csv"], content_type="text/csv; charset=utf-8")
    response["Content-Disposition"] = f'attachment; filename="scenario-{scenario.pk}-plan.csv"'
    return response
