"""Measured supply and node/GPU failures (issue 37): a tier sells the GPUs healthy nodes
report; a failed GPU goes to maintenance; work on it is refunded pro rata and re-placed."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.urls import reverse
from django.utils import timezone

from market.errors import MarketError
from market.models import Allocation, Round, Tier
from market.services.failures import allocations_gpus_failed
from market.services.policy import policy_active
from market.services.tiers import tier_create, tier_update
from telemetry.agent.simulated_backend import SimulatedBackend
from telemetry.models import Gpu, Node
from telemetry.services import nodes_health_check, tier_capacity_refresh
from tenants.ledger import balance_get, ledger_verify
from tenants.models import Notification, Transfer
from tests import factories
from tests.telemetry.batches import batch, gpu_uuid, post
from tests.telemetry.market_data import allocation_make, fleet_node

pytestmark = pytest.mark.django_db


def _placed(allocation: Allocation, node: str, indices: list[int]) -> Allocation:
    allocation.placement = [
        {"node": node, "index": i, "uuid": f"GPU-{node}-{i}"} for i in sorted(indices)
    ]
    allocation.launch_secret = "a" * 64
    allocation.save(update_fields=["placement", "launch_secret"])
    return allocation


def _refunds(allocation: Allocation) -> list[int]:
    return list(
        Transfer.objects.filter(reference=f"allocation:{allocation.pk}", kind="refund")
        .order_by("pk")
        .values_list("amount", flat=True)
    )


# ---------------------------------------------------------------------------------------------
# Supply


def test_a_tier_no_node_reports_sells_nothing(tier):
    """The demo's preemptible tier had 8 GPUs typed in and no node: it sold and charged them."""
    phantom = tier_create(actor=None, slug="preemptible", capacity=8, preemptible=True)
    fleet_node(name="n1", tier=tier, gpus=4)
    tier_capacity_refresh()
    phantom.refresh_from_db()
    assert phantom.capacity == 0 and phantom.offered == 0
    # The periodic health pass measures every tier too, so a typed capacity cannot survive it.
    Tier.objects.filter(pk=phantom.pk).update(capacity=8)
    nodes_health_check()
    phantom.refresh_from_db()
    assert phantom.offered == 0


def test_an_admin_can_lower_the_offer_but_not_raise_the_capacity(tier):
    fleet_node(name="n1", tier=tier, gpus=4)
    tier.refresh_from_db()
    assert tier.capacity == 4
    with pytest.raises(MarketError, match="measured"):
        tier_update(tier=tier, actor=factories.admin_user(), capacity=6)
    tier_update(tier=tier, actor=factories.admin_user(), maintenance_gpus=1)
    tier.refresh_from_db()
    assert tier.capacity == 4 and tier.offered == 3


def test_gpus_held_by_work_of_a_longer_window_leave_the_next_rounds_supply(tier):
    fleet_node(name="n1", tier=tier, gpus=4)
    team = factories.tenant(name="Vision")
    now = timezone.now()
    Round.objects.create(
        policy=policy_active(),
        status=Round.Status.OPEN,
        opens_at=now - timedelta(minutes=5),
        closes_at=now + timedelta(minutes=5),
        starts_at=now + timedelta(minutes=5),
        ends_at=now + timedelta(minutes=15),
    )
    # A six-hour window placed on two GPUs runs through the next round's window.
    long = allocation_make(
        tenant=team,
        tier=tier,
        gpus=2,
        starts_at=now - timedelta(hours=1),
        ends_at=now + timedelta(hours=5),
    )
    _placed(long, "n1", [0, 1])
    assert tier_capacity_refresh(tiers=[tier]) == {tier.slug: 2}


# ---------------------------------------------------------------------------------------------
# Failures


@pytest.fixture
def running(tier):
    """An allocation of 2 GPUs on node n1 whose one-hour window is half over; n2 is idle."""
    fleet_node(name="n1", tier=tier, gpus=4)
    fleet_node(name="n2", tier=tier, gpus=4)
    now = timezone.now()
    Node.objects.update(last_seen_at=now)
    team = factories.tenant(name="Vision", credits=100_000)
    allocation = allocation_make(
        tenant=team,
        tier=tier,
        gpus=2,
        starts_at=now - timedelta(minutes=30),
        ends_at=now + timedelta(minutes=30),
    )
    allocation.charge = 60_000
    allocation.save(update_fields=["charge"])
    return _placed(allocation, "n1", [0, 1])


def test_a_node_killed_mid_window_refunds_the_lost_time_and_replaces_the_work(running):
    now = running.starts_at + timedelta(minutes=30)
    Node.objects.filter(name="n1").update(last_seen_at=now - timedelta(minutes=10))
    before = balance_get(tenant=running.tenant).available
    nodes_health_check(now=now)
    running.refresh_from_db()
    assert running.status == Allocation.Status.ACTIVE
    assert {g["node"] for g in running.placement} == {"n2"} and len(running.placement) == 2
    assert running.launch_secret != "a" * 64  # tokens of the old placement no longer verify
    # Ten of sixty minutes could not run: a sixth of the charge comes back, in one transfer.
    assert _refunds(running) == [10_000]
    assert balance_get(tenant=running.tenant).available == before + 10_000
    assert Notification.objects.filter(tenant=running.tenant, kind="work_moved").exists()
    # A second pass (or a retry) changes nothing.
    nodes_health_check(now=now + timedelta(seconds=5))
    assert _refunds(running) == [10_000]
    assert ledger_verify() == []


