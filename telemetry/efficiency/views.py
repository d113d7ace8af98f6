"""A team's efficiency over time (its members) and the teams ranked by idle spend (staff)."""

from __future__ import annotations

from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django.views.decorators.http import require_GET

from core.auth import staff_required
from core.charts import figure_html
from telemetry.efficiency.charts import efficiency_over_time, spend_over_time, teams_idle_spend
from telemetry.efficiency.forms import EfficiencyFilterForm, TeamEfficiencyFilterForm
from telemetry.efficiency.selectors import (
    efficiency_by_campaign,
    efficiency_by_day,
    efficiency_totals_sum,
    teams_by_idle_spend,
)
from tenants.access import require_tenant


@require_GET
@login_required
def team_efficiency(request: HttpRequest) -> HttpResponse:
    tenant = require_tenant(request.user)
    form = TeamEfficiencyFilterForm(request.GET or None, tenant=tenant)
    if form.is_bound and not form.is_valid():
        return render(request, "telemetry/efficiency.html", {"form": form}, status=400)
    days = form.period() if form.is_bound else form.fields["days"].initial
    campaign = form.cleaned_data.get("campaign") if form.is_bound else None
    by_day = efficiency_by_day(tenant=tenant, days=days, campaign=campaign)
    dates = [d for d, _ in by_day]
    totals = [t for _, t in by_day]
    context = {
        "form": form,
        "days": days,
        "campaign": campaign,
        "by_day": list(reversed(by_day)),
        "total": efficiency_totals_sum(totals),
        "campaigns": efficiency_by_campaign(tenant=tenant, days=days) if campaign is None else [],
        "hours_chart": figure_html(
            efficiency_over_time(
                days=dates,
                paid=[t.measured_paid_hours for t in totals],
                used=[t.used_hours for t in totals],
            ),
            element_id="efficiency-hours",
        ),
        "spend_chart": figure_html(
            spend_over_time(
                days=dates,
                used_spend=[t.measured_spend - t.idle_spend for t in totals],
                idle_spend=[t.idle_spend for t in totals],
                cost_per_used_hour=[t.cost_per_used_hour for t in totals],
            ),
            element_id="efficiency-spend",
        ),
    }
    return render(request, "telemetry/efficiency.html", context)


@require_GET
@staff_required
def staff_efficiency(request: HttpRequest) -> HttpResponse:
    form = EfficiencyFilterForm(request.GET or None)
    if form.is_bound and not form.is_valid():
        return render(request, "telemetry/efficiency_staff.html", {"form": form}, status=400)
    days = form.period() if form.is_bound else form.fields["days"].initial
    ranking = teams_by_idle_spend(days=days)
    context = {
        "form": form,
        "days": days,
        "ranking": ranking,
        "total": efficiency_totals_sum([t for _, t in ranking]),
        "chart": figure_html(
            teams_idle_spend(
                teams=[tenant.name for tenant, _ in ranking],
                used_spend=[t.measured_spend - t.idle_spend for _, t in ranking],
                idle_spend=[t.idle_spend for _, t in ranking],
            ),
            element_id="efficiency-teams-chart",
        )
        if ranking
        else "",
    }
    return render(request, "telemetry/efficiency_staff.html", context)
