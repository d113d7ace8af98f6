"""The default mechanism: maximise surplus under the guarantee, charge least equilibrium prices.

max  sum_e (p_e - r_t) x_e                       surplus over the reserve
s.t. the market's constraints (program.py)
     sum_{e of i} p_e x_e >= g_i                  the guarantee, in the tenant's own limits

Without gang bids and with the guarantees slack at the unconstrained optimum (the usual case),
this is a network LP with integral vertices, solved as a min-cost flow (flow.py; by column
generation, colgen.py, where the data are not whole milli-credits and GPUs), and the
prices are the least competitive-equilibrium prices on its residual network (prices.py).
When a guarantee binds: up to EXACT_COLUMNS arcs the full program is solved (its LP
relaxation, then mixed-integer for whole GPUs) and the prices are the least capacity duals
of the relaxation on the optimal face (prices.least_duals); above that, the tenants whose
guarantee binds get their guarantee bundles and the rest of the market is cleared around them
the same way, priced by its own least equilibrium prices (pass after pass, reusing one flow
network and solving only the bids a pass can move, resolve.py, until nobody else falls
short; a forecast lets the tenants those bundles will displace join a pass early).
Gang bids make the first solve mixed-integer; once they are fixed the divisible bids are
solved again as above, so that their prices exist. A time limit with no incumbent drops the
gang bids (status "fallback"), which keeps every hard constraint.
A price is r_t + dual; a winner pays min(price, limit).
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

import numpy as np

from market.clearing.mechanisms.guarantee import guarantee_and_fair
from market.clearing.mechanisms.rules import (
    EPS,
    Market,
    OpenMarket,
    Outcome,
    gangs_whole,
    open_market,
)
from market.clearing.outcome.metrics import value_matrix
from market.clearing.outcome.prices import least_duals, minimal_prices
from market.clearing.solvers.colgen import WelfareSolution, solve_welfare
from market.clearing.solvers.flow import WelfareNetwork, welfare_flow
from market.clearing.solvers.program import guarantee_rows, market_program, residual
from market.clearing.solvers.resolve import welfare_flow_near

EXACT_COLUMNS = 600  # programs with a binding guarantee up to this many arcs are solved exactly


def _open_welfare(om: OpenMarket, network: WelfareNetwork | None = None) -> WelfareSolution:
    """The open-market welfare problem: a min-cost flow when it is a whole-number network
    (``network``: one built before for this market or the market it was left from), else
    column generation over HiGHS LPs."""
    start = time.perf_counter()
    x = welfare_flow(om) if network is None else network.solve(om)
    if x is None:
        return solve_welfare(om)
    return WelfareSolution(x, time.perf_counter() - start, 0)


def _open_welfare_near(
    om: OpenMarket,
    network: WelfareNetwork | None,
    last: tuple[OpenMarket, np.ndarray, np.ndarray | None],
) -> tuple[WelfareSolution, np.ndarray | None]:
    """``_open_welfare`` of a market left from ``last`` (the market before, a whole optimal
    allocation of it, prices at which that is an equilibrium or None), solved on the bids
    the change can move (resolve.py); and the least prices at which its allocation is an
    equilibrium (None when it was not solved that way)."""
    start = time.perf_counter()
    near = None if network is None else welfare_flow_near(network, om, *last)
    if near is None:
        return _open_welfare(om, network), None
    return WelfareSolution(near[0], time.perf_counter() - start, 0), near[1]


def _without(om: OpenMarket, fixed: np.ndarray, market: Market) -> OpenMarket:
    """The divisible bids' market once the gang allocation is fixed."""
    rest = residual(om, fixed)
    return replace(rest, bid_room=np.where(market.is_gang, 0.0, om.bid_room))


def welfare(market: Market, params: Mapping[str, Any]) -> Outcome:
    a = market.arrays
    N = a.n_tenants
    time_limit = float(params["time_limit"])
    surplus = a.arc_price - a.reserve[a.arc_tier]
    g, bundle, fair = guarantee_and_fair(market, a.arc_price)
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
            fixed = gangs_whole(market, fixed)
    held += np.bincount(a.arc_tenant, weights=a.arc_price * fixed, minlength=N)
    om = _without(full, fixed, market)
    x, prices, more, loss, fell_back = _divisible_bids(market, om, g - held, bundle, time_limit)
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
        fair=fair,
    )


