"""Least competitive-equilibrium prices of an optimal welfare allocation.

The optimal dual prices form a lattice; its least element is the smallest uniform price
per tier at which the allocation is an equilibrium. On the residual network of an optimal
flow (source -> bid -> [capped group] -> tier -> sink) the dual potentials are exactly the
solutions of the difference constraints Q_j >= Q_i + profit for every residual arc, so the
least potentials are longest-path distances from the source, found by label-correcting
rounds (relax every arc, repeat), each one vectorised over all arcs. A simple path meets each tier at most once, so the
rounds stop after a few times T.
"""

from __future__ import annotations

import numpy as np

from market.clearing.errors import SolverError
from market.clearing.mechanisms.rules import EPS, Market, OpenMarket
from market.clearing.solvers import lp


def _max_at(target: np.ndarray, index: np.ndarray, values: np.ndarray) -> None:
    if index.size:
        np.maximum.at(target, index, values)


def minimal_prices(m: OpenMarket, x: np.ndarray) -> np.ndarray:
    """Least tier potentials (T,), credits/GPU-hour, before the reserve is applied."""
    T, B, G = m.tier_room.size, m.bid_room.size, m.group_room.size
    tol = 1e-7 * (1.0 + float(np.abs(m.arc_price).max(initial=0.0)))
    bid_flow = np.bincount(m.arc_bid, weights=x, minlength=B)
    tier_flow = np.bincount(m.arc_tier, weights=x, minlength=T)
    capped = m.arc_capped >= 0
    group_flow = np.bincount(m.arc_capped[capped], weights=x[capped], minlength=G)
    group_tier = np.full(G, -1)
    group_tier[m.arc_capped[capped]] = m.arc_tier[capped]
    live_group = np.flatnonzero(group_tier >= 0)

    bid_base = np.where(bid_flow < m.bid_room - EPS, 0.0, -np.inf)
    tier_base = np.where(tier_flow > EPS, 0.0, -np.inf)
    used = x > EPS
    up_t = np.flatnonzero(~capped)  # bid -> tier, never saturated
    up_g = np.flatnonzero(capped)
    down_t = np.flatnonzero(~capped & used)  # tier -> bid, along used arcs
    down_g = np.flatnonzero(capped & used)
    g_open = live_group[group_flow[live_group] < m.group_room[live_group] - EPS]
    g_used = live_group[group_flow[live_group] > EPS]

    q_bid = bid_base.copy()
    q_group = np.full(G, -np.inf)
    q_tier = tier_base.copy()
    for _ in range(4 * T + 8):
        new_group = np.full(G, -np.inf)
        _max_at(new_group, m.arc_capped[up_g], q_bid[m.arc_bid[up_g]] + m.arc_price[up_g])
        new_group[g_used] = np.maximum(new_group[g_used], q_tier[group_tier[g_used]])
        new_tier = tier_base.copy()
        _max_at(new_tier, m.arc_tier[up_t], q_bid[m.arc_bid[up_t]] + m.arc_price[up_t])
        _max_at(new_tier, group_tier[g_open], new_group[g_open])
        new_bid = bid_base.copy()
        _max_at(new_bid, m.arc_bid[down_t], new_tier[m.arc_tier[down_t]] - m.arc_price[down_t])
        _max_at(new_bid, m.arc_bid[down_g], new_group[m.arc_capped[down_g]] - m.arc_price[down_g])
        with np.errstate(invalid="ignore"):  # -inf - -inf: both unreachable, unchanged
            settled = all(
                np.all((new == old) | (np.abs(new - old) <= tol))
                for new, old in ((new_bid, q_bid), (new_group, q_group), (new_tier, q_tier))
            )
        q_bid, q_group, q_tier = new_bid, new_group, new_tier
        if settled:
            return np.maximum(q_tier, 0.0)
    raise SolverError("welfare prices: the allocation is not optimal (prices did not settle)")


def least_duals(
    m: OpenMarket,
    cols: np.ndarray,
    x: np.ndarray,
    *,
    target: np.ndarray,
    arc_value: np.ndarray,
    market: Market,
) -> np.ndarray:
    """Least capacity duals (T,) of the welfare program with guarantee rows, on the optimal
    face of the LP optimum ``x``: min sum pi subject to dual feasibility and complementary
    slackness with x. Per arc e of bid b, tenant i, tier t, capped group g:
        pi_t + gamma_g + u_b - lambda_i v_e >= s_e   (= where x_e > 0)
    with a dual fixed at 0 wherever its row is slack. lambda_i is the subsidy that holds
    tenant i's guarantee; pi_t is the tier's price over the reserve."""
    a = market.arrays
    T, B, N, G = m.tier_room.size, m.bid_room.size, a.n_tenants, m.group_room.size
    tol = 1e-7 * (1.0 + float(np.abs(m.arc_price).max(initial=0.0)))
    tier_flow = np.bincount(m.arc_tier, weights=x, minlength=T)
    bid_flow = np.bincount(m.arc_bid, weights=x, minlength=B)
    c = m.arc_capped >= 0
    group_flow = np.bincount(m.arc_capped[c], weights=x[c], minlength=G)
    utility = np.bincount(a.arc_tenant, weights=arc_value * x, minlength=N)
    p = lp.Program("welfare prices")
    pi = p.variables("pi", T, hi=np.where(tier_flow >= m.tier_room - EPS, np.inf, 0.0))
    gamma = p.variables("gamma", G, hi=np.where(group_flow >= m.group_room - EPS, np.inf, 0.0))
    u = p.variables("u", B, hi=np.where(bid_flow >= m.bid_room - EPS, np.inf, 0.0))
    lam = p.variables(
        "lambda", N, hi=np.where(utility <= target + 1e-7 * (1.0 + np.abs(target)), np.inf, 0.0)
    )

    def per_arc(index: np.ndarray, n: int, weights: np.ndarray | None = None):
        return lp.incidence(index, n, weights).T.tocsr()  # (K, n)

    used = x[cols] > EPS
    p.constrain(
        "arc",
        [
            (pi, per_arc(m.arc_tier[cols], T)),
            (gamma, per_arc(m.arc_capped[cols], G)),
            (u, per_arc(m.arc_bid[cols], B)),
            (lam, per_arc(a.arc_tenant[cols], N, -arc_value[cols])),
        ],
        lo=m.arc_price[cols],
        hi=np.where(used, m.arc_price[cols] + tol, np.inf),
    )
    try:
        sol = p.maximise([(pi, -np.ones(T))])
    except SolverError:
        # Numerical trouble on a degenerate face: the capacity duals are still prices at
        # which the allocation is an equilibrium, if not the least ones.
        return np.maximum(minimal_prices_fallback(m, x), 0.0)
    return np.maximum(sol["pi"], 0.0)


def minimal_prices_fallback(m: OpenMarket, x: np.ndarray) -> np.ndarray:
    """The highest surplus on each tier among bids left short: nobody left wanting was
    outbid at the price."""
    T, B = m.tier_room.size, m.bid_room.size
    short = np.bincount(m.arc_bid, weights=x, minlength=B) < m.bid_room - EPS
    want = np.zeros(T)
    sel = short[m.arc_bid]
    np.maximum.at(want, m.arc_tier[sel], m.arc_price[sel])
    return want
