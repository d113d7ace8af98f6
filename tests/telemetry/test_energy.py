"""Energy: the counter's rises per GPU-minute, kWh per allocation equal to the integral of the
simulated power, the energy price settled exactly, resets, power caps set and checked, and
kWh on the spend page, its CSV, the allocations API and /metrics."""

from __future__ import annotations

import csv
import io
from datetime import UTC, datetime, timedelta

import pytest
from django.test import Client
from django.utils import timezone

from audit.models import AuditEvent
from market.models import Allocation
from market.services.policy import policy_active
from market.services.settlement import allocations_energy_settle
from market.services.tiers import tier_update
from telemetry.agent.loop import AgentLoop
from telemetry.agent.signal_executor import SignalExecutor
from telemetry.agent.simulated_backend import SimulatedBackend
from telemetry.agent.transport import Delivered
from telemetry.models import Gpu, SampleMinute
from telemetry.services import node_register, samples_ingest, samples_rollup
from telemetry.services.energy import (
    POWER_CAP_MINUTES,
    allocations_energy_meter,
    gpus_power_cap_check,
)
from tenants.ledger import MILLI, balance_get, ledger_verify
from tenants.models import Transfer
from tests import factories
from tests.telemetry.batches import INGEST_URL, batch, gpu_uuid
from tests.telemetry.market_data import allocation_make

INTERVAL = 5.0  # seconds between simulated samples


class Clocks:
    """The simulated node's monotonic and wall clocks, moved together."""

    def __init__(self, start: datetime) -> None:
        self.wall = start
        self.mono = 1000.0

    def advance(self, seconds: float) -> None:
        self.wall += timedelta(seconds=seconds)
        self.mono += seconds


def wire(backend: SimulatedBackend, samples, *, now: datetime) -> dict:
    return {
        "batch_id": __import__("uuid").uuid4().hex,
        "sent_at": now.isoformat(),
        "backend": "simulated",
        "agent_version": "test",
        "hostname": "n1",
        "gpus": [g.to_wire() for g in backend.gpus()],
        "samples": [s.to_wire() for s in samples],
        "directive_results": [],
    }


def trapezoid(readings: list[tuple[datetime, float]], start: datetime, end: datetime) -> float:
    """Joules: the power readings integrated over [start, end), linear between readings."""
    total = 0.0
    for (t0, p0), (t1, p1) in zip(readings, readings[1:], strict=False):
        lo, hi = max(t0, start), min(t1, end)
        if hi <= lo:
            continue
        span = (t1 - t0).total_seconds()

        def power(t, t0=t0, p0=p0, p1=p1, span=span):
            return p0 + (p1 - p0) * (t - t0).total_seconds() / span

        total += (power(lo) + power(hi)) / 2 * (hi - lo).total_seconds()
    return total


@pytest.fixture
def empty_proc(tmp_path):
    proc = tmp_path / "proc"
    proc.mkdir()
    return proc


