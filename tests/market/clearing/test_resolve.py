"""The welfare flow solved again after its rooms were lowered (resolve.py): it solves only the
bids the change can move, and its answer is as good as solving the whole market."""

from __future__ import annotations

from unittest import mock

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from market.clearing import Bid, Instance, Tenant, Tier
from market.clearing.mechanisms.rules import OpenMarket
from market.clearing.outcome.prices import minimal_prices
from market.clearing.solvers import flow, resolve
from tests.market.clearing.test_clearing_properties import instances
from tests.market.clearing.test_flow import _feasible, _open


def _lowered(om: OpenMarket, data: st.DataObject) -> OpenMarket:
    """``om`` with some bids', tiers' and capped groups' rooms lowered (whole GPUs)."""

    def cut(room: np.ndarray) -> np.ndarray:
        drops = data.draw(st.lists(st.integers(0, 3), min_size=room.size, max_size=room.size))
        return np.maximum(room - np.array(drops, dtype=float), 0.0)

    return OpenMarket(
        arc_bid=om.arc_bid,
        arc_tier=om.arc_tier,
        arc_capped=om.arc_capped,
        arc_price=om.arc_price,
        bid_room=cut(om.bid_room),
        group_room=cut(om.group_room),
        tier_room=cut(om.tier_room),
    )


def _solved(inst: Instance) -> tuple[OpenMarket, flow.WelfareNetwork, np.ndarray]:
    """The instance's open market, its flow network and an optimal allocation of it."""
    _, _, before = _open(inst)
    network = flow.WelfareNetwork.of(before)
    return before, network, network.solve(before)


def _one_team(
    tiers: tuple[Tier, ...], bids: tuple[Bid, ...]
) -> tuple[OpenMarket, flow.WelfareNetwork, np.ndarray]:
    """``_solved`` of a market of these tiers and bids, all of one team without a guarantee."""
    return _solved(Instance(tiers=tiers, tenants=(Tenant("T", weight=0.0),), bids=bids))


def _parts_solved(
    network: flow.WelfareNetwork, m: OpenMarket, before: OpenMarket, x_before: np.ndarray
) -> tuple[list[list[int]], np.ndarray, np.ndarray]:
    """``welfare_flow_near``'s (x, prices), after the bids of each part it solved."""
    parts: list[list[int]] = []
    solve_part = resolve.welfare_flow

    def spy(sub: OpenMarket, **how) -> np.ndarray | None:
        parts.append(np.flatnonzero(sub.bid_room > 0).tolist())
        return solve_part(sub, **how)

    with mock.patch.object(resolve, "welfare_flow", spy):
        x, prices = resolve.welfare_flow_near(network, m, before, x_before)
    return parts, x, prices


def _equilibrium(m: OpenMarket, x: np.ndarray, prices: np.ndarray) -> None:
    """At ``prices`` every bid without a share cap gets GPUs only on its best arcs, all it
    asks when those pay, none when nothing does; a tier with a price is full."""
    tol = 1e-6
    surplus = m.arc_price - prices[m.arc_tier]
    B = m.bid_room.size
    best = np.full(B, -np.inf)
    np.maximum.at(best, m.arc_bid, surplus)
    got = np.bincount(m.arc_bid, weights=x, minlength=B)
    free = ~(np.bincount(m.arc_bid, weights=m.arc_capped >= 0, minlength=B) > 0)
    on = (x > 0) & free[m.arc_bid]
    assert np.all(surplus[on] >= np.maximum(best[m.arc_bid[on]], 0.0) - tol)
    assert np.all(got[free & (best > tol)] == m.bid_room[free & (best > tol)])
    used = np.bincount(m.arc_tier, weights=x, minlength=m.tier_room.size)
    assert np.all(used[prices > tol] == m.tier_room[prices > tol])
    assert np.all(prices >= 0.0)


@settings(max_examples=200, deadline=None)
@given(instances(gangs=False), st.data())
def test_a_market_left_from_another_is_solved_as_well_as_from_nothing(inst, data):
    # Twice: from the least prices of the first market, then from the prices the first
    # solve gives back, as the bundle passes chain them.
    market, network, x_market = _solved(inst)
    prices_market = None
    for _ in range(2):
        m = _lowered(market, data)

        with mock.patch.object(resolve, "NEAR_SHARE", 1.0):  # the parts, however small
            x, prices = resolve.welfare_flow_near(network, m, market, x_market, prices_market)
        whole = network.solve(m)

        _feasible(m, x)
        assert np.all(x == np.rint(x))
        assert m.arc_price @ x == pytest.approx(m.arc_price @ whole, abs=1e-6)
        np.testing.assert_allclose(minimal_prices(m, x), minimal_prices(m, whole), atol=1e-6)
        _equilibrium(m, x, prices)
        np.testing.assert_allclose(prices, minimal_prices(m, whole), atol=1e-6)
        market, x_market, prices_market = m, x, prices


