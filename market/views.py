"""Market pages for researchers: the open round, bidding and spend (the admins' tiers and
rounds are in market/staff_views.py, which shares the reads below).

Views parse, authorise, call one service and render. Every tenant-owned row is fetched
through ``tenants.access`` (another tenant's bid is a 404); a refusal from a service (any
``DomainError``, the ledger's included) becomes a form error next to what the person typed.
"""

from __future__ import annotations

import uuid
from collections import defaultdict
from datetime import UTC, datetime, timedelta
from decimal import Decimal

from django import forms
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.paginator import Paginator
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.template.defaultfilters import pluralize
from django.urls import reverse
from django.utils import timezone
from django.views.decorators.http import require_GET, require_http_methods, require_POST

from core.charts import figure_html
from core.confirm import confirm_page, confirmed
from core.errors import DomainError
from market.bid_guidance import bid_warnings
from market.charts import (
    SpendPeriod,
    demand_forecast,
    price_history,
    spend_over_time,
    supply_demand,
)
from market.energy_views import energy_context
from market.forecast_selectors import FORECAST_SHOWN_DAYS, forecast_setup, tier_forecast
from market.forms import BidForm, limit_field_name
from market.models import Bid, PolicyVersion, Round
from market.selectors import (
    bid_get,
    bids_why,
    bids_with_allocations,
    campaigns_current,
    policy_active_get,
    round_demand,
    round_last_cleared,
    round_open_current,
    tenant_charges,
    tenant_spend_by_day,
    tier_guides,
    tiers_offered,
)
from market.selectors import price_history as price_history_rows
from market.services.bids import bid_cancel, bid_edit, bid_escrow, bid_place, window_seconds
from tenants.access import access_object, require_tenant
from tenants.budgets import budget_usage, budgets_applicable
from tenants.ledger import balance_get, credits
from tenants.models import Budget
from tenants.selectors import budgets_active

PRICE_HISTORY_ROUNDS = 48
# The forecast is fitted on up to three weeks of rounds (two show the weekly season, the third
# scores a week ahead), at most 1,152 (four days of 5-minute rounds): 15-minute rounds keep a
# daily season, whose fit takes a second or two a tier, where a weekly one (672 rounds) took
# 14 s. The chart shows the last four days of them and one day ahead, between 6 and 48
# rounds. It needs a day of rounds, so that the seasonal-naive rule has a day to copy.


# Reads used by several pages --------------------------------------------------------------


def supply_demand_charts(rnd: Round) -> list[str]:
    """One supply/demand chart per tier the round offered or was bid on."""
    demand = round_demand(rnd=rnd)
    charts = []
    for i, slug in enumerate(sorted(set(rnd.capacities) | set(demand))):
        price = rnd.prices.get(slug)
        fig = supply_demand(
            tier=slug,
            bids=demand.get(slug, []),
            capacity=int(rnd.capacities.get(slug, 0)),
            reserve=rnd.policy.reserve_for(slug),
            price=int(price) if price is not None else None,
        )
        charts.append(figure_html(fig, element_id=f"supply-demand-{i}"))
    return charts


def demand_forecast_charts(policy: PolicyVersion | None) -> dict:
    """Per active tier: past demand, the forecast with its P10-P90 band, capacity and price,
    as charts; or, before a day of rounds has settled, a note saying how many there are."""
    round_minutes = policy.round_minutes if policy else 60
    setup = forecast_setup(round_minutes)
    day, horizon, history, rounds = (
        setup.rounds_per_day, setup.horizon, setup.history, setup.rounds,
    )  # fmt: skip
    context = {"charts": [], "rounds": rounds, "needed": setup.needed, "horizon": horizon}
    if rounds < setup.needed:
        return context
    offered = {t.slug: t.offered for t in tiers_offered()}
    context["shown"] = min(FORECAST_SHOWN_DAYS * day, rounds)
    shown = slice(-context["shown"], None)
    step = timedelta(minutes=round_minutes)
    for i, (slug, past) in enumerate(sorted(history.items())):
        forecast = tier_forecast(past.demand, horizon=horizon, rounds_per_day=day)
        fig = demand_forecast(
            tier=slug,
            at=past.starts_at[shown],
            demand=past.demand[shown],
            capacity=past.capacity[shown],
            price=past.price[shown],
            future_at=[past.starts_at[-1] + step * k for k in range(1, horizon + 1)],
            forecast=forecast,
            offered=offered.get(slug, 0),
        )
        context["charts"].append(
            {
                "tier": slug,
                "html": figure_html(fig, element_id=f"demand-forecast-{i}"),
                "forecast": forecast,
                "beside": forecast.beside_baseline(),
            }
        )
    return context


