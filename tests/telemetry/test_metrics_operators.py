"""/metrics for operators: per-GPU, per-team and market series (telemetry/operator_metrics.py)."""

from __future__ import annotations

import re
from datetime import timedelta

import pytest
from django.utils import timezone

import audit.services as audit
from market.models import Allocation, Bid, Round
from telemetry.models import Gpu, ProcessObservation, Sample
from tenants.ledger import credits_charge, credits_hold, credits_refund
from tests import factories
from tests.telemetry.market_data import allocation_make

pytestmark = pytest.mark.django_db


@pytest.fixture
def scrape(client, settings):
    client.defaults["HTTP_AUTHORIZATION"] = f"Bearer {settings.GPUMARKET_METRICS_TOKEN}"

    def get() -> str:
        response = client.get("/metrics")
        assert response.status_code == 200
        return response.content.decode()

    return get


def _value(body: str, name: str, **labels: object) -> float:
    """The sample of ``name`` whose labels include ``labels`` (exactly one must match)."""
    found = []
    for line in body.splitlines():
        match = re.match(rf"^{name}(?:{{(.*)}})? (\S+)$", line)
        if not match:
            continue
        have = dict(re.findall(r'(\w+)="((?:[^"\\]|\\.)*)"', match.group(1) or ""))
        if all(have.get(k) == str(v) for k, v in labels.items()):
            found.append(match.group(2))
    assert len(found) == 1, f"{name} {labels}: {found} in:\n{body}"
    return float(found[0])


def _absent(body: str, name: str, **labels: object) -> bool:
    try:
        _value(body, name, **labels)
    except AssertionError:
        return True
    return False


def _gpu(node, tier, index: int) -> Gpu:
    return Gpu.objects.create(
        node=node, uuid=f"GPU-{index}", index=index, name="A100", tier=tier, memory_total_mib=81920
    )


def _sample(gpu: Gpu, *, at, util: float) -> None:
    Sample.objects.create(
        gpu=gpu,
        at=at,
        utilization_pct=util,
        memory_used_mib=1024,
        memory_total_mib=81920,
        power_w=312.5,
        temperature_c=61,
        energy_j=1.0,
    )


def test_large_values_keep_every_digit(scrape):
    """A balance of 1,234,567 milli-credits was written as 1.23457e+06 (six digits)."""
    factories.tenant(name="Vision", credits=1_234_567)
    body = scrape()
    assert re.search(
        r'^gpumarket_ledger_balance_millicredits\{kind="available"\} 1234567$', body, re.M
    )
    assert _value(body, "gpumarket_team_available_millicredits", team="vision") == 1_234_567
    # No round was settled: no timestamp series, rather than a zero that reads as 1970.
    assert _absent(body, "gpumarket_round_last_settled_timestamp_seconds")


def test_per_gpu_readings_health_and_staleness(scrape, tier, node):
    node.healthy = True
    node.save(update_fields=["healthy"])
    fresh, stale, down = _gpu(node, tier, 0), _gpu(node, tier, 1), _gpu(node, tier, 2)
    now = timezone.now()
    _sample(fresh, at=now - timedelta(seconds=60), util=10)
    _sample(fresh, at=now - timedelta(seconds=5), util=87.5)
    _sample(stale, at=now - timedelta(hours=1), util=99)
    down.maintenance = True
    down.failure = "XID 79: fallen off the bus"
    down.save(update_fields=["maintenance", "failure"])
    body = scrape()
    key = {"node": "n1", "gpu": 0, "uuid": "GPU-0", "tier": "a100"}
    assert _value(body, "gpumarket_gpu_utilization_percent", **key) == 87.5
    assert _value(body, "gpumarket_gpu_memory_used_bytes", **key) == 1024 * 1024 * 1024
    assert _value(body, "gpumarket_gpu_memory_total_bytes", **key) == 81920 * 1024 * 1024
    assert _value(body, "gpumarket_gpu_power_watts", **key) == 312.5
    assert _value(body, "gpumarket_gpu_temperature_celsius", **key) == 61
    assert _value(body, "gpumarket_gpu_healthy", **key) == 1
    # A reading older than the stale limit is not shown as if it were current.
    assert _absent(body, "gpumarket_gpu_utilization_percent", uuid="GPU-1")
    assert _value(body, "gpumarket_gpu_healthy", uuid="GPU-1") == 1
    assert _value(body, "gpumarket_gpu_healthy", uuid="GPU-2") == 0
    assert _value(body, "gpumarket_gpu_maintenance", uuid="GPU-2") == 1
    assert _value(body, "gpumarket_gpu_failed", uuid="GPU-2") == 1
    node.healthy = False
    node.save(update_fields=["healthy"])
    assert _value(scrape(), "gpumarket_gpu_healthy", uuid="GPU-0") == 0