def test_kwh_per_allocation_equals_the_integral_of_the_simulated_power(tier, empty_proc):
    tier_update(tier=tier, actor=None, energy_price=250 * MILLI)  # 250 credits per kWh
    node, _ = node_register(name="n1", tier=tier, actor="test")
    team = factories.tenant(name="Vision", credits=1_000 * MILLI)
    policy_active()
    start = (timezone.now() - timedelta(hours=1)).replace(second=0, microsecond=0)
    end = start + timedelta(minutes=20)
    # Readings start two minutes before the window and run two minutes past it, off the
    # minute by 2.5 s, so the window's edges fall between readings.
    clocks = Clocks(start - timedelta(minutes=2) + timedelta(seconds=2.5))
    backend = SimulatedBackend(
        "n1", gpus=2, clock=lambda: clocks.mono, wall=lambda: clocks.wall, proc=empty_proc
    )
    # The power moves: the idle 60 W, then caps below it, changed every minute per GPU.
    caps = [None, 20, 45, 30, None, 10, 55, 25]
    readings: dict[str, list[tuple[datetime, float]]] = {g.uuid: [] for g in backend.gpus()}
    minute = 0
    while clocks.wall < end + timedelta(minutes=2):
        pending = []
        for _ in range(int(60 / INTERVAL)):
            for gpu in backend.gpus():
                backend.power_cap_set(gpu.index, caps[(minute + 3 * gpu.index) % len(caps)])
            for sample in backend.sample():
                readings[sample.gpu].append((sample.at, sample.power_w))
                pending.append(sample)
            clocks.advance(INTERVAL)
        minute += 1
        samples_ingest(node=node, payload=wire(backend, pending, now=clocks.wall), now=clocks.wall)
    allocation = allocation_make(tenant=team, tier=tier, gpus=2, starts_at=start, ends_at=end)
    allocation.placement = [
        {"node": "n1", "index": g.index, "uuid": g.uuid} for g in backend.gpus()
    ]
    allocation.save(update_fields=["placement"])

    samples_rollup(now=end + timedelta(minutes=3))
    # Not metered while its agents' last batches may still come in.
    assert allocations_energy_meter(now=end + timedelta(minutes=1)) == []
    assert allocations_energy_meter(now=end + timedelta(minutes=10)) == [allocation]

    allocation.refresh_from_db()
    expected = sum(trapezoid(r, start, end) for r in readings.values())
    # The tolerance (docs/capacity.md "Energy"): per GPU, at most one sampling interval at
    # full power between the window's edges and the readings next to them, plus the
    # rounding of the reported power to 0.1 W and of the total down to a whole joule.
    tolerance = 2 * (INTERVAL * 60.0 + 0.05 * 20 * 60) + 1
    assert expected > 50_000  # the power really moved: 60 W idle would be 144,000 J
    assert abs(allocation.energy_j - expected) <= tolerance, (allocation.energy_j, expected)
    assert allocation.energy_charge == allocation.energy_j * 250 * MILLI // 3_600_000
    assert allocation.energy_charge > 0
    assert balance_get(tenant=team).available == 1_000 * MILLI - allocation.energy_charge
    assert ledger_verify() == []
    # Metered once: another pass charges nothing again.
    assert allocations_energy_meter(now=end + timedelta(minutes=20)) == []


def test_energy_price_settles_exactly_and_once(tier):
    tier_update(tier=tier, actor=None, energy_price=1_500)  # 1.5 credits per kWh
    team = factories.tenant(name="Vision", credits=100 * MILLI)
    policy_active()
    start = timezone.now() - timedelta(hours=2)
    two_kwh = allocation_make(
        tenant=team, tier=tier, starts_at=start, ends_at=start + timedelta(hours=1)
    )
    odd = allocation_make(
        tenant=factories.tenant(name="Audio", credits=100 * MILLI),
        tier=tier,
        starts_at=start,
        ends_at=start + timedelta(hours=1),
    )
    before = balance_get(tenant=team)

    allocations_energy_settle(metered={two_kwh.pk: 7_200_000, odd.pk: 1_000_001})

    two_kwh.refresh_from_db()
    odd.refresh_from_db()
    assert (two_kwh.energy_j, two_kwh.energy_charge) == (7_200_000, 3_000)  # 2 kWh x 1.5
    # 1,000,001 J = 0.27777... kWh: 416.667 milli-credits, rounded down.
    assert (odd.energy_j, odd.energy_charge) == (1_000_001, 416)
    after = balance_get(tenant=team)
    assert (after.available, after.escrow) == (before.available - 3_000, before.escrow)
    charge = Transfer.objects.get(
        tenant=team, kind=Transfer.Kind.CHARGE, reference=f"allocation:{two_kwh.pk}"
    )
    assert charge.amount == 3_000
    assert "2.000 kWh" in charge.reason and "energy" in charge.reason
    event = AuditEvent.objects.get(action="allocation.energy", object_id=str(two_kwh.pk))
    assert event.after["energy_charge"] == 3_000 and event.after["unpaid"] == 0

    # Again (a retried task): nothing moves twice.
    allocations_energy_settle(metered={two_kwh.pk: 9_999_999})
    assert balance_get(tenant=team) == after
    two_kwh.refresh_from_db()
    assert two_kwh.energy_j == 7_200_000
    assert ledger_verify() == []


def test_an_energy_charge_never_takes_more_than_the_team_has(tier):
    tier_update(tier=tier, actor=None, energy_price=1_000 * MILLI)
    team = factories.tenant(name="Vision", credits=2 * MILLI)
    policy_active()
    start = timezone.now() - timedelta(hours=2)
    allocation = allocation_make(
        tenant=team, tier=tier, starts_at=start, ends_at=start + timedelta(hours=1)
    )

    allocations_energy_settle(metered={allocation.pk: 3_600_000})  # 1 kWh: 1,000 credits due

    allocation.refresh_from_db()
    assert allocation.energy_charge == 2 * MILLI
    assert balance_get(tenant=team).available == 0
    event = AuditEvent.objects.get(action="allocation.energy", object_id=str(allocation.pk))
    assert event.after["unpaid"] == 998 * MILLI
    assert ledger_verify() == []