# Researchers -----------------------------------------------------------------------------


@require_GET
@login_required
def market_overview(request: HttpRequest) -> HttpResponse:
    rnd = round_open_current()
    last = round_last_cleared()
    policy = policy_active_get()
    series: dict[str, list[tuple[datetime, int]]] = defaultdict(list)
    for row in price_history_rows(limit=PRICE_HISTORY_ROUNDS):
        for slug, price in row["prices"].items():
            series[slug].append((row["starts_at"], int(price)))
    tiers = [
        {
            "tier": t,
            "reserve": policy.reserve_for(t.slug) if policy else 0,
            "max_share": policy.max_share_for(t.slug) if policy else 100,
            "last_price": last.prices.get(t.slug) if last else None,
        }
        for t in tiers_offered()
    ]
    return render(
        request,
        "market/overview.html",
        {
            "round": rnd,
            "last": last,
            "tiers": tiers,
            "price_chart": figure_html(price_history(series), element_id="price-history")
            if series
            else "",
            "supply_demand_charts": supply_demand_charts(last) if last else [],
            "demand_forecast": demand_forecast_charts(policy),
        },
    )


class _BidTerms(forms.Form):
    """Hidden fields of the new-bid form: which round, and a retry key so a double submit
    places one bid."""

    round = forms.IntegerField(widget=forms.HiddenInput)
    idempotency_key = forms.CharField(max_length=80, widget=forms.HiddenInput)


def _preview(*, tenant, rnd: Round, form: BidForm) -> dict | None:
    """What the bid would hold in escrow and what the tenant's budgets leave, before placing."""
    if not form.is_valid():
        return None
    limits = form.limits()
    escrow = bid_escrow(
        quantity=form.cleaned_data["quantity"], limits=limits, seconds=window_seconds(rnd)
    )
    now = timezone.now()
    budgets = []
    for budget in budgets_applicable(
        tenant=tenant, campaign=form.cleaned_data.get("campaign"), at=now
    ):
        usage = budget_usage(budget=budget, at=now)
        after = usage.remaining - escrow
        budgets.append({"usage": usage, "after": after, "over": max(-after, 0)})
    balance = balance_get(tenant=tenant)
    warnings = bid_warnings(
        quantity=form.cleaned_data["quantity"],
        min_quantity=form.cleaned_data["min_quantity"],
        limits=limits,
        guides={g.slug: g for g in tier_guides(rnd=rnd)},
        soft_budgets=[
            (_budget_label(b["usage"].budget), b["after"])
            for b in budgets
            if b["usage"].budget.mode == "soft"
        ],
    )
    return {
        "escrow": escrow,
        "available": balance.available,
        "available_after": balance.available - escrow,
        "budgets": budgets,
        "hours": rnd.hours,
        "warnings": warnings,
    }


def _budget_label(budget) -> str:
    if budget.campaign_id:
        return f"campaign {budget.campaign.name}"
    return {"day": "daily", "week": "weekly", "month": "monthly"}.get(
        budget.window, budget.get_window_display().lower()
    )


def _bid_form_page(request, *, tenant, rnd, form, terms, preview=None, status=200):
    return render(
        request,
        "market/bid_form.html",
        {
            "round": rnd,
            "form": form,
            "terms": terms,
            "preview": preview,
            "editing": None,
            "guides": tier_guides(rnd=rnd),
        },
        status=status,
    )


