"""Welfare, and reference.py's statement of it, against independent formulations: scipy
linprog written out row by row, and brute-force least prices."""

from __future__ import annotations

import itertools
from collections import defaultdict

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.optimize import linprog

from market.clearing import Bid, Instance, Tenant, Tier, clear, reference
from market.clearing.instance.inputs import instance_arrays
from tests.market.clearing.test_clearing_properties import instances


def plain(inst: Instance, *, caps: bool = False) -> Instance:
    """The same instance without floors (weights 0), gangs and, unless kept, share caps."""
    return Instance(
        tiers=tuple(
            Tier(t.name, t.capacity, t.reserve_price, t.max_share if caps else 1.0)
            for t in inst.tiers
        ),
        tenants=tuple(Tenant(t.name, weight=0.0) for t in inst.tenants),
        bids=tuple(Bid(b.id, b.tenant, b.quantity, dict(b.limits)) for b in inst.bids),
    )


def arcs(inst: Instance) -> list[tuple[int, int, float]]:
    """(bid, tier, surplus over the reserve) for every acceptable pair."""
    reserve = [t.reserve_price for t in inst.tiers]
    index = {t.name: i for i, t in enumerate(inst.tiers)}
    return [
        (b, index[name], float(p) - reserve[index[name]])
        for b, bid in enumerate(inst.bids)
        for name, p in bid.limits.items()
        if p >= reserve[index[name]]
    ]


def surplus(inst: Instance, result) -> float:
    """sum (limit - reserve) x of a result."""
    reserve = {t.name: t.reserve_price for t in inst.tiers}
    bids = {b.id: b for b in inst.bids}
    return sum(a.gpus * (bids[a.bid].limits[a.tier] - reserve[a.tier]) for a in result.allocations)


def linprog_welfare(inst: Instance) -> float:
    """max sum (p - r) x  s.t.  bid quantity, tier capacity; written out row by row."""
    a = arcs(inst)
    if not a:
        return 0.0
    B, T = len(inst.bids), len(inst.tiers)
    A = np.zeros((B + T, len(a)))
    for e, (b, t, _) in enumerate(a):
        A[b, e] = 1
        A[B + t, e] = 1
    rhs = [b.quantity for b in inst.bids] + [t.capacity for t in inst.tiers]
    res = linprog(-np.array([p for *_, p in a]), A_ub=A, b_ub=rhs, bounds=(0, None), method="highs")
    assert res.status == 0
    return -res.fun


def brute_force_prices(inst: Instance) -> dict[str, float]:
    """Least integer prices at which the LP optimum is an equilibrium: reserve + pi.

    pi >= 0 supports the optimum exactly when, with each bid's surplus
    u_b = max(0, max_t (p_bt - r_t) - pi_t), the dual objective sum C pi + sum q u equals the
    optimal surplus. Integer limits and reserves give integer least prices, so a grid search
    finds them.
    """
    a = arcs(inst)
    optimum = linprog_welfare(inst)
    top = int(max((p for *_, p in a), default=0)) + 1
    T = len(inst.tiers)
    supporting = []
    for pi in itertools.product(range(top + 1), repeat=T):
        surplus = np.zeros(len(inst.bids))
        for b, t, p in a:
            surplus[b] = max(surplus[b], p - pi[t])
        dual = sum(c.capacity * pi[t] for t, c in enumerate(inst.tiers)) + sum(
            bid.quantity * surplus[b] for b, bid in enumerate(inst.bids)
        )
        if abs(dual - optimum) <= 1e-7 * (1 + optimum):
            supporting.append(pi)
    least = np.min(np.array(supporting), axis=0)
    assert tuple(least) in supporting, "the supporting prices form a lattice"
    return {t.name: float(t.reserve_price) + float(least[i]) for i, t in enumerate(inst.tiers)}


@settings(max_examples=40, deadline=None)
@given(inst=instances(gangs=False), divisible=st.booleans())
def test_welfare_matches_linprog(inst, divisible):
    inst = plain(inst)
    r = clear(inst, divisible=divisible)
    assert surplus(inst, r) == pytest.approx(linprog_welfare(inst), rel=1e-6, abs=1e-9)


@settings(max_examples=40, deadline=None)
@given(inst=instances(gangs=False))
def test_welfare_prices_are_the_least_equilibrium_prices(inst):
    """The clear's and the reference's (its least optimal duals) both."""
    inst = plain(inst)
    least = brute_force_prices(inst)
    assert clear(inst).prices == pytest.approx(least, abs=1e-6)
    a = instance_arrays(inst)
    if a.arc_bid.size:
        stated = reference.welfare(a, divisible=True).prices
        assert dict(zip(a.tier_names, stated.tolist(), strict=True)) == pytest.approx(
            least, abs=1e-6
        )