def test_a_counter_reset_counts_from_the_new_reading_never_negative(node_token, tier):
    node, _ = node_token
    at = timezone.now().replace(second=30, microsecond=0) - timedelta(minutes=5)
    body = batch(gpus=1, ticks=6, at=at)
    # 1000, 2000, 3000, then a reset to 50, then 1050, 2050 J.
    for sample, energy in zip(
        body["samples"], (1000.0, 2000.0, 3000.0, 50.0, 1050.0, 2050.0), strict=True
    ):
        sample["energy_j"] = energy
    samples_ingest(node=node, payload=body)
    later = batch(gpus=1, ticks=1, at=at + timedelta(seconds=1))
    later["samples"][0]["energy_j"] = 0.0  # another reset
    samples_ingest(node=node, payload=later)

    samples_rollup()

    minute = SampleMinute.objects.get()
    # The first reading has nothing before it; then +1000, +1000, reset (0), +1000, +1000,
    # reset (0).
    assert minute.energy_j == 4000.0
    assert minute.energy_j_last == 3000.0


def test_a_minute_counts_from_the_sample_before_it(node_token, tier):
    node, _ = node_token
    at = timezone.now().replace(second=0, microsecond=0) - timedelta(minutes=5)
    first = batch(gpus=1, ticks=1, at=at - timedelta(seconds=2))
    first["samples"][0]["energy_j"] = 10_000.0
    samples_ingest(node=node, payload=first)
    samples_rollup()
    second = batch(gpus=1, ticks=2, at=at + timedelta(seconds=4))
    second["samples"][0]["energy_j"] = 10_600.0
    second["samples"][1]["energy_j"] = 10_900.0
    samples_ingest(node=node, payload=second)

    samples_rollup()

    used = dict(SampleMinute.objects.values_list("minute", "energy_j"))
    assert used == {at - timedelta(minutes=1): 0.0, at: 900.0}


@pytest.mark.parametrize(
    ("change", "field", "words"),
    [
        (lambda b: b["samples"][0].update(energy_j=-0.5), "samples[0].energy_j", "joules"),
        (lambda b: b["samples"][0].update(power_w=50_000.0), "samples[0].power_w", "watts"),
        (lambda b: b["samples"].append(dict(b["samples"][0])), "samples[2].at", "twice"),
        (lambda b: b["gpus"].append(dict(b["gpus"][0])), "gpus[2].uuid", "twice"),
    ],
    ids=["negative energy", "absurd power", "same GPU twice at one time", "GPU listed twice"],
)
def test_ingest_refuses_bad_energy_readings_by_field(node_token, change, field, words):
    node, token = node_token
    body = batch(gpus=2)
    change(body)
    response = Client().post(
        INGEST_URL, body, content_type="application/json", HTTP_AUTHORIZATION=f"Bearer {token}"
    )
    assert response.status_code == 400
    errors = response.json()["errors"]
    assert field in errors and words in " ".join(errors[field]), errors
    assert not SampleMinute.objects.exists()
    from telemetry.models import Sample

    assert not Sample.objects.exists()


def test_simulated_backend_records_and_applies_a_power_cap(empty_proc):
    backend = SimulatedBackend("n1", gpus=2, proc=empty_proc, idle_power_w=60.0)
    assert {s.power_w for s in backend.sample()} == {60.0}

    backend.power_cap_set(1, 45)

    assert backend.power_caps == {1: 45}
    assert [s.power_w for s in backend.sample()] == [60.0, 45.0]
    backend.power_cap_set(1, None)
    assert backend.power_caps == {}
    assert [s.power_w for s in backend.sample()] == [60.0, 60.0]
    with pytest.raises(ValueError, match="no simulated GPU 5"):
        backend.power_cap_set(5, 100)


class _Answers:
    """An ingest client that answers every post with the given power caps."""

    url = "http://test"

    def __init__(self, caps):
        self.caps = caps
        self.posts = 0

    def post(self, payload):
        self.posts += 1
        return Delivered(
            stored=len(payload["samples"]), duplicate=False, directives=(), power_caps=self.caps
        )

    def close(self):
        pass


