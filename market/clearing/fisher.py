"""Fisher market: Eisenberg-Gale proportional fairness with budgets.

max  sum_i B_i log u_i,  u_i = u0_i + sum_{e of i} v_e x_e
s.t. bid quantity, share caps, tier capacity (over the room left after the floors), x >= 0

B_i is the tenant's budget, capped by the most it could spend (its bids' quantity times
their highest limit), which is also the budget when none is set. u0_i is the value of the
tenant's floor reservation. Prices are the capacity duals: with B_i in credits per hour the
dual of a tier is in credits per GPU-hour (the objective is scaled by 1 / sum B for the
solver, so the dual is scaled back). A mixed-integer conic solver is not available, so gang
bids are relaxed, then fixed: a gang bid that got at least its minimum keeps it as a lower
bound, the others are dropped, and the problem is solved again.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

import cvxpy as cp
import numpy as np
import scipy.sparse as sp

from .errors import SolverError
from .market import EPS, Market, OpenMarket, Outcome, open_market
from .policies_common import tenant_values
from .rounding import round_whole

# The objective is a budget-weighted mean of logs (weights sum to 1), so a duality gap of
# 1e-6 relative is far below what one whole GPU changes. At the default 1e-8 the solver
# stalls near 1e-7 on 100k-bid instances and ends "almost solved", which we must refuse.
CLARABEL_OPTIONS = {"tol_gap_abs": 1e-7, "tol_gap_rel": 1e-6}


def _incidence(rows: np.ndarray, n_rows: int, weights: np.ndarray | None = None) -> sp.csr_matrix:
    cols = np.arange(rows.size)
    data = np.ones(rows.size) if weights is None else weights
    return sp.csr_matrix((data, (rows, cols)), shape=(n_rows, rows.size))


def _solve_eg(
    om: OpenMarket,
    cols: np.ndarray,
    *,
    tenant: np.ndarray,
    v: np.ndarray,
    budget: np.ndarray,
    u0: np.ndarray,
    gang_min: np.ndarray,
) -> tuple[np.ndarray, np.ndarray, float]:
    """Arc GPUs (E,), tier duals (T,) per unit of normalised budget, solver seconds."""
    T = om.tier_room.size
    buyers, t_row = np.unique(tenant[om.arc_bid[cols]], return_inverse=True)
    bids, b_row = np.unique(om.arc_bid[cols], return_inverse=True)
    x = cp.Variable(cols.size, nonneg=True)
    scale = float(v[cols].max())
    utility = u0[buyers] / scale + _incidence(t_row, buyers.size, v[cols] / scale) @ x
    weight = budget[buyers] / budget[buyers].sum()
    per_bid = _incidence(b_row, bids.size) @ x
    capacity = _incidence(om.arc_tier[cols], T) @ x <= om.tier_room
    constraints = [per_bid <= om.bid_room[bids], capacity]
    kept = gang_min[bids] > 0
    if kept.any():
        constraints.append(per_bid[np.flatnonzero(kept)] >= gang_min[bids][kept])
    c = om.arc_capped[cols]
    if (c >= 0).any():
        groups, g_row = np.unique(c[c >= 0], return_inverse=True)
        in_group = _incidence(g_row, groups.size)
        constraints.append(in_group @ x[np.flatnonzero(c >= 0)] <= om.group_room[groups])
    problem = cp.Problem(cp.Maximize(weight @ cp.log(utility)), constraints)
    start = time.perf_counter()
    try:
        problem.solve(solver=cp.CLARABEL, **CLARABEL_OPTIONS)
    except cp.error.SolverError as exc:
        raise SolverError(f"fisher problem: the conic solver failed ({exc})") from exc
    seconds = time.perf_counter() - start
    if problem.status != cp.OPTIMAL:
        raise SolverError(f"fisher problem: the solver stopped with status {problem.status!r}")
    out = np.zeros(om.arc_bid.size)
    out[cols] = np.clip(x.value, 0.0, None)
    return out, np.maximum(np.asarray(capacity.dual_value).ravel(), 0.0), seconds


def eg_objective(budget: np.ndarray, utility: np.ndarray) -> float:
    counted = budget > 0
    return float(budget[counted] @ np.log(np.maximum(utility[counted], 1e-300)))


def fisher(market: Market, params: Mapping[str, Any]) -> Outcome:
    a = market.arrays
    N, B = a.n_tenants, a.n_bids
    values = tenant_values(market, params["values"])
    v = values[a.arc_tenant, a.arc_tier]
    best = np.zeros(B)
    np.maximum.at(best, a.arc_bid, a.arc_price)
    most = np.bincount(a.bid_tenant, weights=a.quantity * best, minlength=N)
    budget = np.where(np.isnan(a.budget), most, np.minimum(np.nan_to_num(a.budget), most))
    u0 = np.bincount(a.arc_tenant, weights=v * market.floor_x, minlength=N)
    om = open_market(market)
    # Only arcs that can carry a GPU enter: a log term whose utility is forced to 0 has no
    # optimum, so a tenant with nothing obtainable is left out of the objective instead.
    open_group = (om.arc_capped < 0) | (om.group_room[np.maximum(om.arc_capped, 0)] > EPS)
    cols = np.flatnonzero(
        (v > 0)
        & (budget[a.arc_tenant] > 0)
        & (om.bid_room[om.arc_bid] > EPS)
        & (om.tier_room[om.arc_tier] > EPS)
        & open_group
    )
    x = np.zeros(a.arc_bid.size)
    duals = np.zeros(a.n_tiers)
    seconds = 0.0
    gang_min = np.zeros(B)
    if cols.size:
        x, duals, seconds = _solve_eg(
            om, cols, tenant=a.bid_tenant, v=v, budget=budget, u0=u0, gang_min=gang_min
        )
        if market.is_gang.any():
            got = np.bincount(a.arc_bid, weights=x, minlength=B)
            keep = market.is_gang & (got >= a.min_quantity - 1e-6)
            gang_min = np.where(keep, a.min_quantity, 0.0)
            cols = cols[~(market.is_gang & ~keep)[a.arc_bid[cols]]]
            x = np.zeros(a.arc_bid.size)
            if cols.size:
                x, duals, more = _solve_eg(
                    om, cols, tenant=a.bid_tenant, v=v, budget=budget, u0=u0, gang_min=gang_min
                )
                seconds += more
    prices = np.maximum(a.reserve, duals * budget[budget > 0].sum())
    loss, rounding_seconds = 0.0, 0.0
    if not market.divisible:
        start = time.perf_counter()
        utility = u0 + np.bincount(a.arc_tenant, weights=v * x, minlength=N)
        marginal = np.divide(budget, utility, out=np.zeros(N), where=utility > 0)
        whole = round_whole(om, x=x, priority=marginal[a.arc_tenant] * v, gang_min=gang_min)
        rounded = u0 + np.bincount(a.arc_tenant, weights=v * whole, minlength=N)
        loss = eg_objective(budget, utility) - eg_objective(budget, rounded)
        x = whole
        rounding_seconds = time.perf_counter() - start
    return Outcome(
        x=market.floor_x + x,
        prices=prices,
        status="optimal",
        solve_seconds=seconds,
        rounding_seconds=rounding_seconds,
        rounding_loss=loss,
        entitlement=budget,
        values=values,
    )