def test_a_failure_with_no_free_gpu_refunds_the_rest_of_the_window(running):
    now = running.starts_at + timedelta(minutes=30)
    Node.objects.filter(name="n2").update(last_seen_at=now - timedelta(minutes=20))
    Node.objects.filter(name="n1").update(last_seen_at=now - timedelta(minutes=15))
    nodes_health_check(now=now)
    running.refresh_from_db()
    assert running.status == Allocation.Status.REVOKED
    # From the last sign of life (15 minutes before now) to the end: 45 of 60 minutes.
    assert _refunds(running) == [45_000]
    assert ledger_verify() == []


def test_a_refund_never_exceeds_what_was_charged(running):
    at = running.starts_at - timedelta(hours=3)  # a failure time before the window
    allocations_gpus_failed(
        uuids={"GPU-n1-0"}, failed_at=at, reason="test", actor="test", replace=False
    )
    assert _refunds(running) == [60_000]
    allocations_gpus_failed(
        uuids={"GPU-n1-0"}, failed_at=at, reason="test", actor="test", replace=False
    )
    assert _refunds(running) == [60_000]


def test_an_xid_error_puts_the_gpu_in_maintenance_and_moves_its_work(client, tier):
    node, token = factories_node(tier)
    body = batch(node="n1", gpus=4)
    assert post(client, token, body).status_code == 200
    team = factories.tenant(name="Vision", credits=100_000)
    now = timezone.now()
    allocation = allocation_make(
        tenant=team,
        tier=tier,
        gpus=1,
        starts_at=now - timedelta(minutes=30),
        ends_at=now + timedelta(minutes=30),
    )
    allocation.placement = [{"node": "n1", "index": 1, "uuid": gpu_uuid("n1", 1)}]
    allocation.save(update_fields=["placement"])
    body = batch(node="n1", gpus=4)
    body["samples"][1]["health"] = {"xid": [79], "throttle": ["thermal"]}
    body["samples"][2]["health"] = {"throttle": ["power"], "ecc_aggregate_uncorrected": 2}
    response = post(client, token, body)
    assert response.status_code == 200, response.content
    failed = Gpu.objects.get(uuid=gpu_uuid("n1", 1))
    assert failed.maintenance and "XID 79" in failed.failure and failed.failed_at is not None
    throttled = Gpu.objects.get(uuid=gpu_uuid("n1", 2))
    assert not throttled.maintenance and throttled.throttle_reasons == ["power"]
    assert throttled.ecc_aggregate_uncorrected == 2
    tier.refresh_from_db()
    assert tier.capacity == 3
    allocation.refresh_from_db()
    assert allocation.placement and allocation.placement[0]["uuid"] != gpu_uuid("n1", 1)
    assert ledger_verify() == []


def test_bad_health_fields_are_refused_field_by_field(client, tier):
    _node, token = factories_node(tier)
    body = batch(node="n1", gpus=2)
    body["samples"][0]["health"] = {"xid": ["boom"], "ecc_volatile_uncorrected": -1}
    body["samples"][1]["health"] = "lost"
    response = post(client, token, body)
    assert response.status_code == 200, response.content
    refused = response.json()["refused"]
    assert "samples[0].health.xid" in refused
    assert "samples[0].health.ecc_volatile_uncorrected" in refused
    assert "samples[1].health" in refused
    assert not Gpu.objects.filter(maintenance=True).exists()


def factories_node(tier: Tier) -> tuple[Node, str]:
    from telemetry.services import node_register

    return node_register(name="n1", tier=tier, actor="test")


def test_the_fleet_page_shows_why_a_gpu_failed(client, tier):
    _node, token = factories_node(tier)
    body = batch(node="n1", gpus=2)
    body["samples"][0]["health"] = {"ecc_volatile_uncorrected": 3}
    body["samples"][1]["health"] = {"throttle": ["thermal"]}
    assert post(client, token, body).status_code == 200
    client.force_login(factories.admin_user())
    page = client.get(reverse("fleet")).content.decode()
    assert "failed: 3 uncorrectable ECC error(s)" in page
    assert "throttled: thermal" in page


def test_the_simulated_backend_injects_each_failure_kind(tmp_path):
    backend = SimulatedBackend("sim-faults", gpus=4, faults_path=tmp_path / "faults.json")
    backend.fault_inject(0, "xid")
    backend.fault_inject(1, "ecc")
    backend.fault_inject(2, "thermal")
    backend.fault_inject(2, "power")
    (tmp_path / "faults.json").write_text('{"3": "lost"}')
    first = {s.gpu: s.health for s in backend.sample()}
    gpus = [g.uuid for g in backend.gpus()]
    assert first[gpus[0]].xid == (48,)
    assert first[gpus[1]].ecc_volatile_uncorrected == 1
    assert first[gpus[2]].throttle == ("power", "thermal")
    assert first[gpus[3]].lost
    second = {s.gpu: s.health for s in backend.sample()}
    assert second[gpus[0]].xid == ()  # an XID is an event, reported once
    assert second[gpus[3]].lost  # the rest hold until cleared
    backend.fault_inject(3, "clear")
    assert not {s.gpu: s.health for s in backend.sample()}[gpus[3]].lost
    with pytest.raises(ValueError, match="unknown fault"):
        backend.fault_inject(0, "meteor")
    # What the agent sends is what the server accepts.
    wire = next(s for s in backend.sample() if s.gpu == gpus[2]).to_wire()
    assert wire["health"]["throttle"] == ["power", "thermal"]