def _divisible_bids(
    market: Market, om: OpenMarket, target: np.ndarray, bundle: np.ndarray, time_limit: float
) -> tuple[np.ndarray, np.ndarray, float, float, bool]:
    """GPUs per arc, tier prices over the reserve, solver seconds, guarantee loss, fallback."""
    a = market.arrays
    start = time.perf_counter()
    network = WelfareNetwork.of(om)
    build = time.perf_counter() - start
    first = _open_welfare(om, network)
    x, seconds = first.x, first.seconds + build
    utility = np.bincount(a.arc_tenant, weights=a.arc_price * x, minlength=a.n_tenants)
    met = np.all(utility >= target - 1e-7 * (1.0 + np.abs(target)))
    integral = market.divisible or np.abs(x - np.rint(x)).max(initial=0.0) <= 1e-6
    if met and integral:
        x = x if market.divisible else np.rint(x)
        return x, minimal_prices(om, x), seconds, 0.0, False
    if np.count_nonzero(om.bid_room[om.arc_bid] > EPS) > EXACT_COLUMNS:
        # Too large for the exact program within a round (a direct LP of 100k bids takes
        # minutes): the tenants whose guarantee binds get their guarantee bundles, feasible
        # together and whole in whole-GPU mode, and the rest of the market is cleared by
        # column generation around them; a tenant that then falls short joins them.
        held = _bundles_first(market, om, bundle, target, x, network)
        if held is not None:
            x, prices, more = held
            loss = float(om.arc_price @ (first.x - x))
            return x, prices, seconds + more, loss, False

    sk = market_program(market, om, what="welfare problem", gangs=False)
    guarantee_rows(sk, market, a.arc_price, target)
    objective = [(sk.x, om.arc_price[sk.cols])]
    relaxed = sk.program.maximise(objective, relax=True, time_limit=time_limit)
    seconds += relaxed.seconds
    x_lp = np.zeros(a.arc_bid.size)
    x_lp[sk.cols] = np.clip(relaxed["x"], 0.0, None)
    prices = least_duals(om, sk.cols, x_lp, target=target, arc_value=a.arc_price, market=market)
    if market.divisible or np.abs(x_lp - np.rint(x_lp)).max(initial=0.0) <= 1e-6:
        return (x_lp if market.divisible else np.rint(x_lp)), prices, seconds, 0.0, False
    whole = sk.program.maximise(objective, time_limit=time_limit)
    seconds += whole.seconds
    if whole.status == "no_solution":
        x = np.rint(first.x)  # the unconstrained optimum: feasible, guarantees not all held
        return x, minimal_prices(om, x), seconds, float(om.arc_price @ (x_lp - x)), True
    x = np.zeros(a.arc_bid.size)
    x[sk.cols] = np.rint(whole["x"])
    return x, prices, seconds, float(om.arc_price @ (x_lp - x)), False


def _bundles_first(
    market: Market,
    om: OpenMarket,
    bundle: np.ndarray,
    target: np.ndarray,
    x0: np.ndarray,
    network: WelfareNetwork | None,
) -> tuple[np.ndarray, np.ndarray, float] | None:
    """GPUs per arc, prices over the reserve (the least equilibrium prices of the market left
    around the bundles) and solver seconds; None when the bundles do not fit (gang bids
    fixed earlier hold their GPUs)."""
    a = market.arrays
    N = a.n_tenants
    tol = 1e-7 * (1.0 + np.abs(target))
    utility = np.bincount(a.arc_tenant, weights=a.arc_price * x0, minlength=N)
    short = utility < target - tol
    order = _take_back_order(om)
    need = short | _displaced(market, om, x0, short, bundle, utility, target - tol, order)
    seconds = 0.0
    # Each pass's market is left from the one before (more bundles out): the flow solves
    # only the bids that change can move.
    last: tuple[OpenMarket, np.ndarray, np.ndarray | None] = (om, x0, None)
    for _ in range(N):
        fixed = np.where(need[a.arc_tenant], bundle, 0.0)
        rest = residual(om, fixed)
        if min(rest.tier_room.min(initial=0.0), rest.group_room.min(initial=0.0)) < -EPS:
            return None
        rest = replace(rest, tier_room=np.maximum(rest.tier_room, 0.0))
        sol, prices = _open_welfare_near(rest, network, last)
        seconds += sol.seconds
        free = sol.x if market.divisible else np.rint(sol.x)
        last = (rest, free, prices)
        x = fixed + free
        utility = np.bincount(a.arc_tenant, weights=a.arc_price * x, minlength=N)
        short = (utility < target - tol) & ~need
        if not short.any():
            return x, minimal_prices(rest, free), seconds
        need |= short | _displaced(market, rest, free, short, bundle, utility, target - tol, order)
    return None


