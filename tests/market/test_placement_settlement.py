"""Placement at settlement (issue 11): every allocation of a tier whose GPUs the nodes report is
bound to concrete GPUs in the transaction that settles it. The fleet is written as the ingest
service leaves it (nodes, GPUs with their NVLink domains); the round goes through the real
clearing and settlement."""

from __future__ import annotations

from collections import Counter
from datetime import timedelta

import pytest

from market.models import Allocation, Bid
from market.services.bids import bid_place
from market.services.placement import tier_fragmentation
from market.services.round_clearing import round_clear
from market.services.rounds import round_open_next
from market.services.settlement import round_settle
from telemetry.models import Gpu, Node
from telemetry.services.nodes import tier_capacity_refresh
from tenants.ledger import balance_get
from tests.market.marketkit import market_make
from tests.telemetry.market_data import allocation_make, fleet_node

pytestmark = pytest.mark.django_db


def _fleet(tier, *, nodes=2, gpus=4, islands=2) -> None:
    """``nodes`` nodes of ``gpus`` GPUs each, every node split into ``islands`` NVLink domains."""
    for n in range(nodes):
        fleet_node(name=f"n{n}", tier=tier, gpus=gpus, islands=islands)


@pytest.fixture
def market(db):
    market = market_make()
    _fleet(market.a100)
    return market


def _bid(team, market, rnd=None, **terms):
    tenant, user = team
    rnd = rnd or market.round
    return bid_place(user=user, tenant=tenant, round=rnd, now=rnd.opens_at, **terms)


def _settle(market, rnd=None):
    rnd = rnd or market.round
    round_clear(round_id=rnd.pk, now=rnd.closes_at + timedelta(seconds=1))
    return round_settle(round_id=rnd.pk, now=rnd.closes_at + timedelta(seconds=2))


def _gpus(allocation) -> list[tuple[str, int]]:
    return [(g["node"], g["index"]) for g in allocation.placement]


def test_a_gang_lands_on_one_node_and_a_pair_inside_one_nvlink_domain(market, team, rival):
    gang = _bid(team, market, quantity=4, min_quantity=4, limits={"a100": 5000})
    pair = _bid(rival, market, quantity=2, min_quantity=2, limits={"a100": 5000})
    _settle(market)

    big = Allocation.objects.get(bid=gang)
    small = Allocation.objects.get(bid=pair)
    assert big.gpus == 4 and len(big.placement) == 4
    assert len({g["node"] for g in big.placement}) == 1
    assert small.gpus == 2 and len(small.placement) == 2
    domains = {Gpu.objects.get(uuid=g["uuid"]).nvlink_domain for g in small.placement}
    assert len({g["node"] for g in small.placement}) == 1 and len(domains) == 1
    # Best fit: the pair does not break into the node the gang left whole.
    assert {g["node"] for g in small.placement} != {g["node"] for g in big.placement}


def test_no_gpu_is_placed_twice_and_every_allocation_gets_exactly_its_count(market, team, rival):
    _bid(team, market, quantity=3, limits={"a100": 5000})
    _bid(rival, market, quantity=5, limits={"a100": 4000})
    _settle(market)

    allocations = list(Allocation.objects.filter(round=market.round))
    assert sum(a.gpus for a in allocations) == 8
    uuids = Counter(g["uuid"] for a in allocations for g in a.placement)
    assert len(uuids) == 8 and set(uuids.values()) == {1}
    for allocation in allocations:
        assert len(allocation.placement) == allocation.gpus
    # A divisible bid of 5 on nodes of 4 is split in the fewest pieces: two.
    five = next(a for a in allocations if a.gpus == 5)
    assert len({g["node"] for g in five.placement}) == 2


def test_gpus_in_maintenance_or_on_an_unhealthy_node_are_never_placed(market, team):
    Gpu.objects.filter(uuid="GPU-n0-1").update(maintenance=True)
    Node.objects.filter(name="n1").update(healthy=False)
    tier_capacity_refresh(tiers=[market.a100])
    _bid(team, market, quantity=3, limits={"a100": 5000})
    _settle(market)

    allocation = Allocation.objects.get(round=market.round)
    assert allocation.gpus == 3
    assert sorted(_gpus(allocation)) == [("n0", 0), ("n0", 2), ("n0", 3)]


