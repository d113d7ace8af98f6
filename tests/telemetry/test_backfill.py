"""Backfill within a window (issue 37 item 3): an idle allocation is noticed, reclaimed and
refunded; its GPU and the unsold ones are taken by another team's standing order on
preemptible terms, whose work is suspended (checkpoint signal, grace) when the window ends and
the GPU goes back to the next window's owner."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from market import clearing
from market.errors import MarketError
from market.models import Allocation, Backfill, Bid, Order, Reclaim
from market.services.backfill import backfill_pool, backfill_run
from market.services.launch import allocation_launch
from market.services.orders.lifecycle import order_create
from market.services.policy import policy_activate, policy_active, policy_version_create
from market.services.tick import rounds_tick
from market.services.void import round_void
from telemetry.models import EnforcementAction, Gpu, Node, ProcessObservation
from telemetry.services.enforcement import enforce
from telemetry.services.idle import idle_reclaim_scan
from tenants.ledger import MILLI, balance_get, credits_hold, ledger_verify
from tenants.models import Notification
from tests import factories
from tests.telemetry.market_data import fleet_node, settled_gang
from tests.telemetry.test_idle_reclaim import POLICY, _samples

pytestmark = pytest.mark.django_db


@pytest.fixture
def world(tier):
    fleet_node(name="n1", tier=tier, gpus=4)
    owner = factories.tenant(name="Vision", credits=1_000 * MILLI)
    version = policy_version_create(
        actor=None, based_on=policy_active(), params={"idle_reclaim": {tier.slug: POLICY}}
    )
    policy_activate(version=version, actor=None)
    allocation = settled_gang(tier=tier, tenant=owner, user=factories.member(tenant=owner))
    other = factories.tenant(name="Speech", credits=1_000 * MILLI)
    order = order_create(
        user=factories.member(tenant=other),
        tenant=other,
        name="sweep",
        values={tier.slug: 2000},
        gpus=3,
        min_gpus=1,
        ceiling=500 * MILLI,
        preemptible=True,
    )
    return owner, allocation, other, order


def _process(gpu_uuid, *, pid, allocation, now):
    gpu = Gpu.objects.get(uuid=gpu_uuid)
    gpu.node.last_seen_at = now
    gpu.node.save(update_fields=["last_seen_at"])
    return ProcessObservation.objects.create(
        node=gpu.node,
        gpu=gpu,
        pid=pid,
        memory_mib=100,
        allocation_ref=allocation.pk,
        launch_token=allocation_launch(allocation=allocation, node="n1", now=now).token,
        state=ProcessObservation.State.RUNNING,
        at=now,
        seen_at=now,
    )


def test_idle_gpu_reclaimed_backfilled_and_preempted_at_the_windows_end(world, tier):
    owner, allocation, other, order = world
    idle, busy = (g["uuid"] for g in allocation.placement)
    now = timezone.now()
    assert len(backfill_pool(now=now)[tier.slug]) == 2  # the unsold GPUs

    later = now + timedelta(minutes=5, seconds=30)
    _samples(idle, util=1, start=now - timedelta(minutes=11), end=later)
    _samples(busy, util=90, start=now - timedelta(minutes=11), end=later)
    idle_reclaim_scan(now=now)
    idle_reclaim_scan(now=later)
    reclaim = Reclaim.objects.get(status=Reclaim.Status.RECLAIMED)
    assert reclaim.gpu_uuid == idle and reclaim.refund > 0
    pool = backfill_pool(now=later)[tier.slug]
    assert idle in {g.uuid for g in pool} and len(pool) == 3

    before = balance_get(tenant=other).available
    report = backfill_run(now=later)
    (backfilled,) = Allocation.objects.filter(pk__in=report.allocations)
    assert backfilled.tenant == other and backfilled.preemptible and backfilled.gpus == 3
    assert backfilled.ends_at == allocation.ends_at and backfilled.starts_at == later
    assert {g["uuid"] for g in backfilled.placement} == {g.uuid for g in pool}
    seconds = int((allocation.ends_at - later).total_seconds())
    assert backfilled.charge == 3 * backfilled.price * seconds // 3600 > 0
    assert backfilled.price <= 2000
    assert balance_get(tenant=other).available == before - backfilled.charge
    assert balance_get(tenant=other).escrow == 0
    order.refresh_from_db()
    assert order.spent == backfilled.charge and order.gpu_seconds == 3 * seconds
    assert Bid.objects.get(order=order, backfill__isnull=False).status == Bid.Status.WON
    assert Notification.objects.filter(tenant=other, kind="backfill_won").exists()
    assert ledger_verify() == []

    # Nothing left to offer, and a sub-round runs only every few minutes.
    assert backfill_run(now=later + timedelta(seconds=5)).skipped
    assert backfill_pool(now=later) == {}
    assert Backfill.objects.count() == 1

    # The backfilled work runs on the reclaimed GPU; the owner's work there does not.
    _process(idle, pid=501, allocation=backfilled, now=later)
    _process(idle, pid=502, allocation=allocation, now=later)
    actions = {a.pid: a for a in enforce(now=later).issued}
    assert 501 not in actions
    assert actions[502].action == EnforcementAction.Action.PAUSE

    # The window ends: the backfilled order's work gets the checkpoint signal and the grace.
    end = allocation.ends_at + timedelta(seconds=1)
    ProcessObservation.objects.filter(pid=501).update(at=end, seen_at=end)
    Node.objects.update(last_seen_at=end)
    actions = {a.pid: a for a in enforce(now=end).issued}
    assert actions[501].action == EnforcementAction.Action.SUSPEND
    assert actions[501].grace_seconds > 0
    backfilled.refresh_from_db()
    assert backfilled.status == Allocation.Status.PREEMPTED


def test_orders_that_do_not_accept_preemptible_capacity_never_backfill(world):
    _owner, _allocation, _other, order = world
    Order.objects.filter(pk=order.pk).update(preemptible=False)
    report = backfill_run(now=timezone.now())
    assert report.allocations == [] and not Allocation.objects.filter(preemptible=True).exists()


def test_a_team_that_cannot_pay_sits_the_sub_round_out(world):
    _owner, _allocation, other, order = world
    credits_hold(tenant=other, amount=balance_get(tenant=other).available, reason="elsewhere")
    report = backfill_run(now=timezone.now())
    assert report.allocations == []
    assert not Bid.objects.filter(order=order, backfill__isnull=False, status=Bid.Status.WON)
    assert ledger_verify() == []


def test_a_sub_round_that_cannot_clear_gives_every_bid_its_escrow_back(world, monkeypatch):
    _owner, _allocation, other, order = world
    before = balance_get(tenant=other)

    def fails(**_):
        raise clearing.ClearingError("the solver gave up")

    monkeypatch.setattr("market.services.backfill.solve", fails)
    report = backfill_run(now=timezone.now())
    assert report.backfill is not None and report.allocations == []
    backfill = Backfill.objects.get(pk=report.backfill)
    assert backfill.diagnostics["status"] == "failed"
    assert "the solver gave up" in backfill.diagnostics["error"]
    assert backfill.gpus_won == 0 and backfill.revenue == 0
    bid = Bid.objects.get(order=order, backfill=backfill)
    assert bid.status == Bid.Status.LOST and bid.escrow == 0
    assert balance_get(tenant=other) == before
    assert not Allocation.objects.filter(preemptible=True).exists()
    assert ledger_verify() == []


def test_the_market_clock_runs_the_sub_round(world, tier):
    _owner, _allocation, other, _order = world
    report = rounds_tick(now=timezone.now())
    (backfilled,) = Allocation.objects.filter(pk__in=report.backfilled)
    assert backfilled.tenant == other and backfilled.gpus == 2  # the two unsold GPUs
    assert rounds_tick(now=timezone.now()).backfilled == []  # not again within the interval


@pytest.mark.parametrize("minutes", [0, 61, "5"])
def test_a_bad_backfill_interval_is_refused(tier, minutes):
    with pytest.raises(MarketError, match="params.backfill_minutes"):
        policy_version_create(
            actor=None, based_on=policy_active(), params={"backfill_minutes": minutes}
        )


def test_voiding_the_window_gives_back_exactly_what_was_paid(world, tier):
    owner, allocation, other, order = world
    paid = allocation.charge
    owner_before = balance_get(tenant=owner).available
    other_before = balance_get(tenant=other).available
    idle = allocation.placement[0]["uuid"]
    now = timezone.now()
    later = now + timedelta(minutes=5, seconds=30)
    _samples(idle, util=1, start=now - timedelta(minutes=11), end=later)
    _samples(allocation.placement[1]["uuid"], util=90, start=now - timedelta(minutes=11), end=later)
    idle_reclaim_scan(now=now)
    idle_reclaim_scan(now=later)
    refund = Reclaim.objects.get().refund
    allocation.refresh_from_db()
    assert allocation.charge == paid - refund  # what it pays net
    assert backfill_run(now=later).allocations

    round_void(round=allocation.round, actor=None, reason="test", now=later)
    assert balance_get(tenant=owner).available == owner_before + paid
    assert balance_get(tenant=other).available == other_before
    order.refresh_from_db()
    assert order.spent == 0 and order.gpu_seconds == 0
    assert ledger_verify() == []
