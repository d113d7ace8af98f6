"""The default policy: maximise welfare, then charge minimal equilibrium prices.

max sum_bt p_bt x_bt over the open market (capacity left after the entitlement floors),
subject to tier capacity, bid quantity and share caps. Without gang bids this is a network
LP with integral vertices, solved by column generation (transport.py). Gang bids make it a
mixed-integer problem: x_b = 0 or m_b <= x_b <= q_b, with a binary per gang bid, solved
with a time limit. When the time limit leaves no incumbent, gang bids are dropped (status
"fallback"), which keeps every hard constraint. Either way, once the gang bids are fixed the
divisible bids are re-solved exactly, so that equilibrium prices exist for them.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

import numpy as np
import scipy.sparse as sp

from . import highs
from .market import EPS, Market, OpenMarket, Outcome, open_market
from .metrics import value_matrix
from .prices import minimal_prices
from .rounding import round_whole
from .transport import solve_welfare


def _gang_milp(market: Market, *, time_limit: float) -> tuple[np.ndarray, str, float]:
    """Arc allocation (E,) of the gang bids, the status and the solver seconds."""
    om = open_market(market)
    a = market.arrays
    E, B, T = om.arc_bid.size, om.bid_room.size, om.tier_room.size
    live = om.bid_room[om.arc_bid] > EPS
    cols = np.flatnonzero(live)
    gangs = np.flatnonzero(market.is_gang & (om.bid_room > EPS))
    n_x, n_z = cols.size, gangs.size
    capped = np.unique(om.arc_capped[cols][om.arc_capped[cols] >= 0])
    grow = np.full(om.group_room.size, -1)
    grow[capped] = T + np.arange(capped.size)
    bid_row0 = T + capped.size
    gang_row = np.full(B, -1)
    gang_row[gangs] = bid_row0 + B + np.arange(n_z)  # the ">= m_b z_b" rows

    c = om.arc_capped[cols]
    x_rows = [om.arc_tier[cols], grow[c[c >= 0]], bid_row0 + om.arc_bid[cols]]
    x_cols = [np.arange(n_x), np.flatnonzero(c >= 0), np.arange(n_x)]
    in_gang = gang_row[om.arc_bid[cols]] >= 0
    x_rows.append(gang_row[om.arc_bid[cols]][in_gang])
    x_cols.append(np.flatnonzero(in_gang))
    vals = [np.ones(r.size) for r in x_rows]
    # z_b: -q_b in the quantity row, -m_b in the minimum row.
    x_rows += [bid_row0 + gangs, gang_row[gangs]]
    x_cols += [n_x + np.arange(n_z)] * 2
    vals += [-om.bid_room[gangs], -a.min_quantity[gangs]]
    n_rows = bid_row0 + B + n_z
    A = sp.csc_matrix(
        (np.concatenate(vals), (np.concatenate(x_rows), np.concatenate(x_cols))),
        shape=(n_rows, n_x + n_z),
    )
    is_gang_row = np.zeros(B, dtype=bool)
    is_gang_row[gangs] = True
    bid_hi = np.where(is_gang_row, 0.0, om.bid_room)
    sol = highs.solve(
        cost=np.concatenate([om.arc_price[cols], np.zeros(n_z)]),
        matrix=A,
        row_lo=np.concatenate([np.full(bid_row0 + B, -np.inf), np.zeros(n_z)]),
        row_hi=np.concatenate([om.tier_room, om.group_room[capped], bid_hi, np.full(n_z, np.inf)]),
        col_lo=np.zeros(n_x + n_z),
        col_hi=np.concatenate([np.full(n_x, np.inf), np.ones(n_z)]),
        integer=np.concatenate([np.full(n_x, not market.divisible), np.ones(n_z, dtype=bool)]),
        time_limit=time_limit,
        what="welfare problem with gang bids",
    )
    fixed = np.zeros(E)
    if sol.status == "no_solution":
        return fixed, "fallback", sol.seconds
    x = sol.x[:n_x] if market.divisible else np.rint(sol.x[:n_x])
    fixed[cols] = np.where(market.is_gang[om.arc_bid[cols]], x, 0.0)
    return fixed, sol.status, sol.seconds


def _without(om: OpenMarket, fixed: np.ndarray, market: Market) -> OpenMarket:
    """The divisible bids' market once the gang allocation is fixed."""
    divisible = ~market.is_gang
    keep = divisible[om.arc_bid]
    c = om.arc_capped >= 0
    return OpenMarket(
        arc_bid=om.arc_bid[keep],
        arc_tier=om.arc_tier[keep],
        arc_capped=om.arc_capped[keep],
        arc_price=om.arc_price[keep],
        bid_room=np.where(divisible, om.bid_room, 0.0),
        group_room=om.group_room
        - np.bincount(om.arc_capped[c], weights=fixed[c], minlength=om.group_room.size),
        tier_room=om.tier_room
        - np.bincount(om.arc_tier, weights=fixed, minlength=om.tier_room.size),
    )


def welfare(market: Market, params: Mapping[str, Any]) -> Outcome:
    a = market.arrays
    status, seconds = "optimal", 0.0
    full = open_market(market)
    fixed = np.zeros(a.arc_bid.size)
    if np.any(market.is_gang & (market.bid_room > EPS)):
        fixed, status, seconds = _gang_milp(market, time_limit=float(params["time_limit"]))
    om = _without(full, fixed, market)
    sol = solve_welfare(om)
    x_open = sol.x
    loss, rounding_seconds = 0.0, 0.0
    if not market.divisible:
        whole = np.rint(x_open)
        if np.abs(whole - x_open).max(initial=0.0) > 1e-6:
            start = time.perf_counter()
            whole = round_whole(
                om, x=x_open, priority=om.arc_price, gang_min=np.zeros(om.bid_room.size)
            )
            rounding_seconds = time.perf_counter() - start
            loss = float(om.arc_price @ (x_open - whole))
        x_open = whole
    prices = np.maximum(a.reserve, minimal_prices(om, x_open))
    x = market.floor_x + fixed
    x[~market.is_gang[a.arc_bid]] += x_open
    return Outcome(
        x=x,
        prices=prices,
        status=status,
        solve_seconds=seconds + sol.seconds,
        rounding_seconds=rounding_seconds,
        rounding_loss=loss,
        entitlement=a.weight,
        values=value_matrix(market),
    )