def test_the_agent_sets_the_power_caps_the_server_answers(empty_proc):
    backend = SimulatedBackend("n1", gpus=2, proc=empty_proc)
    calls = []
    original = backend.power_cap_set

    def spy(index, watts):
        calls.append((index, watts))
        original(index, watts)

    backend.power_cap_set = spy
    answers = _Answers({"GPU-SIM-n1-0": 300, "GPU-SIM-n1-1": None, "GPU-ELSEWHERE": 100})
    loop = AgentLoop(backend=backend, executor=SignalExecutor(), client=answers, hostname="n1")
    loop.tick()
    assert backend.power_caps == {0: 300}
    assert calls == [(0, 300), (1, None)]
    loop.tick()  # unchanged caps are not set again
    assert calls == [(0, 300), (1, None)]
    answers.caps = {"GPU-SIM-n1-0": None}
    loop.tick()
    assert backend.power_caps == {}


def test_ingest_answers_each_gpu_its_tiers_power_cap(node_token, tier):
    _, token = node_token
    tier_update(tier=tier, actor=None, power_cap_w=300)
    response = Client().post(
        INGEST_URL,
        batch(gpus=2),
        content_type="application/json",
        HTTP_AUTHORIZATION=f"Bearer {token}",
    )
    assert response.status_code == 200
    assert response.json()["power_caps"] == {gpu_uuid("n1", 0): 300, gpu_uuid("n1", 1): 300}
    tier_update(tier=tier, actor=None, power_cap_w=None)
    response = Client().post(
        INGEST_URL,
        batch(gpus=2),
        content_type="application/json",
        HTTP_AUTHORIZATION=f"Bearer {token}",
    )
    assert response.json()["power_caps"] == {gpu_uuid("n1", 0): None, gpu_uuid("n1", 1): None}


def test_a_gpu_above_its_tiers_power_cap_for_minutes_is_a_finding(node_token, tier):
    node, _ = node_token
    now = timezone.now().replace(second=30, microsecond=0)
    samples_ingest(node=node, payload=batch(gpus=2, at=now))
    tier_update(tier=tier, actor=None, power_cap_w=200)
    over, within = Gpu.objects.order_by("index")

    def minutes(gpu, watts, count=POWER_CAP_MINUTES):
        for m in range(1, count + 1):
            SampleMinute.objects.update_or_create(
                gpu=gpu,
                minute=now.replace(second=0) - timedelta(minutes=m),
                defaults=dict(
                    samples=12,
                    utilization_avg=90,
                    utilization_max=90,
                    memory_used_avg=1,
                    memory_used_max=1,
                    power_avg=watts,
                    power_max=watts,
                    temperature_max=60,
                    energy_j_last=0,
                ),
            )

    minutes(over, 260.0)
    minutes(within, 205.0)  # within the tolerance

    assert gpus_power_cap_check(now=now) == [over]
    assert gpus_power_cap_check(now=now) == []  # a finding is made once
    over.refresh_from_db()
    assert over.over_power_cap and over.over_power_cap_since is not None
    assert (
        AuditEvent.objects.filter(action="gpu.power_over_cap", object_id=str(over.pk)).count() == 1
    )
    staff = Client()
    staff.force_login(factories.admin_user())
    assert "above its tier's power cap since" in staff.get("/fleet/").content.decode()
    body = _metrics()
    assert 'gpumarket_gpus_over_power_cap{tier="a100"} 1' in body
    assert 'gpumarket_tier_power_cap_watts{tier="a100"} 200' in body

    minutes(over, 150.0, count=1)
    gpus_power_cap_check(now=now)
    over.refresh_from_db()
    assert not over.over_power_cap
    assert AuditEvent.objects.filter(action="gpu.power_within_cap").count() == 1


def _metrics() -> str:
    from django.conf import settings

    return (
        Client()
        .get("/metrics", HTTP_AUTHORIZATION=f"Bearer {settings.GPUMARKET_METRICS_TOKEN}")
        .content.decode()
    )


