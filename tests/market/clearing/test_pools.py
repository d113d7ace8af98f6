"""maxmin and fisher on a tenant's interchangeable bids pooled (pools.py): the same optimum as
on the bids one by one, a pool's GPUs to its highest offers first, then in id order, gang
bids kept apart."""

from __future__ import annotations

import numpy as np
import pytest

from market.clearing import Bid, Instance, Tenant, Tier, clear
from market.clearing.instance.inputs import instance_arrays
from market.clearing.mechanisms import fisher, pools
from market.clearing.mechanisms.rules import build_market


def _few_large_tenants(seed: int) -> Instance:
    """A few tenants of many bids each, on a few tier sets: most bids share a pool."""
    rng = np.random.default_rng(seed)
    tiers = tuple(Tier(f"t{t}", int(rng.integers(5, 40)), reserve_price=1) for t in range(4))
    tenants = tuple(Tenant(f"n{i}", weight=float(rng.choice([1, 2]))) for i in range(3))
    bids = []
    for b in range(int(rng.integers(80, 120))):
        accept = rng.choice(4, size=int(rng.integers(1, 3)), replace=False)
        bids.append(
            Bid(
                f"b{b:03d}",
                f"n{rng.integers(0, 3)}",
                int(rng.integers(1, 5)),
                {f"t{t}": int(rng.integers(2, 9)) for t in sorted(accept)},
            )
        )
    return Instance(tiers=tiers, tenants=tenants, bids=tuple(bids))


def _objective(inst: Instance, result) -> tuple[float, np.ndarray]:
    """stage 2's objective (each GPU at its tenant's best limit on its tier, summed) and the
    GPUs each bid won."""
    a = instance_arrays(inst)
    best = np.zeros((a.n_tenants, a.n_tiers))
    np.maximum.at(best, (a.arc_tenant, a.arc_tier), a.arc_price)
    tier = {name: t for t, name in enumerate(a.tier_names)}
    tenant_of = dict(zip(a.bid_ids, a.bid_tenant.tolist(), strict=True))
    total, per_bid = 0.0, np.zeros(a.n_bids)
    index = {bid: b for b, bid in enumerate(a.bid_ids)}
    for alloc in result.allocations:
        total += best[tenant_of[alloc.bid], tier[alloc.tier]] * alloc.gpus
        per_bid[index[alloc.bid]] += alloc.gpus
    return total, per_bid


@pytest.mark.parametrize("seed", range(8))
def test_pooled_bids_reach_the_optimum_of_the_bids_one_by_one(seed, monkeypatch):
    # Divisible, so no rounding: the pooled program and the program of the bids have the
    # same optimum, tau* and stage 2's objective (the utilities' weighted sum) alike.
    inst = _few_large_tenants(seed)
    market = build_market(instance_arrays(inst), divisible=True)
    assert pools.pools(market) is not None  # the instance is one pooling applies to
    pooled = clear(inst, mechanism="maxmin", divisible=True)
    monkeypatch.setattr(pools, "POOL_BELOW", 0.0)
    assert pools.pools(market) is None
    apart = clear(inst, mechanism="maxmin", divisible=True)
    ratio = pooled.diagnostics["min_share_ratio"]
    assert ratio == pytest.approx(apart.diagnostics["min_share_ratio"], rel=1e-6)
    got, per_bid = _objective(inst, pooled)
    assert got == pytest.approx(_objective(inst, apart)[0], rel=1e-6)
    assert np.all(per_bid <= instance_arrays(inst).quantity + 1e-9)


@pytest.mark.parametrize("seed", range(8))
def test_pooled_whole_gpus_keep_every_bid_within_its_quantity(seed):
    inst = _few_large_tenants(seed)
    r = clear(inst, mechanism="maxmin")
    _, per_bid = _objective(inst, r)
    a = instance_arrays(inst)
    assert np.all(per_bid == np.rint(per_bid))
    assert np.all(per_bid <= a.quantity)
    used = {t.name: 0 for t in inst.tiers}
    for alloc in r.allocations:
        used[alloc.tier] += alloc.gpus
    assert all(used[t.name] <= t.capacity for t in inst.tiers)
    assert r.diagnostics["guarantees_unmet"] == 0


