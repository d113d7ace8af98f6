"""Two tenants with one of everything the API serves, made through the services.

Tenant A and tenant B each get: a member with an API token, a campaign, a soft budget that
the round's charge crosses (so a notification exists), a won allocation in a round whose
window contains now, and an open bid in the round open for bidding.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

from django.utils import timezone
from rest_framework.test import APIClient

from audit.models import AuditEvent
from governance.models import ChangeRequest
from governance.services import change_request
from market.models import Allocation, Bid, Order, Round
from market.services.bids import bid_place
from market.services.orders.lifecycle import order_create, order_pause
from market.services.policy import policy_activate, policy_active, policy_version_create
from market.services.rounds import round_open_next
from market.services.tick import round_process
from market.services.tiers import tier_create
from planning.models import PlannedCampaign
from planning.services.campaigns import planned_campaign_declare
from telemetry.models import EnforcementAction, Node
from telemetry.services import node_register, samples_ingest
from telemetry.services.enforcement import enforce
from tenants.budgets import budget_alerts_raise, budget_set, campaign_create
from tenants.models import Budget, Campaign, Notification, Tenant, Transfer
from tenants.services.tokens import token_create
from tests import factories

TIER = "a100"
RESERVE = 1_000  # milli-credits per GPU-hour
CREDITS = 1_000_000  # milli-credits granted to each tenant
# Round windows lie on a grid of the round length counted from this epoch (market.services.rounds).
GRID_EPOCH = datetime(2000, 1, 1, tzinfo=UTC)
MARGIN = timedelta(minutes=20)


def round_minutes_around(now: datetime) -> int:
    """A round length whose grid window containing ``now`` began at least MARGIN ago and
    ends at least MARGIN from now, so the settled allocations run throughout a test and
    have samples from before it, whatever the time of day."""
    for minutes in range(60, 240):
        length = timedelta(minutes=minutes)
        phase = (now - GRID_EPOCH) % length
        if MARGIN <= phase <= length - MARGIN:
            return minutes
    raise AssertionError("no round length fits; the search range is too small")


@dataclass
class Side:
    tenant: Tenant
    user: object
    token: str
    campaign: Campaign
    budget: Budget
    allocation: Allocation
    bid: Bid
    planned: PlannedCampaign
    extra: dict = field(default_factory=dict)
    order: Order | None = None

    def client(self) -> APIClient:
        api = APIClient()
        api.credentials(HTTP_AUTHORIZATION=f"Bearer {self.token}")
        return api

    def objects(self) -> dict[type, object]:
        """One row of each tenant-owned model this side has, for the cross-tenant matrix."""
        return {
            Bid: self.bid,
            Allocation: self.allocation,
            Order: self.order,
            Budget: self.budget,
            Campaign: self.campaign,
            PlannedCampaign: self.planned,
            Transfer: Transfer.objects.filter(tenant=self.tenant).order_by("pk").first(),
            Notification: Notification.objects.filter(tenant=self.tenant).order_by("pk").first(),
            AuditEvent: AuditEvent.objects.filter(tenant=self.tenant).order_by("pk").first(),
            EnforcementAction: EnforcementAction.objects.filter(tenant=self.tenant)
            .order_by("pk")
            .first(),
            ChangeRequest: ChangeRequest.objects.filter(tenant=self.tenant).order_by("pk").first(),
        }


@dataclass
class World:
    a: Side
    b: Side
    admin: object
    admin_token: str
    open_round: Round
    past_round: Round
    node: Node | None = None


def world_build(*, gpus_per_bid: int = 2) -> World:
    admin = factories.admin_user()
    tier_create(actor=admin, slug=TIER, name="A100 80GB", capacity=8)
    now = timezone.now()
    minutes = round_minutes_around(now)
    draft = policy_version_create(
        actor=admin, based_on=policy_active(), reserve_prices={TIER: RESERVE}, round_minutes=minutes
    )
    policy_activate(version=draft, actor=admin)

    # Opened half a round before the window that contains now: it auctions that window.
    length = timedelta(minutes=minutes)
    window_start = now - (now - GRID_EPOCH) % length
    past = round_open_next(now=window_start - length / 2)
    assert (
        past.starts_at == window_start
        and past.starts_at <= now - MARGIN < now + MARGIN <= past.ends_at
    )
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

    # A paused standing order each, made while no round is open: it holds no escrow and
    # makes no bid, so the bids and balances the tests expect are as before.
    orders = []
    for tenant, user in zip(tenants, users, strict=True):
        order = order_create(
            user=user,
            tenant=tenant,
            name="standing",
            values={TIER: 2 * RESERVE},
            gpus=1,
            ceiling=100 * RESERVE,
        )
        orders.append(order_pause(user=user, tenant=tenant, order_id=order.pk))
    current = round_open_next(now=now)
    sides = []
    for tenant, user, budget, past_bid, order in zip(
        tenants, users, budgets, past_bids, orders, strict=True
    ):
        campaign = campaign_create(
            tenant=tenant,
            name="deadline",
            starts_at=now - timedelta(days=1),
            ends_at=now + timedelta(days=30),
            actor=user,
        )
        bid = bid_place(user=user, tenant=tenant, round=current, quantity=1, limits={TIER: 2_000})
        # Waits for a second admin (the two-person rule's default), so nothing changes.
        change_request(
            kind=ChangeRequest.Kind.TENANT_WEIGHT,
            actor=admin,
            justification="a new group joined",
            payload={"tenant": tenant.pk, "weight": 2},
        )
        planned = planned_campaign_declare(
            tenant=tenant,
            actor=user,
            name="next push",
            starts_at=now + timedelta(days=2),
            ends_at=now + timedelta(days=9),
            gpu_hours=1_000,
            tiers=[TIER],
        )
        sides.append(
            Side(
                tenant=tenant,
                user=user,
                token=token_create(user=user, name="laptop").secret,
                campaign=campaign,
                budget=budget,
                allocation=Allocation.objects.get(bid=past_bid),
                bid=bid,
                planned=planned,
                order=order,
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


GPU_MEMORY_MIB = 81_920


def gpu_uuid(index: int) -> str:
    return f"GPU-TEST-{index:02d}"


def telemetry_batch(
    *,
    node: Node,
    at: datetime,
    gpus: int,
    utilization: dict[int, int],
    processes: dict[int, int | None],
    memory_used_mib: int = 8_000,
) -> None:
    """One agent batch (docs/telemetry-protocol.md) read at ``at``: GPU i at utilization[i] %
    (default 0), running one process tagged with allocation processes[i] if i is a key."""
    samples = []
    for i in range(gpus):
        procs = []
        if i in processes:
            procs.append(
                {
                    "pid": 1000 + i,
                    "memory_mib": memory_used_mib,
                    "allocation": processes[i],
                    "slurm_job": None,
                    "pod": None,
                    "state": "running",
                }
            )
        samples.append(
            {
                "gpu": gpu_uuid(i),
                "at": at.isoformat(),
                "utilization_pct": utilization.get(i, 0),
                "memory_used_mib": memory_used_mib,
                "memory_total_mib": GPU_MEMORY_MIB,
                "power_w": 250.0,
                "temperature_c": 55.0,
                "energy_j": 1000.0 + at.timestamp(),
                "processes": procs,
            }
        )
    payload = {
        "batch_id": str(uuid.uuid4()),
        "sent_at": at.isoformat(),
        "backend": "simulated",
        "agent_version": "0.1.0",
        "hostname": node.name,
        "gpus": [
            {
                "uuid": gpu_uuid(i),
                "index": i,
                "name": "Simulated A100",
                "memory_total_mib": GPU_MEMORY_MIB,
            }
            for i in range(gpus)
        ],
        "samples": samples,
        "directive_results": [],
    }
    samples_ingest(node=node, payload=payload, now=at)


def world_telemetry(world: World) -> None:
    """A node of six GPUs in the tier. Each tenant runs its allocation's job on three GPUs,
    one more than it won, so the enforcement loop pauses one process per tenant (an
    EnforcementAction each)."""
    tier = world.a.allocation.tier
    node, _token = node_register(name="node-1", tier=tier, actor=world.admin)
    tags = {
        0: world.a.allocation.pk,
        1: world.a.allocation.pk,
        2: world.a.allocation.pk,
        3: world.b.allocation.pk,
        4: world.b.allocation.pk,
        5: world.b.allocation.pk,
    }
    # Ten minutes ago, so the pace tests' later batches replace this view of the processes.
    at = timezone.now() - timedelta(minutes=10)
    telemetry_batch(
        node=node,
        at=at,
        gpus=6,
        utilization={i: 50 for i in tags},
        processes=tags,
    )
    report = enforce(now=at + timedelta(seconds=1))
    assert len(report.issued) == 2, report
    world.node = node
