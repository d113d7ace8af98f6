"""Declared demand: a team's manager declares an upcoming campaign; planning reads it."""

from __future__ import annotations

from datetime import datetime, timedelta

from django.contrib.auth.models import AbstractBaseUser
from django.db import transaction
from django.utils import timezone

import audit.services as audit
from market.models import Tier
from planning.errors import PlanningError
from planning.models import PlannedCampaign
from tenants.models import Tenant

MAX_GPU_HOURS = 10_000_000
# The planning horizon a declaration must lie in. Further ahead than MAX_DAYS_AHEAD it is a
# wish, and the forecast never reaches it; a campaign already running may have started up to
# MAX_DAYS_BEHIND ago. Without these a campaign from year 1 to 9999 was taken.
MAX_DAYS_AHEAD = 730
MAX_DAYS_BEHIND = 30


def _snapshot(campaign: PlannedCampaign, tiers: list[str]) -> dict:
    return {
        "name": campaign.name,
        "starts_at": campaign.starts_at.isoformat(),
        "ends_at": campaign.ends_at.isoformat(),
        "gpu_hours": campaign.gpu_hours,
        "tiers": tiers,
        "priority": campaign.priority,
    }


@transaction.atomic
def planned_campaign_declare(
    *,
    tenant: Tenant,
    actor: AbstractBaseUser | None,
    name: str,
    starts_at: datetime,
    ends_at: datetime,
    gpu_hours: int,
    tiers: list[str],
    priority: int = PlannedCampaign.Priority.NORMAL,
    now: datetime | None = None,
) -> PlannedCampaign:
    """Record that ``tenant`` expects to need ``gpu_hours`` GPU-hours on any of ``tiers``
    between ``starts_at`` and ``ends_at``; audited as ``planning.campaign_declare``."""
    now = now or timezone.now()
    name = (name or "").strip()
    if not name:
        raise PlanningError("a planned campaign needs a name")
    if timezone.is_naive(starts_at) or timezone.is_naive(ends_at):
        raise PlanningError("campaign start and end must be timezone-aware")
    if ends_at <= starts_at:
        raise PlanningError("a campaign must end after it starts")
    if ends_at <= now:
        raise PlanningError("the campaign has already ended; declare demand that is still to come")
    earliest, latest = now - timedelta(days=MAX_DAYS_BEHIND), now + timedelta(days=MAX_DAYS_AHEAD)
    if starts_at < earliest or ends_at > latest:
        raise PlanningError(
            f"a campaign must lie in the planning horizon: starting at most {MAX_DAYS_BEHIND} "
            f"days ago and ending within {MAX_DAYS_AHEAD} days"
        )
    if isinstance(gpu_hours, bool) or not isinstance(gpu_hours, int):
        raise PlanningError("GPU-hours must be a whole number")
    if not 1 <= gpu_hours <= MAX_GPU_HOURS:
        raise PlanningError(f"GPU-hours must be between 1 and {MAX_GPU_HOURS:,}")
    if priority not in PlannedCampaign.Priority.values:
        raise PlanningError("priority must be low, normal or high")
    chosen = list(Tier.objects.filter(slug__in=tiers, active=True).order_by("slug"))
    unknown = sorted(set(tiers) - {t.slug for t in chosen})
    if not chosen or unknown:
        raise PlanningError(
            f"choose at least one tier on offer{'; unknown: ' + ', '.join(unknown) if unknown else ''}"
        )
    # The GPUs the campaign would keep busy on average may not exceed what its tiers have: 10M
    # GPU-hours in a microsecond moved a scenario's week-1 demand from 757 to 371,149.
    capacity = sum(t.capacity for t in chosen)
    if capacity == 0:
        raise PlanningError("the tiers chosen have no GPUs yet; choose a tier with capacity")
    hours = (ends_at - starts_at) / timedelta(hours=1)
    if gpu_hours > capacity * hours:
        raise PlanningError(
            f"{gpu_hours:,} GPU-hours in {hours:,.2f} hours needs more GPUs than the tiers' "
            f"capacity of {capacity}: spread it over at least {gpu_hours / capacity:,.1f} hours, "
            "or choose more tiers"
        )
    if PlannedCampaign.objects.filter(tenant=tenant, name=name, withdrawn_at__isnull=True).exists():
        raise PlanningError(f"your team already declared a campaign named {name!r}")
    campaign = PlannedCampaign.objects.create(
        tenant=tenant,
        name=name,
        starts_at=starts_at,
        ends_at=ends_at,
        gpu_hours=gpu_hours,
        priority=priority,
        created_by=actor,
    )
    campaign.tiers.set(chosen)
    audit.record(
        actor=actor,
        action="planning.campaign_declare",
        target=campaign,
        tenant=tenant,
        after=_snapshot(campaign, [t.slug for t in chosen]),
    )
    return campaign


@transaction.atomic
def planned_campaign_withdraw(
    *, tenant: Tenant, actor: AbstractBaseUser | None, campaign_id: int
) -> PlannedCampaign:
    """Withdraw a declaration (kept, marked withdrawn); audited. Idempotent."""
    campaign = (
        PlannedCampaign.objects.select_for_update().filter(tenant=tenant, pk=campaign_id).first()
    )
    if campaign is None:
        raise PlanningError(f"your team has no planned campaign {campaign_id}")
    if campaign.withdrawn_at is not None:
        return campaign
    campaign.withdrawn_at = timezone.now()
    campaign.save(update_fields=["withdrawn_at"])
    audit.record(
        actor=actor,
        action="planning.campaign_withdraw",
        target=campaign,
        tenant=tenant,
        before=_snapshot(campaign, list(campaign.tiers.values_list("slug", flat=True))),
    )
    return campaign