@require_http_methods(["GET", "POST"])
@login_required
def bid_new(request: HttpRequest) -> HttpResponse:
    tenant = require_tenant(request.user)
    tiers = tiers_offered()
    campaigns = campaigns_current(tenant=tenant)
    if request.method == "GET":
        rnd = round_open_current()
        if rnd is None:
            return render(request, "market/no_round.html")
        terms = _BidTerms(initial={"round": rnd.pk, "idempotency_key": uuid.uuid4().hex})
        return _bid_form_page(
            request,
            tenant=tenant,
            rnd=rnd,
            form=BidForm(tiers=tiers, campaigns=campaigns),
            terms=terms,
        )
    terms = _BidTerms(request.POST)
    if not terms.is_valid():
        messages.error(request, "The form was out of date; here is the round open now.")
        return redirect("bid_new")
    rnd = get_object_or_404(Round, pk=terms.cleaned_data["round"])
    form = BidForm(request.POST, tiers=tiers, campaigns=campaigns)
    if "preview" in request.POST:
        return _bid_form_page(
            request,
            tenant=tenant,
            rnd=rnd,
            form=form,
            terms=terms,
            preview=_preview(tenant=tenant, rnd=rnd, form=form),
        )
    if form.is_valid():
        try:
            bid = bid_place(
                user=request.user,
                tenant=tenant,
                round=rnd,
                quantity=form.cleaned_data["quantity"],
                min_quantity=form.cleaned_data["min_quantity"],
                limits=form.limits(),
                campaign=form.cleaned_data.get("campaign"),
                idempotency_key=terms.cleaned_data["idempotency_key"],
            )
        except DomainError as exc:
            form.add_error(None, str(exc))
        else:
            messages.success(
                request, f"Bid {bid.pk} placed: {bid.escrow / 1000:,.3f} credits held in escrow."
            )
            return redirect("bid_detail", pk=bid.pk)
    return _bid_form_page(
        request,
        tenant=tenant,
        rnd=rnd,
        form=form,
        terms=terms,
        preview=_preview(tenant=tenant, rnd=rnd, form=form) if form.is_valid() else None,
        status=400,
    )


@require_POST
@login_required
def bid_preview(request: HttpRequest) -> HttpResponse:
    """The escrow/budget preview alone, refreshed by htmx as the bid form changes."""
    tenant = require_tenant(request.user)
    terms = _BidTerms(request.POST)
    if not terms.is_valid():
        raise Http404("No such round.")
    rnd = get_object_or_404(Round, pk=terms.cleaned_data["round"])
    form = BidForm(request.POST, tiers=tiers_offered(), campaigns=campaigns_current(tenant=tenant))
    return render(
        request,
        "market/_bid_preview.html",
        {"preview": _preview(tenant=tenant, rnd=rnd, form=form)},
    )


@require_GET
@login_required
def bid_list(request: HttpRequest) -> HttpResponse:
    tenant = require_tenant(request.user)
    page = Paginator(bids_with_allocations(tenant=tenant), 25).get_page(request.GET.get("page"))
    page.object_list = bids_why(list(page.object_list))
    return render(request, "market/bid_list.html", {"page": page, "now": timezone.now()})


@require_GET
@login_required
def bid_detail(request: HttpRequest, pk: int) -> HttpResponse:
    tenant = require_tenant(request.user)
    bid = bid_get(tenant=tenant, bid_id=pk)
    editable = (
        bid.status == Bid.Status.OPEN
        and bid.round.status == Round.Status.OPEN
        and bid.round.closes_at > timezone.now()
    )
    bids_why([bid])
    return render(request, "market/bid_detail.html", {"bid": bid, "editable": editable})


