"""The min-cost-flow solvers against the LPs they replace (column generation, the guarantee's
transport LPs) and the rules they must keep: ties by bid id, fallbacks when data are not whole."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from market.clearing import Bid, Instance, Tenant, Tier, clear
from market.clearing.instance.inputs import instance_arrays
from market.clearing.mechanisms import guarantee
from market.clearing.mechanisms.rules import OpenMarket, build_market, open_market
from market.clearing.outcome.prices import minimal_prices
from market.clearing.solvers import flow
from market.clearing.solvers.colgen import solve_welfare
from tests.market.clearing.test_clearing_properties import instances


def _open(inst: Instance):
    a = instance_arrays(inst)
    market = build_market(a, divisible=False)
    return a, market, open_market(market, arc_price=a.arc_price - a.reserve[a.arc_tier])


def _feasible(om, x) -> None:
    assert np.all(x >= -1e-9)
    assert np.all(
        np.bincount(om.arc_bid, weights=x, minlength=om.bid_room.size) <= om.bid_room + 1e-9
    )
    assert np.all(
        np.bincount(om.arc_tier, weights=x, minlength=om.tier_room.size) <= om.tier_room + 1e-9
    )
    capped = om.arc_capped >= 0
    held = np.bincount(om.arc_capped[capped], weights=x[capped], minlength=om.group_room.size)
    assert np.all(held <= om.group_room + 1e-9)


@settings(max_examples=150, deadline=None)
@given(instances(gangs=False))
def test_welfare_flow_matches_column_generation_in_profit_and_least_prices(inst):
    _, _, om = _open(inst)

    x = flow.welfare_flow(om)
    lp = np.rint(solve_welfare(om).x)

    assert x is not None
    _feasible(om, x)
    assert np.all(x == np.rint(x))
    assert om.arc_price @ x == pytest.approx(om.arc_price @ lp, abs=1e-6)
    # The least equilibrium prices belong to the problem, not to the optimum picked.
    np.testing.assert_allclose(minimal_prices(om, x), minimal_prices(om, lp), atol=1e-6)


@st.composite
def alike_bids(draw) -> Instance:
    """Many bids drawn from a few limit sets, so that bids of identical arcs are common."""
    tiers = tuple(
        Tier(f"t{i}", draw(st.integers(0, 15)), reserve_price=1, max_share=m)
        for i, m in enumerate(draw(st.lists(st.sampled_from([1.0, 0.5]), min_size=1, max_size=3)))
    )
    names = [t.name for t in tiers]
    pool = draw(
        st.lists(
            st.dictionaries(st.sampled_from(names), st.integers(0, 6), min_size=1),
            min_size=1,
            max_size=3,
        )
    )
    n_tenants = draw(st.integers(1, 3))
    bids = tuple(
        Bid(f"b{i:02d}", f"n{draw(st.integers(0, n_tenants - 1))}", q, draw(st.sampled_from(pool)))
        for i, q in enumerate(draw(st.lists(st.integers(1, 4), min_size=1, max_size=12)))
    )
    return Instance(
        tiers=tiers,
        tenants=tuple(Tenant(f"n{i}", weight=0.0) for i in range(n_tenants)),
        bids=bids,
    )


@settings(max_examples=150, deadline=None)
@given(alike_bids())
def test_bids_of_identical_arcs_are_solved_as_one_and_shared_out_exactly(inst):
    _, _, om = _open(inst)

    x = flow.welfare_flow(om)
    lp = np.rint(solve_welfare(om).x)

    _feasible(om, x)
    assert om.arc_price @ x == pytest.approx(om.arc_price @ lp, abs=1e-6)
    np.testing.assert_allclose(minimal_prices(om, x), minimal_prices(om, lp), atol=1e-6)
    # Among bids with the same limits everywhere (and the same share caps: one tenant's, or
    # none), a later bid gets GPUs only once every earlier one is full.
    got = np.bincount(om.arc_bid, weights=x, minlength=om.bid_room.size)
    uncapped = all(t.max_share == 1.0 for t in inst.tiers)
    for i, bid in enumerate(inst.bids):
        for j in range(i):
            alike = inst.bids[j].limits == bid.limits
            if alike and (uncapped or inst.bids[j].tenant == bid.tenant) and got[i] > 0:
                assert got[j] == om.bid_room[j]


@settings(max_examples=200, deadline=None)
@given(st.lists(st.lists(st.integers(-2, 3), min_size=3, max_size=3), min_size=1, max_size=30))
def test_equal_rows_are_the_classes_of_identical_rows_numbered_by_first_row(rows):
    key = np.array(rows, dtype=np.int64)

    head, row_class = flow.equal_rows(key)

    for i in range(len(rows)):
        for j in range(len(rows)):
            assert (row_class[i] == row_class[j]) == (rows[i] == rows[j])
    assert head.tolist() == sorted(head.tolist())
    assert np.all(head[row_class] <= np.arange(len(rows)))


def test_rows_whose_hashes_collide_stay_apart():
    m = flow.row_mix(2).astype(np.int64)
    key = np.array([[0, 0], [m[1], -m[0]], [0, 0]], dtype=np.int64)  # both hash to 0

    head, row_class = flow.equal_rows(key)

    assert row_class.tolist() == [0, 1, 0]
    assert head.tolist() == [0, 1]


def test_equal_limits_go_to_the_earlier_bid_whatever_the_solver_picked():
    bids = tuple(Bid(f"b{i}", f"n{i}", 2, {"a100": 5}) for i in range(6))
    inst = Instance(
        tiers=(Tier("a100", 5, reserve_price=1),),
        tenants=tuple(Tenant(f"n{i}", weight=0.0) for i in range(6)),
        bids=bids,
    )
    _, _, om = _open(inst)

    x = flow.welfare_flow(om)

    assert x.tolist() == [2, 2, 1, 0, 0, 0]
    # fill_by_id alone puts any optimum of the class in id order.
    assert flow.fill_by_id(om, np.array([0, 0, 1, 0, 2, 2.0])).tolist() == [2, 2, 1, 0, 0, 0]


def test_a_bid_that_is_full_elsewhere_is_skipped_in_the_id_order():
    # b0 is held on a100 at a higher limit; on h100 its tie with b1 cannot give it more.
    inst = Instance(
        tiers=(Tier("a100", 2), Tier("h100", 2)),
        tenants=(Tenant("n0", weight=0.0), Tenant("n1", weight=0.0)),
        bids=(Bid("b0", "n0", 2, {"a100": 9, "h100": 4}), Bid("b1", "n1", 2, {"h100": 4})),
    )
    _, _, om = _open(inst)

    x = flow.welfare_flow(om)

    assert x.tolist() == [2, 0, 2]  # arcs: b0/a100, b0/h100, b1/h100
    assert flow.fill_by_id(om, np.array([2, 0, 2.0])).tolist() == [2, 0, 2]


def test_a_bid_freed_by_reordering_one_tier_is_served_first_on_another():
    # Every limit equal; b0 bids on t1, b1 on t0 and t1, b2 on t0; one GPU each. The solver
    # gave t0 to b2 and t1 to b1. In id order t1 goes to b0, which frees b1, and then t0 goes
    # to b1 before b2 (found by hypothesis: t0 was once checked only before b1 was freed).
    om = OpenMarket(
        arc_bid=np.array([0, 1, 1, 2]),
        arc_tier=np.array([1, 0, 1, 0]),
        arc_capped=np.full(4, -1),
        arc_price=np.ones(4),
        bid_room=np.ones(3),
        group_room=np.zeros(0),
        tier_room=np.array([1.0, 1.0]),
    )
    x = flow.fill_by_id(om, np.array([0, 0, 1, 1.0]))
    assert x.tolist() == [1, 1, 0, 0]


def test_limits_in_milli_credits_as_the_platform_sends_them_go_to_the_flow():
    # The platform's limits and reserves are whole milli-credits, read as credits.
    inst = Instance(
        tiers=(Tier("a100", 3, reserve_price=1.25), Tier("h100", 2, reserve_price=2.001)),
        tenants=(Tenant("n0", weight=0.0), Tenant("n1", weight=0.0)),
        bids=(
            Bid("b0", "n0", 2, {"a100": 3.141, "h100": 4.999}),
            Bid("b1", "n1", 3, {"a100": 2.718, "h100": 5.002}),
        ),
    )
    _, _, om = _open(inst)

    x = flow.welfare_flow(om)

    assert x is not None
    assert om.arc_price @ x == pytest.approx(om.arc_price @ np.rint(solve_welfare(om).x))


@pytest.mark.parametrize(
    "change",
    [
        {"limit": 5.0005},  # finer than a milli-credit
        {"quantity": 1.5},  # divisible data
    ],
)
def test_data_that_are_not_whole_are_left_to_the_lp(change):
    inst = Instance(
        tiers=(Tier("a100", 2),),
        tenants=(Tenant("n0", weight=0.0),),
        bids=(Bid("b0", "n0", change.get("quantity", 2), {"a100": change.get("limit", 5)}),),
    )
    a = instance_arrays(inst)
    market = build_market(a, divisible=True)
    om = open_market(market, arc_price=a.arc_price)

    assert flow.welfare_flow(om) is None
    # and the mechanism still clears it (by column generation)
    result = clear(inst, divisible=True)
    assert sum(x.gpus for x in result.allocations) == pytest.approx(change.get("quantity", 2))


def test_costs_beyond_the_solvers_range_are_refused_not_overflowed():
    # Two parallel arcs from node 0 to node 1; the solver scales costs by the node count.
    def solve(cost):
        return flow.min_cost_flow_solve(
            np.array([0, 0]),
            np.array([1, 1]),
            np.array([1, 1]),
            np.array([-cost, -(cost - 1)], dtype=np.int64),
            np.array([1, -1], dtype=np.int64),
        )

    assert solve(2**40).tolist() == [1, 0]
    assert solve(2**60) is None


@settings(max_examples=100, deadline=None)
@given(instances(gangs=False), st.booleans(), st.booleans())
def test_guarantee_paths_and_big_tenants_match_the_transport_lps(inst, fractional, divisible):
    a = instance_arrays(inst)
    market = build_market(a, divisible=divisible)

    g_paths, y_paths = guarantee.guarantee_bundles(market, a.arc_price, fractional=fractional)
    saved = guarantee.Paths.solve

    def unsolved(self, share, *, start=None):  # every tenant left to the LP
        return np.zeros(self.size), np.zeros(self.size, dtype=bool)

    guarantee.Paths.solve = unsolved
    try:
        g_lp, _ = guarantee.guarantee_bundles(market, a.arc_price, fractional=fractional)
    finally:
        guarantee.Paths.solve = saved

    # A tenant of more than BIG_TENANT_BIDS bids goes to the LP directly; at 1, every tenant
    # of two bids or more does.
    saved_big = guarantee.BIG_TENANT_BIDS
    guarantee.BIG_TENANT_BIDS = 1
    try:
        g_big, y_big = guarantee.guarantee_bundles(market, a.arc_price, fractional=fractional)
    finally:
        guarantee.BIG_TENANT_BIDS = saved_big

    np.testing.assert_allclose(g_paths, g_lp, rtol=1e-9, atol=1e-9)
    np.testing.assert_allclose(g_big, g_paths, rtol=1e-9, atol=1e-9)
    if fractional:  # the normaliser as the mechanisms compute it: from the whole-share bundles
        _, whole = guarantee.guarantee_bundles(market, a.arc_price)
        g_warm, y_warm = guarantee.guarantee_bundles(
            market, a.arc_price, fractional=True, start=whole
        )
        np.testing.assert_allclose(g_warm, g_lp, rtol=1e-9, atol=1e-9)
        _within_shares(market, y_warm, fractional)
    for y in (y_paths, y_big):
        _within_shares(market, y, fractional)
        if not (fractional or divisible):
            assert np.all(y == np.rint(y))


def _within_shares(market, y, fractional) -> None:
    a = market.arrays
    share = (
        market.group_share
        if (fractional or market.divisible)
        else np.floor(market.group_share + 1e-9)
    )
    assert np.all(y >= 0)
    assert np.all(np.bincount(a.arc_bid, weights=y, minlength=a.n_bids) <= a.quantity + 1e-9)
    held = np.bincount(market.arc_group, weights=y, minlength=share.size)
    assert np.all(held <= share + 1e-9)