def test_per_team_money_gpus_and_paused_work(scrape, tier, node):
    vision = factories.tenant(name="Secret Vision Team", credits=100_000)
    speech = factories.tenant(name="Speech", credits=50_000)
    now = timezone.now()
    running = allocation_make(
        tenant=vision,
        tier=tier,
        gpus=3,
        starts_at=now - timedelta(minutes=30),
        ends_at=now + timedelta(minutes=30),
    )
    allocation_make(
        tenant=vision,
        tier=tier,
        gpus=2,
        starts_at=now - timedelta(minutes=20),
        ends_at=now + timedelta(minutes=40),
        status=Allocation.Status.PAUSED,
    )
    credits_hold(tenant=vision, amount=10_000, reference="bid:1")
    credits_charge(tenant=vision, amount=3_000, reference="bid:1")
    credits_refund(tenant=vision, amount=500, reference=f"allocation:{running.pk}")
    gpu = _gpu(node, tier, 0)
    ProcessObservation.objects.create(
        node=node,
        gpu=gpu,
        pid=4242,
        memory_mib=10,
        allocation_ref=running.pk,
        state=ProcessObservation.State.STOPPED,
        at=now,
        seen_at=now,
    )
    body = scrape()
    team = vision.slug
    assert _value(body, "gpumarket_team_available_millicredits", team=team) == 90_500
    assert _value(body, "gpumarket_team_escrow_millicredits", team=team) == 7_000
    assert _value(body, "gpumarket_team_spend_24h_millicredits", team=team) == 2_500
    assert _value(body, "gpumarket_team_gpus_allocated", team=team) == 5
    assert _value(body, "gpumarket_team_allocations_paused", team=team) == 1
    assert _value(body, "gpumarket_team_processes_stopped", team=team) == 1
    # Unplaced allocations: their GPU-hours so far are unmeasured, not used.
    assert _value(body, "gpumarket_team_gpu_seconds_allocated_24h", team=team) == pytest.approx(
        (3 * 30 + 2 * 20) * 60, abs=30
    )
    assert _value(body, "gpumarket_team_gpu_seconds_used_24h", team=team) == 0
    assert _value(body, "gpumarket_team_gpu_seconds_unmeasured_24h", team=team) == _value(
        body, "gpumarket_team_gpu_seconds_allocated_24h", team=team
    )
    assert _value(body, "gpumarket_team_gpus_allocated", team=speech.slug) == 0
    assert _value(body, "gpumarket_team_available_millicredits", team=speech.slug) == 50_000
    assert "Secret Vision Team" not in body


def test_market_series_follow_the_last_settled_round(scrape, tier, node):
    team = factories.tenant(name="Vision", credits=100_000)
    now = timezone.now()
    alloc = allocation_make(
        tenant=team,
        tier=tier,
        gpus=2,
        starts_at=now - timedelta(minutes=10),
        ends_at=now + timedelta(minutes=50),
    )
    rnd = alloc.round
    rnd.diagnostics = {"total_seconds": 1.25}
    rnd.cleared_at = now - timedelta(minutes=12, seconds=3)
    rnd.settled_at = now - timedelta(minutes=12)
    rnd.save(update_fields=["diagnostics", "cleared_at", "settled_at"])
    Bid.objects.filter(pk=alloc.bid_id).update(quantity=5)
    Bid.objects.create(
        tenant=team, author=alloc.bid.author, round=rnd, quantity=4, status=Bid.Status.LOST
    )
    Round.objects.create(
        policy=rnd.policy,
        status=Round.Status.CLOSED,
        opens_at=now - timedelta(hours=1),
        closes_at=now - timedelta(seconds=300),
        starts_at=now + timedelta(hours=2),
        ends_at=now + timedelta(hours=3),
    )
    audit.record(actor="guardrail", action="policy.rollback", object_type="x", object_id=1)
    audit.record(actor="guardrail", action="policy.guardrail_breach", object_type="x", object_id=2)
    audit.record(actor="guardrail", action="policy.guardrail_breach", object_type="x", object_id=3)
    body = scrape()
    assert _value(body, "gpumarket_round_clear_seconds") == 1.25
    assert _value(body, "gpumarket_round_settle_seconds") == pytest.approx(3)
    assert _value(body, "gpumarket_round_last_settled_timestamp_seconds") == pytest.approx(
        rnd.settled_at.timestamp(), abs=0.001
    )
    assert _value(body, "gpumarket_round_unmet_demand_gpus") == 5 + 4 - 2
    assert 299 <= _value(body, "gpumarket_round_overdue_seconds") < 400
    assert _value(body, "gpumarket_tier_reserve_millicredits", tier="a100") >= 0
    assert _value(body, "gpumarket_guardrail_trips_total", outcome="rolled_back") == 1
    assert _value(body, "gpumarket_guardrail_trips_total", outcome="not_rolled_back") == 2


def test_series_do_not_grow_with_bids_allocations_or_samples(scrape, tier, node):
    team = factories.tenant(name="Vision", credits=100_000)
    gpu = _gpu(node, tier, 0)
    now = timezone.now()
    _sample(gpu, at=now, util=50)
    allocation_make(
        tenant=team, tier=tier, gpus=1, starts_at=now - timedelta(minutes=5), ends_at=now
    )
    before = len(scrape().splitlines())
    for i in range(20):
        alloc = allocation_make(
            tenant=team,
            tier=tier,
            gpus=1,
            starts_at=now - timedelta(hours=i + 1),
            ends_at=now - timedelta(hours=i),
        )
        _sample(gpu, at=now - timedelta(seconds=i + 1), util=i)
        assert alloc.pk
    assert len(scrape().splitlines()) == before