def test_a_pools_gpus_go_to_its_bids_in_id_order():
    # Three alike bids of 2 GPUs on t0 and t1, 2 GPUs on t0 and 1 on t1: the pool wins all
    # three; the first bid takes t0's two, the second t1's one, the third nothing.
    inst = Instance(
        tiers=(Tier("t0", 2, reserve_price=1), Tier("t1", 1, reserve_price=1)),
        tenants=(Tenant("n", weight=1),),
        bids=tuple(Bid(f"b{i}", "n", 2, {"t0": 5, "t1": 5}) for i in range(3)),
    )
    r = clear(inst, mechanism="maxmin")
    got = sorted((x.bid, x.tier, x.gpus) for x in r.allocations)
    assert got == [("b0", "t0", 2), ("b1", "t1", 1)]


def test_a_pools_gpus_go_to_its_highest_offer_first():
    # The same three bids, b2 offering more on each tier: it is served first, then b0; b1,
    # the lowest offer after b0's equal one by id, is left wanting, and maxmin's price on t0
    # is b1's limit, not b2's.
    inst = Instance(
        tiers=(Tier("t0", 2, reserve_price=1), Tier("t1", 1, reserve_price=1)),
        tenants=(Tenant("n", weight=1),),
        bids=(
            Bid("b0", "n", 2, {"t0": 5, "t1": 5}),
            Bid("b1", "n", 2, {"t0": 5, "t1": 5}),
            Bid("b2", "n", 2, {"t0": 9, "t1": 8}),
        ),
    )
    r = clear(inst, mechanism="maxmin")
    got = sorted((x.bid, x.tier, x.gpus) for x in r.allocations)
    assert got == [("b0", "t1", 1), ("b2", "t0", 2)]
    assert r.prices == {"t0": 5, "t1": 5}


def test_gang_bids_stay_their_own_pool():
    inst = Instance(
        tiers=(Tier("t0", 8, reserve_price=1),),
        tenants=(Tenant("n", weight=1),),
        bids=(
            Bid("b0", "n", 2, {"t0": 5}),
            Bid("b1", "n", 2, {"t0": 5}, min_quantity=2),
            Bid("b2", "n", 2, {"t0": 5}),
            Bid("b3", "n", 2, {"t0": 5}),
            Bid("b4", "n", 2, {"t0": 5}),
        ),
    )
    pooled = pools.pools(build_market(instance_arrays(inst), divisible=False))
    assert pooled is not None
    a = pooled.market.arrays
    assert a.bid_ids == ("b0", "b1")  # the four divisible bids as b0's pool, the gang alone
    assert a.quantity.tolist() == [8.0, 2.0]
    assert pooled.market.is_gang.tolist() == [False, True]


def _eg_value(inst: Instance, result, budget: np.ndarray) -> float:
    """sum_i B_i log u_i of the result, u_i at the tenant's best limit on each tier."""
    a = instance_arrays(inst)
    best = np.zeros((a.n_tenants, a.n_tiers))
    np.maximum.at(best, (a.arc_tenant, a.arc_tier), a.arc_price)
    tier = {name: t for t, name in enumerate(a.tier_names)}
    tenant = dict(zip(a.bid_ids, a.bid_tenant.tolist(), strict=True))
    u = np.zeros(a.n_tenants)
    for x in result.allocations:
        u[tenant[x.bid]] += best[tenant[x.bid], tier[x.tier]] * x.gpus
    counted = budget > 0
    return float(budget[counted] @ np.log(u[counted]))


@pytest.mark.parametrize("seed", range(8))
def test_fisher_on_pooled_bids_reaches_the_optimum_of_the_bids_one_by_one(seed, monkeypatch):
    # The budgets come from the bids' own limits (no budget set): the pooled market is given
    # the bids' budgets, not those its pools' best limits would make.
    inst = _few_large_tenants(seed)
    market = build_market(instance_arrays(inst), divisible=True)
    budget = fisher.budgets(market)
    assert pools.pools(market) is not None
    pooled = clear(inst, mechanism="fisher", divisible=True)
    monkeypatch.setattr(pools, "POOL_BELOW", 0.0)
    apart = clear(inst, mechanism="fisher", divisible=True)
    assert _eg_value(inst, pooled, budget) == pytest.approx(
        _eg_value(inst, apart, budget), rel=1e-6
    )