@settings(max_examples=40, deadline=None)
@given(inst=instances(gangs=False))
def test_welfare_with_share_caps_matches_the_reference_program(inst):
    inst = plain(inst, caps=True)
    a = instance_arrays(inst)
    stated = reference.welfare(a, divisible=False).objective if a.arc_bid.size else 0.0
    assert surplus(inst, clear(inst)) == pytest.approx(stated, rel=1e-6, abs=1e-9)


def test_column_generation_matches_linprog_on_a_larger_instance():
    rng = np.random.default_rng(7)
    tiers = tuple(Tier(f"t{i}", int(rng.integers(20, 60)), reserve_price=1) for i in range(4))
    tenants = (Tenant("n", weight=0),)
    bids = tuple(
        Bid(
            f"b{i:03d}",
            "n",
            int(rng.integers(1, 5)),
            {t.name: int(rng.integers(0, 30)) for t in rng.choice(tiers, size=2, replace=False)},
        )
        for i in range(300)
    )
    inst = Instance(tiers=tiers, tenants=tenants, bids=bids)
    assert surplus(inst, clear(inst)) == pytest.approx(linprog_welfare(inst), rel=1e-9)


@st.composite
def unit_demand(draw) -> Instance:
    """Bidders wanting one GPU each, with reserves, no weights: the assignment market."""
    n_tiers = draw(st.integers(1, 3))
    tiers = tuple(
        Tier(f"t{i}", draw(st.integers(0, 3)), reserve_price=draw(st.integers(0, 6)))
        for i in range(n_tiers)
    )
    n_bids = draw(st.integers(1, 5))
    return Instance(
        tiers=tiers,
        tenants=tuple(Tenant(f"n{b}", weight=0) for b in range(n_bids)),
        bids=tuple(
            Bid(
                f"b{b}",
                f"n{b}",
                1,
                {t.name: draw(st.integers(0, 15)) for t in tiers if draw(st.booleans())}
                or {tiers[0].name: draw(st.integers(0, 15))},
            )
            for b in range(n_bids)
        ),
    )


def payoff(inst: Instance, result, bid: str, true_limits: dict[str, float]) -> float:
    """The bidder's true value of what it won minus what it pays."""
    won = [a for a in result.allocations if a.bid == bid]
    return sum(a.gpus * true_limits[a.tier] for a in won) - result.charges.get(bid, 0.0)


@settings(max_examples=60, deadline=None)
@given(inst=unit_demand())
def test_welfare_prices_with_reserves_are_a_competitive_equilibrium(inst):
    r = clear(inst)
    reserve = {t.name: t.reserve_price for t in inst.tiers}
    sold: dict[str, float] = defaultdict(float)
    for a in r.allocations:
        sold[a.tier] += a.gpus
    for bid in inst.bids:
        surplus = {t: p - r.prices[t] for t, p in bid.limits.items()}
        best = max(max(surplus.values()), 0.0)
        won = [a.tier for a in r.allocations if a.bid == bid.id]
        if won:  # a winner holds a tier that is best for it at the prices
            assert surplus[won[0]] >= best - 1e-9
        else:  # a loser wants nothing at the prices, or everything it wants is sold out
            assert all(
                s <= 1e-9 or sold[t] >= next(x.capacity for x in inst.tiers if x.name == t)
                for t, s in surplus.items()
            )
    for t in inst.tiers:  # unsold capacity is priced at the reserve
        if sold[t.name] < t.capacity:
            assert r.prices[t.name] == pytest.approx(reserve[t.name])


@settings(max_examples=60, deadline=None)
@given(inst=unit_demand(), data=st.data())
def test_a_unit_demand_bidder_never_gains_by_misreporting(inst, data):
    who = data.draw(st.sampled_from(inst.bids))
    lie = {t: data.draw(st.integers(0, 15)) for t in who.limits}
    truthful = payoff(inst, clear(inst), who.id, who.limits)
    other = Instance(
        tiers=inst.tiers,
        tenants=inst.tenants,
        bids=tuple(Bid(b.id, b.tenant, 1, lie) if b.id == who.id else b for b in inst.bids),
    )
    assert payoff(other, clear(other), who.id, who.limits) <= truthful + 1e-9