def test_a_gang_no_node_can_hold_is_cleared_out_and_charged_nothing(market, team, rival):
    tenant, _ = team
    before = balance_get(tenant=tenant)
    gang = _bid(team, market, quantity=6, min_quantity=6, limits={"a100": 9000})
    other = _bid(rival, market, quantity=2, limits={"a100": 2000})
    rnd = _settle(market)

    gang.refresh_from_db()
    assert gang.status == Bid.Status.LOST
    assert (
        "must run together" in gang.outcome_reason and "nothing was charged" in gang.outcome_reason
    )
    assert not Allocation.objects.filter(bid=gang).exists()
    assert balance_get(tenant=tenant) == before
    assert str(gang.pk) in rnd.diagnostics["left_out_by_placement"]
    # The round was cleared again without it: the divisible bid still wins, placed.
    won = Allocation.objects.get(bid=other)
    assert won.gpus == 2 and len(won.placement) == 2


def test_an_allocation_renewed_by_the_same_team_keeps_its_gpus(market, team, rival):
    _bid(rival, market, quantity=1, limits={"a100": 5000})
    _bid(team, market, quantity=2, min_quantity=2, limits={"a100": 5000})
    _settle(market)
    first = Allocation.objects.get(round=market.round, tenant=team[0])

    nxt = round_open_next(now=market.round.closes_at + timedelta(seconds=3))
    assert nxt.starts_at == market.round.ends_at
    # A new team's larger gang bids first this time; the renewal still keeps its GPUs.
    _bid(rival, market, rnd=nxt, quantity=4, min_quantity=4, limits={"a100": 5000})
    _bid(team, market, rnd=nxt, quantity=2, min_quantity=2, limits={"a100": 5000})
    _settle(market, nxt)
    second = Allocation.objects.get(round=nxt, tenant=team[0])
    assert second.placement == first.placement


def test_gpus_held_by_an_overlapping_allocation_are_not_placed_again(market, team, rival):
    held = allocation_make(
        tenant=rival[0],
        tier=market.a100,
        gpus=4,
        starts_at=market.round.starts_at - timedelta(minutes=30),
        ends_at=market.round.starts_at + timedelta(minutes=30),
    )
    held.placement = [{"node": "n0", "index": i, "uuid": f"GPU-n0-{i}"} for i in range(4)]
    held.save()
    _bid(team, market, quantity=4, min_quantity=4, limits={"a100": 5000})
    _settle(market)

    allocation = Allocation.objects.get(round=market.round)
    assert {g["node"] for g in allocation.placement} == {"n1"}


def test_fragmentation_is_the_largest_gang_that_could_still_be_placed(market, team, rival):
    at = market.round.starts_at + timedelta(minutes=1)
    assert tier_fragmentation("a100", at=at) == (8, 4, 2)
    _bid(team, market, quantity=1, limits={"a100": 5000})
    _bid(rival, market, quantity=1, limits={"a100": 5000})
    _settle(market)
    # Two single GPUs go to the same NVLink domain of one node (best fit), so a whole node
    # of four is still free.
    assert tier_fragmentation("a100", at=at) == (6, 4, 2)
    assert tier_fragmentation("a100", at=market.round.ends_at + timedelta(minutes=1)) == (8, 4, 2)


def test_a_tier_no_node_reports_is_settled_without_placement(market, team):
    _bid(team, market, quantity=1, limits={"h100": 5000})
    _settle(market)
    allocation = Allocation.objects.get(round=market.round)
    assert allocation.tier.slug == "h100" and allocation.placement == []


@pytest.mark.parametrize("enabled", [True, False])
def test_settlement_queues_the_slurm_reservations_of_what_it_placed(
    market, team, settings, sent_tasks, django_capture_on_commit_callbacks, enabled
):
    settings.GPUMARKET_SLURM_RESERVATIONS = enabled
    _bid(team, market, quantity=2, limits={"a100": 5000})
    _bid(team, market, quantity=1, limits={"h100": 5000})  # a tier no node reports
    with django_capture_on_commit_callbacks(execute=True):
        _settle(market)
    placed = list(
        Allocation.objects.filter(round=market.round, tier__slug="a100").values_list(
            "pk", flat=True
        )
    )
    assert sent_tasks.of("market.slurm_reservations_create") == ([[placed]] if enabled else [])


def test_voiding_a_round_queues_the_end_of_its_slurm_reservations(
    market, team, settings, sent_tasks, django_capture_on_commit_callbacks
):
    from market.services.void import round_void

    settings.GPUMARKET_SLURM_RESERVATIONS = True
    _bid(team, market, quantity=2, limits={"a100": 5000})
    rnd = _settle(market)
    with django_capture_on_commit_callbacks(execute=True):
        round_void(round=rnd, actor=market.admin, reason="test: wrong capacity")
    pk = Allocation.objects.get(round=rnd).pk
    assert sent_tasks.of("market.slurm_reservations_end") == [[[pk]]]
