"""Idle reclaim (issue 37 item 2): a won GPU left idle is noticed, then reclaimed after the
grace, its unused time refunded once; work that came back, or work the platform stopped, is
never reclaimed."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from audit.models import AuditEvent
from market.errors import MarketError
from market.models import Reclaim
from market.services.launch import allocation_launch
from market.services.policy import policy_activate, policy_active, policy_version_create
from telemetry.models import EnforcementAction, Gpu, ProcessObservation, Sample
from telemetry.services.enforcement import enforce
from telemetry.services.idle import idle_reclaim_scan
from tenants.ledger import MILLI, balance_get, ledger_verify
from tenants.models import Notification, Transfer
from tests import factories
from tests.telemetry.market_data import fleet_node, settled_gang

pytestmark = pytest.mark.django_db

POLICY = {"below_pct": 5, "idle_minutes": 10, "grace_minutes": 5, "refund_pct": 50}


@pytest.fixture
def world(tier):
    fleet_node(name="n1", tier=tier, gpus=4)
    team = factories.tenant(name="Vision", credits=1_000 * MILLI)
    version = policy_version_create(
        actor=None, based_on=policy_active(), params={"idle_reclaim": {tier.slug: POLICY}}
    )
    policy_activate(version=version, actor=None)
    # The round clears and settles under a policy that carries the reclaim settings: the
    # clearing mechanism never sees them.
    allocation = settled_gang(tier=tier, tenant=team, user=factories.member(tenant=team))
    assert policy_active().params["idle_reclaim"] == {tier.slug: POLICY}
    return team, allocation


def _samples(uuid: str, *, util: float, start, end, step: int = 30) -> None:
    gpu = Gpu.objects.get(uuid=uuid)
    at, rows = start, []
    while at <= end:
        rows.append(
            Sample(
                gpu=gpu,
                at=at,
                utilization_pct=util,
                memory_used_mib=10,
                memory_total_mib=81920,
                power_w=60,
                temperature_c=40,
                energy_j=1,
            )
        )
        at += timedelta(seconds=step)
    Sample.objects.bulk_create(rows)


def test_an_idle_gpu_is_noticed_reclaimed_and_refunded_once(world):
    team, allocation = world
    idle, busy = (g["uuid"] for g in allocation.placement)
    now = timezone.now()
    _samples(idle, util=1, start=now - timedelta(minutes=11), end=now)
    _samples(busy, util=80, start=now - timedelta(minutes=11), end=now)

    report = idle_reclaim_scan(now=now)
    (reclaim,) = Reclaim.objects.all()
    assert report.noticed == [reclaim.pk] and reclaim.gpu_uuid == idle
    assert reclaim.status == Reclaim.Status.NOTICED
    assert Notification.objects.filter(tenant=team, kind="gpu_idle").count() == 1
    assert idle_reclaim_scan(now=now).noticed == []  # noticed once

    later = now + timedelta(minutes=5, seconds=30)
    _samples(idle, util=1, start=now + timedelta(seconds=30), end=later)
    _samples(busy, util=80, start=now + timedelta(seconds=30), end=later)
    before = balance_get(tenant=team).available
    assert idle_reclaim_scan(now=later).reclaimed == [reclaim.pk]
    reclaim.refresh_from_db()
    unused = int((allocation.ends_at - later).total_seconds())  # whole seconds, as charged
    expected = allocation.price * unused // 3600 * 50 // 100
    assert reclaim.status == Reclaim.Status.RECLAIMED and reclaim.refund == expected > 0
    assert balance_get(tenant=team).available == before + expected
    assert Notification.objects.filter(tenant=team, kind="gpu_reclaimed").count() == 1

    idle_reclaim_scan(now=later + timedelta(seconds=10))  # a second pass refunds nothing
    refunds = Transfer.objects.filter(kind=Transfer.Kind.REFUND, tenant=team)
    assert refunds.count() == 1 and refunds.get().amount == expected
    assert AuditEvent.objects.filter(action="allocation.reclaim").count() == 1
    assert ledger_verify() == []


def test_work_that_comes_back_withdraws_the_notice(world):
    _team, allocation = world
    idle = allocation.placement[0]["uuid"]
    now = timezone.now()
    _samples(idle, util=1, start=now - timedelta(minutes=11), end=now)
    idle_reclaim_scan(now=now)
    later = now + timedelta(minutes=6)
    _samples(idle, util=70, start=now + timedelta(seconds=30), end=later)
    report = idle_reclaim_scan(now=later)
    assert report.reclaimed == [] and len(report.withdrawn) == 1
    assert Reclaim.objects.get().status == Reclaim.Status.WITHDRAWN
    assert not Transfer.objects.filter(kind=Transfer.Kind.REFUND).exists()


def test_work_the_platform_stopped_is_never_reclaimed(world):
    team, allocation = world
    idle = allocation.placement[0]["uuid"]
    gpu = Gpu.objects.get(uuid=idle)
    now = timezone.now()
    _samples(idle, util=0, start=now - timedelta(minutes=11), end=now)
    ProcessObservation.objects.create(
        node=gpu.node,
        gpu=gpu,
        pid=4242,
        memory_mib=100,
        allocation_ref=allocation.pk,
        state=ProcessObservation.State.STOPPED,
        at=now,
        seen_at=now,
    )
    EnforcementAction.objects.create(
        node=gpu.node,
        gpu=gpu,
        pid=4242,
        allocation=allocation,
        tenant=team,
        action=EnforcementAction.Action.SUSPEND,
        reason="checkpoint",
        state=EnforcementAction.State.ACKNOWLEDGED,
        created_at=now - timedelta(minutes=30),
        acknowledged_at=now - timedelta(minutes=29),
    )
    assert idle_reclaim_scan(now=now).noticed == []
    assert not Reclaim.objects.exists()


def test_work_on_a_reclaimed_gpu_is_paused(world):
    _team, allocation = world
    idle = allocation.placement[0]["uuid"]
    gpu = Gpu.objects.get(uuid=idle)
    now = timezone.now()
    Reclaim.objects.create(
        allocation=allocation,
        tenant=allocation.tenant,
        tier=allocation.tier,
        gpu_uuid=idle,
        node="n1",
        gpu_index=gpu.index,
        status=Reclaim.Status.RECLAIMED,
        idle_since=now - timedelta(minutes=20),
        noticed_at=now - timedelta(minutes=10),
        reclaim_after=now - timedelta(minutes=5),
        reclaimed_at=now - timedelta(minutes=5),
    )
    ProcessObservation.objects.create(
        node=gpu.node,
        gpu=gpu,
        pid=77,
        memory_mib=100,
        allocation_ref=allocation.pk,
        launch_token=allocation_launch(allocation=allocation, node="n1", now=now).token,
        state=ProcessObservation.State.RUNNING,
        at=now,
        seen_at=now,
    )
    gpu.node.last_seen_at = now
    gpu.node.save(update_fields=["last_seen_at"])
    (action,) = [a for a in enforce(now=now).issued if a.pid == 77]
    assert action.action == EnforcementAction.Action.PAUSE and "reclaimed" in action.reason


@pytest.mark.parametrize(
    ("terms", "message"),
    [
        ({"a100": {"below_pct": 5}}, "needs grace_minutes, idle_minutes, refund_pct"),
        ({"a100": POLICY | {"refund_pct": 150}}, "refund_pct must be at most 100"),
        ({"h200": POLICY}, "unknown tier(s) h200"),
        ({"a100": POLICY | {"every": 3}}, "cannot set every"),
    ],
)
def test_a_bad_idle_policy_is_refused_by_name(tier, terms, message):
    with pytest.raises(MarketError, match=message.replace("(", r"\(").replace(")", r"\)")):
        policy_version_create(actor=None, based_on=policy_active(), params={"idle_reclaim": terms})
