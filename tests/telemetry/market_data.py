"""Allocations for enforcement tests, written straight to the market's tables (as settlement
would leave them), so these tests need no auction."""

from __future__ import annotations

from datetime import datetime, timedelta

from market.models import Allocation, Bid, Round, Tier
from market.services import policy_active
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
