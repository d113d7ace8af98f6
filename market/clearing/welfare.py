"""The default mechanism: maximise surplus under the guarantee, charge least equilibrium prices.

max  sum_e (p_e - r_t) x_e                       surplus over the reserve
s.t. the market's constraints (program.py)
     sum_{e of i} p_e x_e >= g_i                  the guarantee, in the tenant's own limits

Without gang bids and with the guarantees slack at the unconstrained optimum (the usual case),
this is a network LP with integral vertices, solved by column generation (colgen.py), and the
prices are the least competitive-equilibrium prices on its residual network (prices.py). When
a guarantee binds, the full program is solved (mixed-integer for whole GPUs) and the prices
are the least capacity duals of its LP relaxation on the optimal face (prices.least_duals).
Gang bids make the first solve mixed-integer; once they are fixed the divisible bids are
solved again as above, so that their prices exist. A time limit with no incumbent drops the
gang bids (status "fallback"), which keeps every hard constraint.
A price is r_t + dual; a winner pays min(price, limit).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from .colgen import solve_welfare
from .metrics import value_matrix
from .prices import least_duals, minimal_prices
from .program import guarantee_rows, market_program
from .rounding import round_whole
from .rules import EPS, Market, OpenMarket, Outcome, guarantees, open_market

MILP_COLUMNS = 600  # smaller whole-GPU programs with a binding guarantee are solved exactly


def _without(om: OpenMarket, fixed: np.ndarray, market: Market) -> OpenMarket:
    """The divisible bids' market once the gang allocation is fixed."""
    c = om.arc_capped >= 0
    return OpenMarket(
        arc_bid=om.arc_bid,
        arc_tier=om.arc_tier,
        arc_capped=om.arc_capped,
        arc_price=om.arc_price,
        bid_room=np.where(market.is_gang, 0.0, om.bid_room),
        group_room=om.group_room
        - np.bincount(om.arc_capped[c], weights=fixed[c], minlength=om.group_room.size),
        tier_room=om.tier_room
        - np.bincount(om.arc_tier, weights=fixed, minlength=om.tier_room.size),
    )


def welfare(market: Market, params: Mapping[str, Any]) -> Outcome:
    a = market.arrays
    N = a.n_tenants
    time_limit = float(params["time_limit"])
    surplus = a.arc_price - a.reserve[a.arc_tier]
    g = guarantees(market, a.arc_price)
    full = open_market(market, arc_price=surplus)
    held = np.bincount(a.arc_tenant, weights=a.arc_price * market.floor_x, minlength=N)
    status, seconds = "optimal", 0.0
    fixed = np.zeros(a.arc_bid.size)
    if np.any(market.is_gang & (market.bid_room > EPS)):
        sk = market_program(market, full, what="welfare problem with gang bids")
        guarantee_rows(sk, market, a.arc_price, g - held)
        sol = sk.program.maximise([(sk.x, surplus[sk.cols])], time_limit=time_limit)
        seconds += sol.seconds
        if sol.status == "no_solution":
            status = "fallback"
        else:
            status = sol.status
            x = sol["x"] if market.divisible else np.rint(sol["x"])
            fixed[sk.cols] = np.where(market.is_gang[a.arc_bid[sk.cols]], x, 0.0)
    held += np.bincount(a.arc_tenant, weights=a.arc_price * fixed, minlength=N)
    om = _without(full, fixed, market)
    x, prices, more, loss, fell_back = _divisible_bids(market, om, g - held, time_limit)
    seconds += more
    if fell_back:
        status = "fallback"
    return Outcome(
        x=market.floor_x + fixed + x,
        prices=a.reserve + prices,
        status=status,
        solve_seconds=seconds,
        rounding_seconds=0.0,
        rounding_loss=loss,
        entitlement=a.weight,
        values=value_matrix(market),
        arc_value=a.arc_price,
        guarantee=g,
        fair=guarantees(market, a.arc_price, fractional=True),
    )


def _divisible_bids(
    market: Market, om: OpenMarket, target: np.ndarray, time_limit: float
) -> tuple[np.ndarray, np.ndarray, float, float, bool]:
    """GPUs per arc, tier prices over the reserve, solver seconds, rounding loss, fallback."""
    a = market.arrays
    first = solve_welfare(om)
    x, seconds = first.x, first.seconds
    utility = np.bincount(a.arc_tenant, weights=a.arc_price * x, minlength=a.n_tenants)
    met = np.all(utility >= target - 1e-7 * (1.0 + np.abs(target)))
    integral = market.divisible or np.abs(x - np.rint(x)).max(initial=0.0) <= 1e-6
    if met and integral:
        x = x if market.divisible else np.rint(x)
        return x, minimal_prices(om, x), seconds, 0.0, False

    sk = market_program(market, om, what="welfare problem", gangs=False)
    guarantee_rows(sk, market, a.arc_price, target)
    objective = [(sk.x, om.arc_price[sk.cols])]
    relaxed = sk.program.maximise(objective, relax=True)
    seconds += relaxed.seconds
    x_lp = np.zeros(a.arc_bid.size)
    x_lp[sk.cols] = np.clip(relaxed["x"], 0.0, None)
    prices = least_duals(om, sk.cols, x_lp, target=target, arc_value=a.arc_price, market=market)
    if market.divisible or np.abs(x_lp - np.rint(x_lp)).max(initial=0.0) <= 1e-6:
        return (x_lp if market.divisible else np.rint(x_lp)), prices, seconds, 0.0, False
    # A vertex with binding guarantee rows has few fractional arcs: rounding them, deficits
    # first, usually keeps every guarantee; only when it does not is the MILP solved.
    rounded = round_whole(
        om,
        x=x_lp,
        arc_tenant=a.arc_tenant,
        arc_value=a.arc_price,
        guarantee=target,
        priority=lambda u: np.zeros(a.n_tenants),
        gang_min=np.zeros(a.n_bids),
    )
    got = np.bincount(a.arc_tenant, weights=a.arc_price * rounded, minlength=a.n_tenants)
    if np.all(got >= target - 1e-7 * (1.0 + np.abs(target))) and sk.cols.size > MILP_COLUMNS:
        return rounded, prices, seconds, float(om.arc_price @ (x_lp - rounded)), False
    whole = sk.program.maximise(objective, time_limit=time_limit)
    seconds += whole.seconds
    if whole.status == "no_solution":
        x = np.rint(first.x)  # the unconstrained optimum: feasible, guarantees not all held
        return x, minimal_prices(om, x), seconds, float(om.arc_price @ (x_lp - x)), True
    x = np.zeros(a.arc_bid.size)
    x[sk.cols] = np.rint(whole["x"])
    return x, prices, seconds, float(om.arc_price @ (x_lp - x)), False