@require_http_methods(["GET", "POST"])
@login_required
def bid_change(request: HttpRequest, pk: int) -> HttpResponse:
    tenant = require_tenant(request.user)
    bid = bid_get(tenant=tenant, bid_id=pk)
    tiers = tiers_offered()
    if request.method == "GET":
        initial = {"quantity": bid.quantity, "min_quantity": bid.min_quantity}
        initial |= {limit_field_name(limit.tier): limit.price for limit in bid.limits.all()}
        form = BidForm(initial=initial, tiers=tiers)
        status = 200
    else:
        form = BidForm(request.POST, tiers=tiers)
        if form.is_valid():
            try:
                bid_edit(
                    user=request.user,
                    tenant=tenant,
                    bid_id=bid.pk,
                    quantity=form.cleaned_data["quantity"],
                    min_quantity=form.cleaned_data["min_quantity"],
                    limits=form.limits(),
                )
            except DomainError as exc:
                form.add_error(None, str(exc))
            else:
                messages.success(request, f"Bid {bid.pk} changed.")
                return redirect("bid_detail", pk=bid.pk)
        status = 400
    # The escrow preview on edit too, for the terms as they stand (or as just submitted).
    preview = _preview(tenant=tenant, rnd=bid.round, form=form) if form.is_bound else None
    if not form.is_bound:
        # The form's initial limits are milli-credits; as typed data they are credits.
        typed = {"quantity": str(bid.quantity), "min_quantity": str(bid.min_quantity)}
        typed |= {
            limit_field_name(limit.tier): f"{Decimal(limit.price) / 1000:f}"
            for limit in bid.limits.all()
        }
        preview = _preview(tenant=tenant, rnd=bid.round, form=BidForm(typed, tiers=tiers))
    return render(
        request,
        "market/bid_form.html",
        {
            "round": bid.round,
            "form": form,
            "terms": None,
            "preview": preview,
            "editing": bid,
            "guides": tier_guides(rnd=bid.round),
        },
        status=status,
    )


@require_http_methods(["GET", "POST"])
@login_required
def bid_cancel_view(request: HttpRequest, pk: int) -> HttpResponse:
    tenant = require_tenant(request.user)
    # A GET (a typed or followed link) asks the same question as a POST without confirmation.
    if not confirmed(request):
        bid = access_object(Bid.objects.all(), tenant=tenant, pk=pk)
        return confirm_page(
            request,
            title=f"Cancel bid {bid.pk}",
            question=(
                f"Cancel bid {bid.pk} ({bid.quantity} GPU{pluralize(bid.quantity)})? Its escrow of "
                f"{credits(bid.escrow)} credits goes back to available; a cancelled bid cannot "
                "be opened again."
            ),
            action=reverse("bid_cancel", args=[bid.pk]),
            back=reverse("bid_detail", args=[bid.pk]),
        )
    try:
        bid = bid_cancel(user=request.user, tenant=tenant, bid_id=pk)
    except DomainError as exc:
        messages.error(request, str(exc))
        return redirect("bid_detail", pk=pk)
    messages.success(request, f"Bid {bid.pk} cancelled; its escrow is available again.")
    return redirect("bid_list")


@require_GET
@login_required
def spend(request: HttpRequest) -> HttpResponse:
    """Spend per day, this month's and this week's spend to date against the month and week
    caps, and the day's against the daily cap (campaign caps are in the budgets table)."""
    tenant = require_tenant(request.user)
    now = timezone.now()
    today = now.astimezone(UTC).date()
    month_start = today.replace(day=1)
    week_start = today - timedelta(days=today.weekday())  # budget weeks start on Monday (UTC)
    start = min(month_start, week_start)
    days = [start + timedelta(days=i) for i in range((today - start).days + 1)]
    per_day = tenant_spend_by_day(tenant=tenant, since=start)
    budgets = list(budgets_active(tenant=tenant))
    caps = {b.window: b.cap for b in budgets if b.campaign_id is None}
    periods = [SpendPeriod("This month", "Monthly cap", month_start, caps.get(Budget.Window.MONTH))]
    if Budget.Window.WEEK in caps:
        periods.append(SpendPeriod("This week", "Weekly cap", week_start, caps[Budget.Window.WEEK]))
    fig = spend_over_time(
        days=days,
        daily=[per_day.get(d, 0) for d in days],
        periods=periods,
        daily_cap=caps.get(Budget.Window.DAY),
    )
    return render(
        request,
        "market/spend.html",
        {
            "chart": figure_html(fig, element_id="spend-chart"),
            "usages": [budget_usage(budget=b, at=now) for b in budgets],
            "charges": tenant_charges(tenant=tenant),
            "month_total": sum(v for d, v in per_day.items() if d >= month_start),
            **energy_context(tenant=tenant, since=month_start),
        },
    )