def test_kwh_on_the_spend_page_csv_api_and_metrics(tier):
    tier_update(tier=tier, actor=None, energy_price=2 * MILLI)
    team = factories.tenant(name="Vision", credits=100 * MILLI)
    other = factories.tenant(name="Audio", credits=100 * MILLI)
    user = factories.member(tenant=team)
    policy_active()
    start = datetime.now(UTC).replace(minute=0, second=0, microsecond=0) - timedelta(hours=1)
    mine = allocation_make(
        tenant=team, tier=tier, gpus=2, starts_at=start, ends_at=start + timedelta(minutes=30)
    )
    theirs = allocation_make(
        tenant=other, tier=tier, starts_at=start, ends_at=start + timedelta(minutes=30)
    )
    allocations_energy_settle(metered={mine.pk: 5_400_000, theirs.pk: 3_600_000})
    client = Client()
    client.force_login(user)

    page = client.get("/market/spend/").content.decode()
    assert "1.500" in page and "3.000" in page  # 1.5 kWh, 3 credits
    assert f"<td>{theirs.pk}</td>" not in page

    response = client.get("/market/spend/energy.csv")
    assert response["Content-Type"].startswith("text/csv")
    rows = list(csv.DictReader(io.StringIO(response.content.decode())))
    assert [
        (r["allocation"], r["tier"], r["energy_kwh"], r["energy_charge_credits"]) for r in rows
    ] == [(str(mine.pk), "a100", "1.500000", "3.000")]

    api = client.get(f"/api/v1/allocations/{mine.pk}")
    if api.status_code == 301:
        api = client.get(f"/api/v1/allocations/{mine.pk}/")
    assert api.status_code == 200, api.content
    assert api.json()["energy_kwh"] == "1.500000"
    assert api.json()["energy_charge"] == "3.000"

    body = _metrics()
    assert 'gpumarket_energy_kwh_total{tier="a100"} 2.5' in body
    assert 'gpumarket_energy_charge_millicredits_total{tier="a100"} 5000' in body
    assert 'gpumarket_tier_energy_price_millicredits{tier="a100"} 2000' in body
    assert "Vision" not in body


def test_unmetered_allocations_show_no_kwh(tier):
    team = factories.tenant(name="Vision", credits=100 * MILLI)
    policy_active()
    start = timezone.now() - timedelta(hours=2)
    allocation = allocation_make(
        tenant=team, tier=tier, starts_at=start, ends_at=start + timedelta(hours=1)
    )
    # Not placed on GPUs: nothing to meter, and the meter leaves it alone.
    assert allocations_energy_meter() == []
    allocation.refresh_from_db()
    assert allocation.energy_j is None and allocation.energy_charge == 0
    assert Allocation.objects.filter(energy_j__isnull=False).count() == 0


def test_a_reclaimed_gpu_meters_its_energy_to_its_allocation_only_until_reclaimed(tier):
    from market.models import Reclaim

    team = factories.tenant(name="Vision", credits=100 * MILLI)
    node, _ = node_register(name="n1", tier=tier, actor="test")
    policy_active()
    start = (timezone.now() - timedelta(hours=2)).replace(minute=0, second=0, microsecond=0)
    end = start + timedelta(minutes=10)
    samples_ingest(
        node=node, payload=batch(gpus=2, at=timezone.now()), now=timezone.now()
    )  # discovers the GPUs
    gpus = list(Gpu.objects.order_by("index"))
    for gpu in gpus:
        for m in range(10):
            SampleMinute.objects.create(
                gpu=gpu,
                minute=start + timedelta(minutes=m),
                samples=12,
                utilization_avg=0,
                utilization_max=0,
                memory_used_avg=0,
                memory_used_max=0,
                power_avg=100,
                power_max=100,
                temperature_max=40,
                energy_j_last=0,
                energy_j=6_000.0,  # 100 W for a minute
            )
    allocation = allocation_make(tenant=team, tier=tier, gpus=2, starts_at=start, ends_at=end)
    allocation.placement = [{"node": "n1", "index": g.index, "uuid": g.uuid} for g in gpus]
    allocation.save(update_fields=["placement"])
    Reclaim.objects.create(
        allocation=allocation,
        tenant=team,
        tier=tier,
        gpu_uuid=gpus[1].uuid,
        node="n1",
        gpu_index=1,
        status=Reclaim.Status.RECLAIMED,
        idle_since=start,
        noticed_at=start + timedelta(minutes=2),
        reclaim_after=start + timedelta(minutes=4),
        reclaimed_at=start + timedelta(minutes=4),
    )

    allocations_energy_meter(now=end + timedelta(minutes=10))

    allocation.refresh_from_db()
    # GPU 0 for the whole 10 minutes, GPU 1 for the 4 minutes before it was reclaimed.
    assert allocation.energy_j == 6_000 * (10 + 4)
