"""Allocations for enforcement tests, written straight to the market's tables (as settlement
would leave them), so these tests need no auction."""

from __future__ import annotations

from datetime import datetime, timedelta

from django.utils import timezone

from market.models import Allocation, Bid, Round, Tier
from market.services import (
    bid_place,
    policy_activate,
    policy_active,
    policy_version_create,
    round_open_next,
    round_process,
)
from tenants.models import Tenant
from tests import factories


def allocation_make(
    *,
    tenant: Tenant,
    tier: Tier,
    gpus: int = 1,
    starts_at: datetime,
    ends_at: datetime,
    status: str = Allocation.Status.ACTIVE,
    pk: int | None = None,
) -> Allocation:
    rnd, _ = Round.objects.get_or_create(
        starts_at=starts_at,
        defaults={
            "policy": policy_active(),
            "status": Round.Status.SETTLED,
            "opens_at": starts_at - timedelta(hours=2),
            "closes_at": starts_at - timedelta(hours=1),
            "ends_at": ends_at,
        },
    )
    bid = Bid.objects.create(
        tenant=tenant,
        author=factories.member(tenant=tenant),
        round=rnd,
        quantity=gpus,
        status=Bid.Status.WON,
    )
    return Allocation.objects.create(
        pk=pk,
        tenant=tenant,
        round=rnd,
        bid=bid,
        tier=tier,
        gpus=gpus,
        price=1000,
        charge=1000 * gpus,
        starts_at=starts_at,
        ends_at=ends_at,
        status=status,
    )


def settled_gang(*, tier: Tier, tenant: Tenant, user, gpus: int = 2) -> Allocation:
    """A round for the window holding now, cleared and settled through the real services
    (placement included), in which ``tenant`` won a gang of ``gpus`` on ``tier``."""
    from tests.api.world import GRID_EPOCH, round_minutes_around

    now = timezone.now()
    minutes = round_minutes_around(now)
    draft = policy_version_create(
        actor=None,
        based_on=policy_active(),
        reserve_prices={tier.slug: 1000},
        round_minutes=minutes,
    )
    policy_activate(version=draft, actor=None)
    length = timedelta(minutes=minutes)
    rnd = round_open_next(now=now - (now - GRID_EPOCH) % length - length / 2)
    assert rnd.starts_at <= now < rnd.ends_at
    bid = bid_place(
        user=user,
        tenant=tenant,
        round=rnd,
        quantity=gpus,
        min_quantity=gpus,
        limits={tier.slug: 5000},
        now=rnd.opens_at,
    )
    round_process(round_id=rnd.pk, now=rnd.closes_at)
    return Allocation.objects.get(bid=bid)
