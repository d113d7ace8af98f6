"""GPU-hours paid vs used, idle spend, energy and cost per used GPU-hour (telemetry/efficiency)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from market.models import Allocation, Reclaim
from telemetry.efficiency.selectors import (
    allocations_use,
    efficiency_by_campaign,
    efficiency_by_day,
    team_use_trailing,
    teams_by_idle_spend,
)
from telemetry.models import Gpu, SampleMinute
from tenants.budgets import campaign_create
from tenants.ledger import credits_charge, credits_hold, credits_refund
from tests import factories
from tests.telemetry.market_data import allocation_make

pytestmark = pytest.mark.django_db

NOW = datetime(2026, 11, 20, 15, 30, tzinfo=UTC)
START = datetime(2026, 11, 20, 12, 0, tzinfo=UTC)


def _gpus(node, tier, n: int) -> list[Gpu]:
    return [
        Gpu.objects.create(
            node=node, uuid=f"GPU-{i}", index=i, name="A100", tier=tier, memory_total_mib=81920
        )
        for i in range(n)
    ]


def _minutes(gpu: Gpu, start: datetime, minutes: int, util: float, energy_j: float = 0.0) -> None:
    SampleMinute.objects.bulk_create(
        SampleMinute(
            gpu=gpu,
            minute=start + timedelta(minutes=m),
            samples=6,
            utilization_avg=util,
            utilization_max=util,
            memory_used_avg=1,
            memory_used_max=1,
            power_avg=300,
            power_max=300,
            temperature_max=60,
            energy_j_last=energy_j * (m + 1),
            energy_j=energy_j,
        )
        for m in range(minutes)
    )


def _placed(allocation: Allocation, gpus: list[Gpu]) -> Allocation:
    allocation.placement = [{"node": g.node.name, "index": g.index, "uuid": g.uuid} for g in gpus]
    allocation.save(update_fields=["placement"])
    return allocation


def _charged(tenant, allocation: Allocation) -> None:
    credits_hold(tenant=tenant, amount=allocation.charge, reference=f"bid:{allocation.bid_id}")
    credits_charge(tenant=tenant, amount=allocation.charge, reference=f"bid:{allocation.bid_id}")


@pytest.fixture
def world(tier, node):
    team = factories.tenant(name="Vision", credits=100_000)
    gpus = _gpus(node, tier, 3)
    # Two GPUs for an hour, 2,000 milli-credits: GPU 0 busy at 100 % for the hour, GPU 1 at
    # 50 % for half of it and silent for the rest.
    alloc = _placed(
        allocation_make(
            tenant=team, tier=tier, gpus=2, starts_at=START, ends_at=START + timedelta(hours=1)
        ),
        gpus[:2],
    )
    _charged(team, alloc)
    _minutes(gpus[0], START, 60, 100.0, energy_j=18_000)
    _minutes(gpus[1], START, 30, 50.0, energy_j=6_000)
    # Readings outside the window, and on a GPU it does not hold, are not its use.
    _minutes(gpus[0], START + timedelta(hours=1), 30, 100.0)
    _minutes(gpus[2], START, 60, 100.0)
    return team, tier, gpus, alloc


def test_paid_used_idle_spend_and_energy_of_one_allocation(world):
    team, _, _, alloc = world
    [use] = allocations_use(since=START, until=NOW, tenant=team, now=NOW)
    assert use.allocation == alloc.pk and use.measured
    assert use.paid_hours == pytest.approx(2.0)
    assert use.used_hours == pytest.approx(1.0 + 0.25)
    assert use.spend == 2_000
    assert use.idle_spend == 750  # 2,000 x 0.75 / 2 unused
    assert use.energy_j == pytest.approx(60 * 18_000 + 30 * 6_000)


def test_refunds_against_the_allocation_lower_its_spend(world):
    team, _, _, alloc = world
    credits_refund(tenant=team, amount=400, reference=f"allocation:{alloc.pk}")
    credits_refund(tenant=team, amount=100, reference="allocation:999999")  # another one's
    [use] = allocations_use(since=START, until=NOW, tenant=team, now=NOW)
    assert use.spend == 1_600
    assert use.idle_spend == 600


def test_a_reclaimed_gpu_stops_counting_when_reclaimed(world):
    team, tier, gpus, alloc = world
    Reclaim.objects.create(
        allocation=alloc,
        tenant=team,
        tier=tier,
        gpu_uuid=gpus[1].uuid,
        node=gpus[1].node.name,
        gpu_index=1,
        status=Reclaim.Status.RECLAIMED,
        idle_since=START,
        noticed_at=START,
        reclaim_after=START,
        reclaimed_at=START + timedelta(minutes=15),
    )
    [use] = allocations_use(since=START, until=NOW, tenant=team, now=NOW)
    assert use.paid_hours == pytest.approx(1.25)
    assert use.used_hours == pytest.approx(1.0 + 15 / 60 * 0.5)


def test_a_running_allocation_counts_up_to_now_and_another_team_is_never_mixed_in(world):
    team, tier, gpus, _ = world
    other = factories.tenant(name="Speech", credits=10_000)
    running = _placed(
        allocation_make(
            tenant=other,
            tier=tier,
            gpus=1,
            starts_at=NOW - timedelta(minutes=30),
            ends_at=NOW + timedelta(minutes=30),
        ),
        gpus[2:],
    )
    uses = {u.allocation: u for u in allocations_use(since=START, until=NOW, now=NOW)}
    assert uses[running.pk].paid_hours == pytest.approx(0.5)
    assert [u.tenant for u in allocations_use(since=START, until=NOW, tenant=team, now=NOW)] == [
        team.pk
    ]


def test_an_unplaced_allocation_is_unmeasured_not_idle(tier, node):
    team = factories.tenant(name="Vision", credits=100_000)
    allocation_make(
        tenant=team, tier=tier, gpus=4, starts_at=START, ends_at=START + timedelta(hours=1)
    )
    [(_, totals)] = [
        row for row in efficiency_by_day(tenant=team, days=1, now=NOW) if row[1].allocations
    ]
    assert totals.unmeasured_hours == pytest.approx(4.0)
    assert totals.unmeasured_spend == 4_000 and totals.idle_spend == 0
    assert totals.used_pct is None and totals.cost_per_used_hour is None


def test_by_day_by_campaign_and_the_staff_ranking(world):
    team, tier, gpus, alloc = world
    campaign = campaign_create(
        tenant=team,
        name="deadline",
        starts_at=START - timedelta(days=1),
        ends_at=START + timedelta(days=1),
        actor=None,
    )
    alloc.bid.campaign = campaign
    alloc.bid.save(update_fields=["campaign"])
    days = efficiency_by_day(tenant=team, days=3, now=NOW)
    assert [d.isoformat() for d, _ in days] == ["2026-11-18", "2026-11-19", "2026-11-20"]
    today = days[-1][1]
    assert today.paid_hours == pytest.approx(2.0) and today.idle_spend == 750
    assert today.used_pct == pytest.approx(62.5)
    assert today.cost_per_used_hour == round(2_000 / 1.25)
    assert today.energy_kwh == pytest.approx((60 * 18_000 + 30 * 6_000) / 3.6e6)
    only = efficiency_by_day(tenant=team, days=1, campaign=campaign, now=NOW)
    assert only[0][1].allocations == 1
    [(named, totals)] = efficiency_by_campaign(tenant=team, days=1, now=NOW)
    assert named == campaign and totals.idle_spend == 750

    lazy = factories.tenant(name="Idle lab", credits=100_000)
    idle = _placed(
        allocation_make(
            tenant=lazy, tier=tier, gpus=1, starts_at=START, ends_at=START + timedelta(hours=1)
        ),
        gpus[2:],
    )
    SampleMinute.objects.filter(gpu=gpus[2]).update(utilization_avg=0.0)
    _charged(lazy, idle)
    ranking = teams_by_idle_spend(days=1, now=NOW)
    assert [(t.name, totals.idle_spend) for t, totals in ranking] == [
        ("Idle lab", 1_000),
        ("Vision", 750),
    ]


def test_trailing_hours_are_clipped_to_the_period(world):
    team, *_ = world
    trailing = team_use_trailing(hours=1, now=START + timedelta(minutes=90))
    # Only the last 30 minutes of the window fall in the hour before 13:30.
    assert trailing[team.pk].paid_hours == pytest.approx(1.0)
    assert trailing[team.pk].used_hours == pytest.approx(0.5)


@pytest.fixture
def recent(tier, node):
    """Vision's hour that ended an hour ago, on one GPU at 25 %: 1,000 spent, 750 idle."""
    from django.utils import timezone

    team = factories.tenant(name="Vision", credits=100_000)
    [gpu] = _gpus(node, tier, 1)
    start = timezone.now().replace(second=0, microsecond=0) - timedelta(hours=2)
    alloc = _placed(
        allocation_make(
            tenant=team, tier=tier, gpus=1, starts_at=start, ends_at=start + timedelta(hours=1)
        ),
        [gpu],
    )
    _charged(team, alloc)
    _minutes(gpu, start, 60, 25.0)
    return team


