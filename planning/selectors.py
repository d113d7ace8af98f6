"""Reads for the planning pages: what a scenario's results mean for each team."""

from __future__ import annotations

from django.db.models import QuerySet

from market.models import Tier
from planning.models import PlannedCampaign, Scenario
from tenants.access import access_object, scoped
from tenants.ledger import credits
from tenants.models import Budget, Tenant


def planned_campaigns_of(tenant: Tenant) -> QuerySet[PlannedCampaign]:
    """A team's declared campaigns with their tiers."""
    return scoped(
        PlannedCampaign.objects.select_related("tenant").prefetch_related("tiers"), tenant=tenant
    )


def planned_campaign_get(tenant: Tenant, pk: object) -> PlannedCampaign:
    """One of the team's declared campaigns (404 for another team's)."""
    return access_object(
        PlannedCampaign.objects.select_related("tenant").prefetch_related("tiers"),
        tenant=tenant,
        pk=pk,
    )


def tier_slugs_active() -> list[str]:
    return list(Tier.objects.filter(active=True).order_by("slug").values_list("slug", flat=True))


def scenarios_recent(limit: int = 50) -> QuerySet[Scenario]:
    return Scenario.objects.all()[:limit]


_WINDOW_NAMES = {"day": "daily", "week": "weekly", "month": "monthly"}


def scenario_spend_rows(*, results: dict, weeks: int) -> list[tuple[str, str, int, int]]:
    """(team name, note, spend now, spend with the scenario) in milli-credits, by name.

    The replay bids the history's demand whatever the teams' budgets; a team's hard cap stops
    its spend at the cap in each window, so over ``weeks`` it can spend no more than the
    tightest of its hard caps times the windows in the horizon."""
    before, after = results.get("spend_before", {}), results.get("spend_after", {})
    slugs = set(before) | set(after)
    teams = {t.slug: t for t in Tenant.objects.filter(slug__in=slugs)}
    days = 7 * weeks
    windows = {"day": days, "week": weeks, "month": -(-days // 30)}
    most: dict[str, tuple[int, str]] = {}
    for budget in Budget.objects.filter(
        tenant__slug__in=slugs, active=True, mode=Budget.Mode.HARD, campaign__isnull=True
    ).select_related("tenant"):
        limit = budget.cap * windows[budget.window]
        slug = budget.tenant.slug
        if slug not in most or limit < most[slug][0]:
            note = f"held to its {_WINDOW_NAMES[budget.window]} hard cap of {credits(budget.cap)}"
            most[slug] = (limit, note)
    rows = []
    for slug in slugs:
        limit, note = most.get(slug, (None, ""))
        # Money is whole milli-credits; the replay sums charges as numbers.
        now, later = int(before.get(slug, 0)), int(after.get(slug, 0))
        if limit is not None:
            now, later = min(now, limit), min(later, limit)
        name = teams[slug].name if slug in teams else slug
        rows.append((name, note, now, later))
    return sorted(rows)
