"""Weighted max-min fairness of normalised shares, then a fill of idle capacity.

Stage 1: max tau  s.t.  (u0_i + sum_{e of i} v_e x_e) / (w_i e_i) >= tau  for every tenant
with w_i > 0 and e_i > 0 (e_i: utility of an equal split, metrics.equal_split_utility),
plus bid quantity, share caps and tier capacity over the room left after the floors.
Stage 2: keep tau >= tau* and maximise the GPUs handed out, so capacity is idle only when no
acceptable bid can use it. Gang bids add a binary per bid (mixed-integer, time limit); when
a stage leaves no incumbent, gang bids are dropped and the stage is solved as an LP
(status "fallback").

Prices: a tier's price is the highest limit on it among bids left short, never below the
reserve, so that nobody left wanting was outbid at the price; winners pay min(price, limit).
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

import numpy as np
import scipy.sparse as sp

from . import highs
from .market import EPS, Market, OpenMarket, Outcome, open_market
from .metrics import equal_split_utility
from .policies_common import tenant_values
from .rounding import round_whole


def _stages(
    om: OpenMarket,
    cols: np.ndarray,
    *,
    gangs: np.ndarray,
    min_q: np.ndarray,
    tenant: np.ndarray,
    norm_v: np.ndarray,
    floor_ratio: np.ndarray,
    counted: np.ndarray,
    whole: bool,
    time_limit: float,
) -> tuple[np.ndarray, float, str, float]:
    """Arc GPUs (E,), tau*, status, solver seconds."""
    T = om.tier_room.size
    K = cols.size
    bids, b_row = np.unique(om.arc_bid[cols], return_inverse=True)
    gang_bids = np.flatnonzero(gangs[bids])
    n_z = gang_bids.size
    ten = tenant[om.arc_bid[cols]]
    counted_idx = np.flatnonzero(counted)
    t_row_of = np.full(counted.size, -1)
    t_row_of[counted_idx] = np.arange(counted_idx.size)
    c = om.arc_capped[cols]
    groups, g_row = np.unique(c[c >= 0], return_inverse=True)
    r_group, r_bid = T, T + groups.size
    r_gmin = r_bid + bids.size
    r_ten = r_gmin + n_z
    n_rows = r_ten + counted_idx.size
    tau = K + n_z
    in_t = t_row_of[ten] >= 0
    rows = [
        om.arc_tier[cols],
        r_group + g_row,
        r_bid + b_row,
        r_gmin + np.searchsorted(gang_bids, b_row[gangs[om.arc_bid[cols]]]),
        r_ten + t_row_of[ten[in_t]],
        r_bid + gang_bids,
        r_gmin + np.arange(n_z),
        r_ten + np.arange(counted_idx.size),
    ]
    cidx = [
        np.arange(K),
        np.flatnonzero(c >= 0),
        np.arange(K),
        np.flatnonzero(gangs[om.arc_bid[cols]]),
        np.flatnonzero(in_t),
        K + np.arange(n_z),
        K + np.arange(n_z),
        np.full(counted_idx.size, tau),
    ]
    vals = [
        np.ones(K),
        np.ones(int((c >= 0).sum())),
        np.ones(K),
        np.ones(cidx[3].size),
        norm_v[cols][in_t],
        -om.bid_room[bids[gang_bids]],
        -min_q[bids[gang_bids]],
        -np.ones(counted_idx.size),
    ]
    A = sp.csc_matrix(
        (np.concatenate(vals), (np.concatenate(rows), np.concatenate(cidx))),
        shape=(n_rows, K + n_z + 1),
    )
    bid_hi = om.bid_room[bids].copy()
    bid_hi[gang_bids] = 0.0
    row_lo = np.concatenate([np.full(r_gmin, -np.inf), np.zeros(n_z), -floor_ratio[counted_idx]])
    row_hi = np.concatenate(
        [om.tier_room, om.group_room[groups], bid_hi, np.full(n_z + counted_idx.size, np.inf)]
    )
    integer = np.concatenate([np.full(K, whole and n_z > 0), np.ones(n_z, bool), [False]])
    col_hi = np.concatenate([np.full(K, np.inf), np.ones(n_z), [np.inf]])
    col_lo = np.zeros(K + n_z + 1)
    seconds, status, tau_star = 0.0, "optimal", 0.0
    if counted_idx.size:
        cost = np.zeros(K + n_z + 1)
        cost[tau] = 1.0
        sol = highs.solve(
            cost=cost,
            matrix=A,
            row_lo=row_lo,
            row_hi=row_hi,
            col_lo=col_lo,
            col_hi=col_hi,
            integer=integer,
            time_limit=time_limit,
            what="maxmin problem (stage 1)",
        )
        seconds += sol.seconds
        if sol.status == "no_solution":
            return np.zeros(om.arc_bid.size), 0.0, "fallback", seconds
        status = sol.status
        tau_star = float(sol.x[tau])
        col_lo[tau] = max(0.0, tau_star - 1e-7 * max(1.0, tau_star))
    cost = np.concatenate([np.ones(K), np.zeros(n_z + 1)])
    sol = highs.solve(
        cost=cost,
        matrix=A,
        row_lo=row_lo,
        row_hi=row_hi,
        col_lo=col_lo,
        col_hi=col_hi,
        integer=integer,
        time_limit=time_limit,
        what="maxmin problem (stage 2)",
    )
    seconds += sol.seconds
    if sol.status == "no_solution":
        return np.zeros(om.arc_bid.size), 0.0, "fallback", seconds
    if sol.status != "optimal":
        status = sol.status
    x = np.zeros(om.arc_bid.size)
    x[cols] = np.clip(sol.x[:K], 0.0, None)
    if whole and n_z:
        x[cols] = np.rint(x[cols])
    return x, tau_star, status, seconds


def maxmin(market: Market, params: Mapping[str, Any]) -> Outcome:
    a = market.arrays
    N, B = a.n_tenants, a.n_bids
    values = tenant_values(market, params["values"])
    v = values[a.arc_tenant, a.arc_tier]
    fair = equal_split_utility(market, values)
    counted = (a.weight > 0) & (fair > 0)
    denom = np.where(counted, a.weight * fair, 1.0)
    u0 = np.bincount(a.arc_tenant, weights=v * market.floor_x, minlength=N)
    om = open_market(market)
    cols = np.flatnonzero(om.bid_room[om.arc_bid] > EPS)
    common = dict(
        tenant=a.bid_tenant,
        norm_v=v / denom[a.arc_tenant],
        floor_ratio=u0 / denom,
        counted=counted,
        whole=not market.divisible,
        time_limit=float(params["time_limit"]),
        min_q=a.min_quantity,
    )
    x, tau, status, seconds = _stages(om, cols, gangs=market.is_gang, **common)
    if status == "fallback":
        cols = cols[~market.is_gang[a.arc_bid[cols]]]
        x, tau, _, more = _stages(om, cols, gangs=np.zeros(B, bool), **common)
        seconds += more
    loss, rounding_seconds = 0.0, 0.0
    if not market.divisible and np.abs(x - np.rint(x)).max(initial=0.0) > 1e-6:
        start = time.perf_counter()
        ratio = (u0 + np.bincount(a.arc_tenant, weights=v * x, minlength=N)) / denom
        priority = np.where(counted, -ratio, -np.inf)[a.arc_tenant]
        got = np.bincount(a.arc_bid, weights=x, minlength=B)
        gang_min = np.where(market.is_gang & (got > EPS), a.min_quantity, 0.0)
        whole = round_whole(
            om, x=x, priority=np.nan_to_num(priority, neginf=-1e300), gang_min=gang_min
        )
        rounded = (u0 + np.bincount(a.arc_tenant, weights=v * whole, minlength=N)) / denom
        frac_min = ratio[counted].min(initial=0.0)
        loss = float(frac_min - rounded[counted].min(initial=0.0))
        x = whole
        rounding_seconds = time.perf_counter() - start
    total = market.floor_x + x
    short = np.bincount(a.arc_bid, weights=total, minlength=B) < a.quantity - EPS
    want = np.full(a.n_tiers, -np.inf)
    sel = short[a.arc_bid] & ~market.is_gang[a.arc_bid]
    np.maximum.at(want, a.arc_tier[sel], a.arc_price[sel])
    return Outcome(
        x=total,
        prices=np.maximum(a.reserve, want),
        status=status,
        solve_seconds=seconds,
        rounding_seconds=rounding_seconds,
        rounding_loss=loss,
        entitlement=a.weight,
        values=values,
    )
