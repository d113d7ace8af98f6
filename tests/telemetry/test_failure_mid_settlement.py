"""Failures injected in the middle of settlement (issue 37, "Bad input / safety"): the ledger
stays clean, and a failure refund is one transfer, idempotent and audited."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from audit.models import AuditEvent
from market.models import Allocation, Bid, Round
from market.services import settlement
from market.services.bids import bid_place
from market.services.failures import allocations_gpus_failed
from market.services.policy import policy_activate, policy_active, policy_version_create
from market.services.rounds import round_open_next
from market.services.tick import round_process
from market.spare import failure_refund
from telemetry.models import Gpu
from telemetry.payload.reports import GpuHealth
from telemetry.services.nodes import failed_gpus_sweep, gpus_health_apply
from tenants.ledger import MILLI, balance_get, ledger_verify
from tenants.models import Transfer
from tests import factories
from tests.api.world import GRID_EPOCH, round_minutes_around
from tests.telemetry.market_data import fleet_node

pytestmark = pytest.mark.django_db


@pytest.fixture
def due(tier):
    """A round whose window holds now, its bidding closed, with one team's gang bid on it; two
    nodes of four GPUs on the tier."""
    fleet_node(name="n1", tier=tier, gpus=4)
    fleet_node(name="n2", tier=tier, gpus=4)
    team = factories.tenant(name="Vision", credits=1_000 * MILLI)
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
    bid = bid_place(
        user=factories.member(tenant=team),
        tenant=team,
        round=rnd,
        quantity=2,
        min_quantity=2,
        limits={tier.slug: 5000},
        now=rnd.opens_at,
    )
    return rnd, bid, team


def _refunds(allocation: Allocation) -> list[int]:
    return list(
        Transfer.objects.filter(reference=f"allocation:{allocation.pk}", kind="refund")
        .order_by("pk")
        .values_list("amount", flat=True)
    )


def test_a_crash_in_the_middle_of_settlement_writes_nothing_and_a_retry_settles_once(
    due, monkeypatch
):
    rnd, bid, team = due
    before = balance_get(tenant=team)

    def crash(*args, **kwargs):
        raise RuntimeError("worker lost mid-settlement")

    # After the charges and releases are written, before the allocations are.
    monkeypatch.setattr(settlement, "_place", crash)
    with pytest.raises(RuntimeError):
        round_process(round_id=rnd.pk, now=rnd.closes_at)
    rnd.refresh_from_db()
    assert rnd.status == Round.Status.CLEARED
    assert not Allocation.objects.filter(round=rnd).exists()
    assert balance_get(tenant=team) == before  # the escrow is still held, nothing charged
    assert ledger_verify() == []

    monkeypatch.undo()
    round_process(round_id=rnd.pk, now=rnd.closes_at)
    round_process(round_id=rnd.pk, now=rnd.closes_at)
    allocation = Allocation.objects.get(bid=bid)
    assert Transfer.objects.filter(reference=f"bid:{bid.pk}", kind="charge").count() == 1
    assert balance_get(tenant=team).available == before.available + before.escrow - (
        allocation.charge
    )
    assert ledger_verify() == []


def test_a_gpu_failing_while_its_round_settles_is_refunded_once_audited_and_replaced(
    due, monkeypatch
):
    rnd, bid, team = due
    place = settlement._place
    failed: list[str] = []

    def place_then_fail(rnd, allocations, bids):
        place(rnd, allocations, bids)
        # A fatal XID arrives from the node while the settlement is still writing: the GPU
        # goes into maintenance before the allocation placed on it exists.
        uuid = allocations[0].placement[0]["uuid"]
        gpu = Gpu.objects.select_related("node").get(uuid=uuid)
        failed_at = timezone.now()
        gpus_health_apply(node=gpu.node, health={uuid: (failed_at, GpuHealth(xid=(79,)))})
        failed.append(uuid)

    monkeypatch.setattr(settlement, "_place", place_then_fail)
    round_process(round_id=rnd.pk, now=rnd.closes_at)
    monkeypatch.undo()
    allocation = Allocation.objects.get(bid=bid)
    assert failed[0] in {g["uuid"] for g in allocation.placement}
    assert ledger_verify() == []

    # The next health pass finds it on the failed GPU (here a few minutes later, so the lost
    # time is worth a refund): refunded pro rata and moved.
    now = min(timezone.now() + timedelta(minutes=5), allocation.ends_at - timedelta(seconds=30))
    assert failed_gpus_sweep(now=now) == 1
    allocation.refresh_from_db()
    assert failed[0] not in {g["uuid"] for g in allocation.placement}
    assert len(allocation.placement) == 2 and allocation.status == Allocation.Status.ACTIVE
    gpu = Gpu.objects.get(uuid=failed[0])
    assert gpu.maintenance and "XID 79" in gpu.failure
    expected = failure_refund(
        charge=allocation.charge,
        lost=(now - max(gpu.failed_at, allocation.starts_at)) // timedelta(microseconds=1),
        window=(allocation.ends_at - allocation.starts_at) // timedelta(microseconds=1),
        room=allocation.charge,
    )
    assert _refunds(allocation) == [expected] and expected > 0
    (event,) = AuditEvent.objects.filter(action="allocation.gpu_failure")
    assert event.after["refunded"] == expected and event.after["failed_gpus"] == failed
    assert ledger_verify() == []

    # Idempotent: the next pass and a retry of the same failure refund nothing more.
    assert failed_gpus_sweep(now=now + timedelta(seconds=5)) == 0
    allocations_gpus_failed(
        uuids=set(failed),
        failed_at=gpu.failed_at,
        reason="retry",
        actor="test",
        now=now + timedelta(seconds=10),
    )
    assert _refunds(allocation) == [expected]
    assert Bid.objects.get(pk=bid.pk).status == Bid.Status.WON
    assert ledger_verify() == []