def _take_back_order(om: OpenMarket) -> np.ndarray:
    """The arcs in the order ``_settle`` takes GPUs back in: by tier, then least surplus,
    then later bid first (the same arcs in every pass's market, so found once)."""
    return np.lexsort((-om.arc_bid, om.arc_price, om.arc_tier))


def _displaced(
    market: Market,
    rest: OpenMarket,
    free: np.ndarray,
    joining: np.ndarray,
    bundle: np.ndarray,
    utility: np.ndarray,
    floor: np.ndarray,
    order: np.ndarray,
) -> np.ndarray:
    """Tenants (N,) bool, not joining, that the joining tenants' bundles will likely push
    below ``floor`` in the next pass, so that they join now rather than one pass later.

    A forecast from the allocation ``free`` of the market ``rest``: the bundles leave that
    market and the joining tenants' bids keep what still fits in their room; then, a few
    times, on each tier the GPUs that no longer fit are taken from the winners of least
    surplus (later ids first), and each bid that lost GPUs moves them to its other tier of
    best surplus above that tier's least winning surplus (if the tier is full). Repeated
    with the tenants it finds until it finds no more. A wrong forecast costs surplus (a
    tenant takes its bundle), never a guarantee: the pass that follows checks every tenant
    again."""
    a = market.arrays
    N = a.n_tenants
    T = rest.tier_room.size
    found = np.zeros(N, dtype=bool)
    held = np.bincount(a.arc_tenant, weights=a.arc_price * free, minlength=N)
    flow = np.bincount(a.arc_bid, weights=free, minlength=a.n_bids)
    for _ in range(8):
        gone = joining | found
        take = np.where(gone[a.arc_tenant], bundle, 0.0)
        room = rest.bid_room - np.bincount(a.arc_bid, weights=take, minlength=a.n_bids)
        fits = np.clip(np.divide(room, flow, out=np.ones(a.n_bids), where=flow > EPS), 0.0, 1.0)
        x = free * np.where(gone[a.arc_tenant], fits[a.arc_bid], 1.0)
        tier_room = rest.tier_room - np.bincount(a.arc_tier, weights=take, minlength=T)
        x = _settle(rest, x, tier_room, order)
        keep = np.bincount(a.arc_tenant, weights=a.arc_price * x, minlength=N)
        new = (utility - held + keep < floor) & ~gone
        if not new.any():
            break
        found |= new
    return found


def _settle(
    rest: OpenMarket, x: np.ndarray, tier_room: np.ndarray, order: np.ndarray, rounds: int = 3
):
    """``x`` fitted into ``tier_room`` the crude way ``_displaced`` forecasts with; ``order``:
    ``_take_back_order``."""
    T = tier_room.size
    x = x.copy()
    for _ in range(rounds):
        over = np.maximum(np.bincount(rest.arc_tier, weights=x, minlength=T) - tier_room, 0.0)
        if over.max(initial=0.0) <= EPS:
            break
        won = order[((x > EPS) & (over[rest.arc_tier] > EPS))[order]]
        tier = rest.arc_tier[won]
        before = np.cumsum(x[won]) - x[won]
        starts = np.searchsorted(tier, tier)  # first winner of the same tier (sorted by tier)
        lost = np.clip(over[tier] - (before - before[starts]), 0.0, x[won])
        x[won] -= lost
        out = np.zeros(x.size)
        out[won] = lost
        # Where a lost GPU can go: a tier with room, or above the least surplus winning there.
        winning = order[(x > EPS)[order]]  # by tier, least surplus first
        tiers = rest.arc_tier[winning]
        first = np.searchsorted(tiers, np.arange(T))
        least = np.full(T, np.inf)
        found = first < tiers.size
        found[found] = tiers[first[found]] == np.flatnonzero(found)
        least[found] = rest.arc_price[winning[first[found]]]
        full = np.bincount(rest.arc_tier, weights=x, minlength=T) >= tier_room - EPS
        bar = np.where(full, least, 0.0)
        moving = np.bincount(rest.arc_bid, weights=out, minlength=rest.bid_room.size)
        to = np.flatnonzero(
            (moving[rest.arc_bid] > EPS) & (out <= EPS) & (rest.arc_price > bar[rest.arc_tier])
        )
        gain = rest.arc_price[to] - bar[rest.arc_tier[to]]
        to = to[np.lexsort((-gain, rest.arc_bid[to]))]
        to = to[np.r_[True, rest.arc_bid[to][1:] != rest.arc_bid[to][:-1]]] if to.size else to
        x[to] += moving[rest.arc_bid[to]]
    return x
