"""Allocations for enforcement tests, written straight to the market's tables (as settlement
would leave them), so these tests need no auction."""

from __future__ import annotations

from datetime import datetime, timedelta

from django.utils import timezone

from market.models import Allocation, Bid, Round, Tier
from market.services.bids import bid_place
from market.services.policy import policy_activate, policy_active, policy_version_create
from market.services.rounds import round_open_next
from market.services.tick import round_process
from telemetry.models import Gpu, Node
from telemetry.services import node_register, tier_capacity_refresh
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


def fleet_node(*, name: str, tier: Tier, gpus: int = 4, islands: int = 2) -> Node:
    """A registered node, healthy as after its first batch, with ``gpus`` GPUs on ``tier``
    (uuids GPU-<name>-<index>) split into ``islands`` NVLink domains, each behind its own PCIe
    switch, named by their first GPU (nvl0, nvl2...); the tier's capacity follows."""
    node, _token = node_register(name=name, tier=tier, actor="test")
    node.healthy = True
    node.save(update_fields=["healthy"])
    per = gpus // islands
    for i in range(gpus):
        Gpu.objects.create(
            node=node,
            uuid=f"GPU-{name}-{i}",
            index=i,
            name="Test GPU",
            tier=tier,
            memory_total_mib=81920,
            nvlink_domain=f"nvl{i // per * per}",
            pcie_switch=f"pcie{i // per * per}",
        )
    tier_capacity_refresh(tiers=[tier])
    return node