def test_only_the_bids_the_change_can_move_are_solved_and_a_held_bid_the_prices_move_joins():
    # Before: A holds 2 GPUs, B 1. w prefers A (10) to B (8), z wants A (6), y wants B (3):
    # all win where they are. A then loses a GPU: w, of least margin on A, is solved alone;
    # A's price rises to 10 for w's sake, which z and y, held, cannot pay: they join, and
    # the best market gives A to z and B to w (14 against 13 for w on A and y on B).
    before, network, x_before = _one_team(
        (Tier("A", 2), Tier("B", 1)),
        (
            Bid("w", "T", 1, {"A": 10, "B": 8}),
            Bid("y", "T", 1, {"B": 3}),
            Bid("z", "T", 1, {"A": 6}),
        ),
    )
    assert x_before.tolist() == [1.0, 0.0, 1.0, 1.0]  # w on A, y on B, z on A
    m = OpenMarket(**{**before.__dict__, "tier_room": before.tier_room - [1.0, 0.0]})
    with mock.patch.object(resolve, "NEAR_SHARE", 1.0):
        parts, x, prices = _parts_solved(network, m, before, x_before)

    assert parts == [[0], [0, 1, 2]]
    assert x.tolist() == [0.0, 1.0, 0.0, 1.0]  # w on B, y out, z on A
    assert m.arc_price @ x == m.arc_price @ network.solve(m)


def test_a_winner_between_two_equally_good_tiers_is_held_on_the_one_it_had():
    # Before: w (5 on A or B) and z (2 on B) win, y (1 on A) is left out: the least prices
    # are 1 on both tiers, where w gains 4 on either. y then leaves: w is held on A, not
    # solved again (solved, it could fall on B), and at the new prices (0 and 0) it is still
    # among its best, so nothing is solved but an empty part.
    before, network, x_before = _one_team(
        (Tier("A", 1, reserve_price=0), Tier("B", 1, reserve_price=0)),
        (
            Bid("w", "T", 1, {"A": 5, "B": 5}),
            Bid("y", "T", 1, {"A": 1}),
            Bid("z", "T", 1, {"B": 2}),
        ),
    )
    assert x_before.tolist() == [1.0, 0.0, 0.0, 1.0]  # w on A, w on B, y, z on B
    assert minimal_prices(before, x_before).tolist() == [1.0, 1.0]
    m = OpenMarket(**{**before.__dict__, "bid_room": np.array([1.0, 0.0, 1.0])})
    parts, x, prices = _parts_solved(network, m, before, x_before)

    assert parts == [[]]
    assert x.tolist() == [1.0, 0.0, 0.0, 1.0]
    assert prices.tolist() == [0.0, 0.0]


def test_a_held_winner_moves_when_another_tier_it_wants_becomes_cheaper():
    # Before: A (2 GPUs) goes to k (12) and h (10, or 9 on B), j (3) left out: A's price 3;
    # B (2) goes to g (5, two GPUs), f (4) left out: B's price 4. h prefers A (7 a GPU over
    # the price) to B (5): it is held. Then g leaves: B's price falls to 0, where h gains
    # 9 on B against 7 on A, so h is solved again, moves to B and j takes its GPU on A
    # (h 9 + j 3 + f 4 against h 10 + f 4).
    before, network, x_before = _one_team(
        (Tier("A", 2, reserve_price=0), Tier("B", 2, reserve_price=0)),
        (
            Bid("f", "T", 1, {"B": 4}),
            Bid("g", "T", 2, {"B": 5}),
            Bid("h", "T", 1, {"A": 10, "B": 9}),
            Bid("j", "T", 1, {"A": 3}),
            Bid("k", "T", 1, {"A": 12}),
        ),
    )
    assert x_before.tolist() == [0.0, 2.0, 1.0, 0.0, 0.0, 1.0]  # f, g, h on A, h on B, j, k
    m = OpenMarket(**{**before.__dict__, "bid_room": before.bid_room * [1, 0, 1, 1, 1]})

    with mock.patch.object(resolve, "NEAR_SHARE", 1.0):
        x, prices = resolve.welfare_flow_near(network, m, before, x_before)

    assert x.tolist() == [1.0, 0.0, 0.0, 1.0, 1.0, 1.0]
    assert m.arc_price @ x == m.arc_price @ network.solve(m)


def test_a_large_part_is_solved_whole():
    before, network, x_before = _one_team(
        (Tier("A", 1),), (Bid("w", "T", 1, {"A": 10}), Bid("z", "T", 1, {"A": 6}))
    )
    m = OpenMarket(**{**before.__dict__, "bid_room": np.array([0.0, 1.0])})  # w gone

    with mock.patch.object(resolve, "welfare_flow", side_effect=AssertionError("a part")):
        x, prices = resolve.welfare_flow_near(network, m, before, x_before)

    assert x.tolist() == [0.0, 1.0]


def test_rooms_that_are_not_whole_are_left_to_the_lp():
    before, network, x_before = _one_team((Tier("A", 2),), (Bid("w", "T", 2, {"A": 10}),))
    m = OpenMarket(**{**before.__dict__, "tier_room": np.array([1.5])})

    assert resolve.welfare_flow_near(network, m, before, x_before) is None
