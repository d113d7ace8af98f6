"""Every tenant's best bundle by longest augmenting paths (transport.py) against an LP per
tenant, on random problems with more tiers, bids and ties than the instances of the
property tests."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.optimize import linprog

from market.clearing.solvers import transport


def _problems(seed: int, *, tenants: int, tiers: int, whole: bool):
    """Arcs in bid order, one per (bid, tier) at most; values drawn from a few levels so that
    ties are common."""
    rng = np.random.default_rng(seed)
    n_bids = int(rng.integers(1, 8 * tenants))
    bid_tenant = rng.integers(0, tenants, size=n_bids)
    quantity = rng.integers(1, 6, size=n_bids).astype(float)
    share = rng.integers(0, 4, size=(tenants, tiers)).astype(float)
    if not whole:
        share += rng.choice([0.0, 0.25, 0.6], size=share.shape)
    rows = []
    for b in range(n_bids):
        for t in np.sort(rng.choice(tiers, size=rng.integers(1, tiers + 1), replace=False)):
            rows.append((b, t, float(rng.choice([1, 2, 3, 5, 8, 13]))))
    arc_bid = np.array([r[0] for r in rows])
    arc_tier = np.array([r[1] for r in rows])
    value = np.array([r[2] for r in rows])
    arc_tenant = bid_tenant[arc_bid]
    keep = share[arc_tenant, arc_tier] > 0
    return (
        arc_bid[keep],
        arc_tenant[keep],
        arc_tier[keep],
        value[keep],
        quantity[arc_bid[keep]],
        share[arc_tenant[keep], arc_tier[keep]],
    )


def _lp_optimum(arc_bid, arc_tier, value, quantity, share) -> float:
    """max v.y s.t. a bid's arcs <= its quantity, a tier's arcs <= the share (one tenant)."""
    bids, b_row = np.unique(arc_bid, return_inverse=True)
    tiers, t_row = np.unique(arc_tier, return_inverse=True)
    n = arc_bid.size
    A = sp.vstack(
        [
            sp.csr_matrix((np.ones(n), (b_row, np.arange(n))), shape=(bids.size, n)),
            sp.csr_matrix((np.ones(n), (t_row, np.arange(n))), shape=(tiers.size, n)),
        ]
    )
    b_hi = np.zeros(bids.size)
    b_hi[b_row] = quantity
    t_hi = np.zeros(tiers.size)
    t_hi[t_row] = share
    res = linprog(-value, A_ub=A, b_ub=np.r_[b_hi, t_hi], bounds=(0, None), method="highs")
    assert res.status == 0
    return -res.fun


def _each_tenants_optimum(y, arc_bid, arc_tenant, arc_tier, value, quantity, share) -> None:
    """``y`` fits every bid and share, and gives each tenant its LP optimum."""
    assert np.all(y >= 0)
    for b in np.unique(arc_bid):
        assert y[arc_bid == b].sum() <= quantity[arc_bid == b][0] + 1e-9
    for i in np.unique(arc_tenant):
        mine = arc_tenant == i
        for t in np.unique(arc_tier[mine]):
            cell = mine & (arc_tier == t)
            assert y[cell].sum() <= share[cell][0] + 1e-9
        best = _lp_optimum(arc_bid[mine], arc_tier[mine], value[mine], quantity[mine], share[mine])
        assert value[mine] @ y[mine] == pytest.approx(best, rel=1e-9, abs=1e-9)


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 2**32 - 1), st.integers(1, 6), st.booleans())
def test_best_bundles_are_each_tenants_optimum(seed, tiers, whole):
    arc_bid, arc_tenant, arc_tier, value, quantity, share = _problems(
        seed, tenants=12, tiers=tiers, whole=whole
    )
    y, solved = transport.best_bundles(arc_bid, arc_tenant, arc_tier, value, quantity, share, tiers)
    assert solved.all()
    _each_tenants_optimum(y, arc_bid, arc_tenant, arc_tier, value, quantity, share)
    if whole:
        assert np.all(y == np.rint(y))


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 2**32 - 1), st.integers(1, 6))
def test_the_whole_share_bundles_start_the_fractional_problem_at_its_optimum(seed, tiers):
    # The fractional normaliser starts from the whole-share bundles (shares floored): that
    # flow is feasible for the larger shares, and the paths from it must still reach each
    # tenant's optimum, including by moving GPUs to the tiers whose share grew.
    arc_bid, arc_tenant, arc_tier, value, quantity, share = _problems(
        seed, tenants=12, tiers=tiers, whole=False
    )
    floor = np.floor(share)
    whole, _ = transport.best_bundles(arc_bid, arc_tenant, arc_tier, value, quantity, floor, tiers)
    y, solved = transport.best_bundles(
        arc_bid, arc_tenant, arc_tier, value, quantity, share, tiers, start=whole
    )
    cold, _ = transport.best_bundles(arc_bid, arc_tenant, arc_tier, value, quantity, share, tiers)
    assert solved.all()
    _each_tenants_optimum(y, arc_bid, arc_tenant, arc_tier, value, quantity, share)
    _each_tenants_optimum(cold, arc_bid, arc_tenant, arc_tier, value, quantity, share)


def test_a_start_is_improved_by_moving_a_bid_to_the_tier_whose_share_grew():
    # One tenant, one bid of 1 GPU worth 1 on tier 0 and 5 on tier 1; shares 1 and 0.5. The
    # whole-share bundle (shares 1 and 0) puts it on tier 0; with the half share of tier 1 the
    # optimum moves half of it there (value 3): no bid has GPUs left to enter with, so only a
    # path that starts by freeing tier 0 finds it.
    y, solved = transport.best_bundles(
        np.array([0, 0]),
        np.array([0, 0]),
        np.array([0, 1]),
        np.array([1.0, 5.0]),
        np.array([1.0, 1.0]),
        np.array([1.0, 0.5]),
        2,
        start=np.array([1.0, 0.0]),
    )
    assert solved.all()
    assert y.tolist() == [0.5, 0.5]


def test_a_move_to_another_tier_makes_room_for_a_better_bid():
    # Bid 0 is worth 10 on t0 and 9 on t1; bid 1 is worth 9 on t0 and 1 on t1; one GPU of
    # each tier. Taking the best arc first gives bid 0 t0 (10); the optimum moves it to t1
    # and gives t0 to bid 1 (9 + 9).
    y, solved = transport.best_bundles(
        arc_bid=np.array([0, 0, 1, 1]),
        arc_tenant=np.zeros(4, dtype=np.int64),
        arc_tier=np.array([0, 1, 0, 1]),
        value=np.array([10.0, 9.0, 9.0, 1.0]),
        quantity=np.ones(4),
        share=np.ones(4),
        n_tiers=2,
    )
    assert solved.all()
    assert y.tolist() == [0.0, 1.0, 1.0, 0.0]


def test_equal_values_go_to_the_lower_bid_id():
    y, _ = transport.best_bundles(
        arc_bid=np.array([0, 1, 2]),
        arc_tenant=np.zeros(3, dtype=np.int64),
        arc_tier=np.zeros(3, dtype=np.int64),
        value=np.array([5.0, 5.0, 5.0]),
        quantity=np.ones(3),
        share=np.full(3, 2.0),
        n_tiers=1,
    )
    assert y.tolist() == [1.0, 1.0, 0.0]


def test_a_tenant_not_done_within_the_path_limit_is_handed_back_unsolved(monkeypatch):
    # Tenant 0 needs two paths (two bids of 1 GPU for its share of 2), tenant 1 one; each
    # also needs a search that finds no more. Within 2 searches tenant 1 is done and tenant 0
    # is not: it is handed back (the guarantee gives it to an LP) with what it had reached.
    monkeypatch.setattr(transport, "PATH_LIMIT", 2)
    y, solved = transport.best_bundles(
        arc_bid=np.array([0, 1, 2]),
        arc_tenant=np.array([0, 0, 1]),
        arc_tier=np.zeros(3, dtype=np.int64),
        value=np.array([3.0, 2.0, 4.0]),
        quantity=np.ones(3),
        share=np.array([2.0, 2.0, 1.0]),
        n_tiers=1,
    )
    assert solved.tolist() == [False, False, True]
    assert y.tolist() == [1.0, 1.0, 1.0]
    monkeypatch.setattr(transport, "PATH_LIMIT", 3)
    _, solved = transport.best_bundles(
        np.array([0, 1, 2]),
        np.array([0, 0, 1]),
        np.zeros(3, dtype=np.int64),
        np.array([3.0, 2.0, 4.0]),
        np.ones(3),
        np.array([2.0, 2.0, 1.0]),
        1,
    )
    assert solved.all()
