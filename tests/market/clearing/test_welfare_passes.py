"""Welfare's bundle passes (large instances): the forecast of the tenants the bundles will
push below their guarantee, and the passes' result on an instance large enough to use them."""

from __future__ import annotations

import numpy as np

from market.clearing import Bid, Instance, Tenant, Tier, clear
from market.clearing.instance.inputs import instance_arrays
from market.clearing.mechanisms import welfare
from market.clearing.mechanisms.guarantee import guarantee_bundles
from market.clearing.mechanisms.rules import build_market, open_market
from market.clearing.solvers.flow import welfare_flow


def test_the_forecast_names_the_winner_a_bundle_will_push_out():
    # Three GPUs, one per tenant by share. Unconstrained, b (10) takes two and c (5) one, and
    # a (1) is short: its bundle takes a GPU, so the least surplus winner, c, loses its one
    # and falls below its guarantee. b keeps two GPUs, above its guarantee of one.
    inst = Instance(
        tiers=(Tier("t0", 3),),
        tenants=(Tenant("A"), Tenant("B"), Tenant("C")),
        bids=(
            Bid("a", "A", 1, {"t0": 1}),
            Bid("b", "B", 2, {"t0": 10}),
            Bid("c", "C", 1, {"t0": 5}),
        ),
    )
    a = instance_arrays(inst)
    market = build_market(a, divisible=False)
    om = open_market(market, arc_price=a.arc_price - a.reserve[a.arc_tier])
    x0 = welfare_flow(om)
    assert x0.tolist() == [0.0, 2.0, 1.0]
    g, bundle = guarantee_bundles(market, a.arc_price)
    utility = np.bincount(a.arc_tenant, weights=a.arc_price * x0, minlength=3)
    joining = utility < g
    assert joining.tolist() == [True, False, False]
    order = welfare._take_back_order(om)
    found = welfare._displaced(market, om, x0, joining, bundle, utility, g, order)
    assert found.tolist() == [False, False, True]


def test_bundle_passes_hold_every_guarantee_on_a_market_above_the_exact_size():
    rng = np.random.default_rng(7)
    tiers = tuple(Tier(f"t{i}", 30, reserve_price=1) for i in range(4))
    bids = []
    for k in range(400):
        accept = rng.choice(4, size=rng.integers(1, 4), replace=False)
        level = float(rng.lognormal(2.0, 0.6))
        bids.append(
            Bid(
                f"b{k:03d}",
                f"n{int(rng.integers(0, 10)):02d}",
                int(rng.choice([1, 2, 4])),
                {f"t{t}": max(1, round(level * (1 + 0.3 * t))) for t in sorted(accept)},
            )
        )
    inst = Instance(tiers, tuple(Tenant(f"n{i:02d}") for i in range(10)), tuple(bids))
    assert sum(len(b.limits) for b in bids) > welfare.EXACT_COLUMNS
    r = clear(inst)
    assert r.diagnostics["guarantees_unmet"] == 0
    used: dict[str, int] = {}
    for alloc in r.allocations:
        used[alloc.tier] = used.get(alloc.tier, 0) + alloc.gpus
    assert all(used.get(t.name, 0) <= t.capacity for t in tiers)
    weightless = Instance(tiers, tuple(Tenant(t.name, weight=0) for t in inst.tenants), inst.bids)
    assert clear(weightless).diagnostics["welfare"] > r.diagnostics["welfare"]  # it binds
    assert clear(inst).allocations == r.allocations  # deterministic
