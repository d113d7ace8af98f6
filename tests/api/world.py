"""Two tenants with one of everything the API serves, made through the services.

Tenant A and tenant B each get: a member with an API token, a campaign, a soft budget that
the round's charge crosses (so a notification exists), a won allocation in a round whose
window contains now, and an open bid in the round open for bidding.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import timedelta

from django.utils import timezone
from rest_framework.test import APIClient

from market.models import Allocation, Bid, Round
from market.services import (
    bid_place,
    policy_activate,
    policy_active,
    policy_version_create,
    round_open_next,
    round_process,
    tier_create,
)
from tenants.api.tokens import token_create
from tenants.budgets import budget_alerts_raise, budget_set, campaign_create
from tenants.models import Budget, Campaign, Notification, Tenant, Transfer
from tests import factories

TIER = "a100"
RESERVE = 1_000  # milli-credits per GPU-hour
CREDITS = 1_000_000  # milli-credits granted to each tenant


@dataclass
class Side:
    tenant: Tenant
    user: object
    token: str
    campaign: Campaign
    budget: Budget
    allocation: Allocation
    bid: Bid
    extra: dict = field(default_factory=dict)

    def client(self) -> APIClient:
        api = APIClient()
        api.credentials(HTTP_AUTHORIZATION=f"Bearer {self.token}")
        return api

    def objects(self) -> dict[type, object]:
        """One row of each tenant-owned model this side has, for the cross-tenant matrix."""
        return {
            Bid: self.bid,
            Allocation: self.allocation,
            Budget: self.budget,
            Campaign: self.campaign,
            Transfer: Transfer.objects.filter(tenant=self.tenant).order_by("pk").first(),
            Notification: Notification.objects.filter(tenant=self.tenant).order_by("pk").first(),
        }


@dataclass
class World:
    a: Side
    b: Side
    admin: object
    admin_token: str
    open_round: Round
    past_round: Round


def world_build(*, gpus_per_bid: int = 2) -> World:
    admin = factories.admin_user()
    tier_create(actor=admin, slug=TIER, name="A100 80GB", capacity=8)
    draft = policy_version_create(
        actor=admin, based_on=policy_active(), reserve_prices={TIER: RESERVE}
    )
    policy_activate(version=draft, actor=admin)

    now = timezone.now()
    # Opened 75 minutes ago: its 60-minute window starts at most now and ends after now, so
    # the allocations it settles are running now.
    past = round_open_next(now=now - timedelta(minutes=75))
    tenants = [factories.tenant(credits=CREDITS, actor=admin) for _ in range(2)]
    users = [factories.member(tenant=t) for t in tenants]
    past_bids = [
        bid_place(
            user=user,
            tenant=tenant,
            round=past,
            quantity=gpus_per_bid,
            limits={TIER: 5_000},
            now=past.opens_at,
        )
        for tenant, user in zip(tenants, users, strict=True)
    ]
    budgets = [
        budget_set(
            tenant=t, window=Budget.Window.MONTH, mode=Budget.Mode.SOFT, cap=1_000, actor=admin
        )
        for t in tenants
    ]
    round_process(round_id=past.pk, now=past.closes_at)
    past.refresh_from_db()
    for tenant in tenants:
        budget_alerts_raise(tenant=tenant)

    current = round_open_next(now=now)
    sides = []
    for tenant, user, budget, past_bid in zip(tenants, users, budgets, past_bids, strict=True):
        campaign = campaign_create(
            tenant=tenant,
            name="deadline",
            starts_at=now - timedelta(days=1),
            ends_at=now + timedelta(days=30),
            actor=user,
        )
        bid = bid_place(user=user, tenant=tenant, round=current, quantity=1, limits={TIER: 2_000})
        sides.append(
            Side(
                tenant=tenant,
                user=user,
                token=token_create(user=user, name="laptop").secret,
                campaign=campaign,
                budget=budget,
                allocation=Allocation.objects.get(bid=past_bid),
                bid=bid,
            )
        )
    return World(
        a=sides[0],
        b=sides[1],
        admin=admin,
        admin_token=token_create(user=admin, name="ops").secret,
        open_round=current,
        past_round=past,
    )