def test_the_pages_scope_to_the_callers_team_and_refuse_bad_filters(recent, client):
    team = recent
    other = factories.tenant(name="Speech", credits=10_000)
    theirs = campaign_create(
        tenant=other,
        name="theirs",
        starts_at=START - timedelta(days=1),
        ends_at=START + timedelta(days=1),
        actor=None,
    )
    client.force_login(factories.member(tenant=team))
    response = client.get("/fleet/efficiency/")
    assert response.status_code == 200
    assert response.context["total"].idle_spend == 750
    assert "theirs" not in response.content.decode()
    for query, field in (
        ("days=0", "days"),
        ("days=91", "days"),
        ("days=soon", "days"),
        (f"campaign={theirs.pk}", "campaign"),
        ("campaign=x", "campaign"),
    ):
        response = client.get(f"/fleet/efficiency/?{query}")
        assert response.status_code == 400, query
        assert list(response.context["form"].errors) == [field], query
    assert client.get("/fleet/efficiency/teams/").status_code == 403
    client.force_login(factories.member(tenant=other))
    response = client.get("/fleet/efficiency/?days=90")
    assert response.context["total"].allocations == 0
    assert "Vision" not in response.content.decode()


def test_the_staff_ranking_is_for_staff(recent, client):
    client.force_login(factories.admin_user(username="ops"))
    response = client.get("/fleet/efficiency/teams/?days=2")
    assert response.status_code == 200
    assert [(t.name, totals.idle_spend) for t, totals in response.context["ranking"]] == [
        ("Vision", 750)
    ]
    assert client.get("/fleet/efficiency/teams/?days=-1").status_code == 400
