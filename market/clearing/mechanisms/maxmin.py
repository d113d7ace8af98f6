"""Weighted max-min fairness of normalised shares, then a Pareto fill.

e_i: the value to tenant i of its weighted equal split (fractional shares;
guarantee.guarantee_values),
g_i: its guarantee (the same, shares floored to whole GPUs in whole-GPU mode). u_i = sum of
v_e x_e over its arcs, v from the tenant values (values.tenant_values).

Stage 1: max tau  s.t.  u_i >= tau e_i  (every tenant with e_i > 0),  u_i >= g_i,
         and the market's constraints (program.py). tau is not capped at 1: when tenants
         value tiers differently, trading tiers lets every one of them beat its split
         (heterogeneity-aware max-min).
Stage 2: keep tau >= tau*, maximise sum_i u_i: the total value, so no reallocation can raise
         one tenant's value without lowering another's (Pareto fill).

Whole GPUs: the program is mixed-integer up to ``MILP_COLUMNS`` arcs (time limit; its
incumbent when the limit is reached). Stage 1 is skipped when more tenants count than there
are GPUs (tau* is then 0, which branch and bound would spend its time limit proving). Above
``MILP_COLUMNS`` arcs, or with no incumbent, the LP relaxation is rounded in max-min priority
(rounding.py) and gang bids are kept only where the relaxation gave them their minimum
(status "rounded", or "fallback" when no incumbent was found).
Prices: a tier's price is the highest limit on it among bids left short, never below the
reserve, so that nobody left wanting was outbid at the price; winners pay min(price, limit).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import Any

import numpy as np

from market.clearing.errors import SolverError
from market.clearing.mechanisms.guarantee import guarantee_values
from market.clearing.mechanisms.pools import on_pools
from market.clearing.mechanisms.rules import (
    EPS,
    Market,
    OpenMarket,
    Outcome,
    gangs_whole,
    open_market,
    unique_inverse,
)
from market.clearing.mechanisms.values import tenant_values
from market.clearing.outcome.rounding import round_whole
from market.clearing.solvers import eg, highs, lp
from market.clearing.solvers.program import (
    Skeleton,
    guarantee_rows,
    market_program,
    residual,
    utility_rows,
)

MILP_COLUMNS = 600  # whole-GPU programs up to this many arcs are solved exactly
# A bid stage 2's interior point puts all but this share of its room on one arc, and no more
# than this share on any other, is settled there while the rest is solved (_settled_first).
SETTLED = 1e-3
SETTLE_ROUNDS = 3
# From this many arcs stage 2's LP is begun from eg's interior point of it (crossover, then the
# simplex method: highs.solve's start) rather than by HiGHS's own interior point.
STRUCTURED_ARCS = 2_000


def _stages(
    sk: Skeleton,
    *,
    v: np.ndarray,
    e: np.ndarray,
    g: np.ndarray,
    held: np.ndarray,
    market: Market,
    om: OpenMarket,
    time_limit: float,
    relax: bool,
) -> tuple[np.ndarray, float, str, float]:
    """Arc GPUs over sk.cols (``sk`` built on ``om``), tau*, status, solver seconds."""
    p = sk.program
    tau = _fair_rows(sk, market, v=v, e=e, g=g, held=held)
    counted = np.flatnonzero(e > EPS)
    seconds, tau_star, status = 0.0, 0.0, "optimal"
    first: lp.Solution | None = None
    fractional = relax or market.divisible
    # With whole GPUs and more tenants to count than GPUs, someone gets none: tau* = 0, and
    # a mixed-integer search would only spend its time limit proving it.
    hopeless = not fractional and counted.size > market.tier_room.sum()
    common = dict(v=v, e=e, g=g, held=held, market=market, om=om, relax=relax)
    if counted.size and not hopeless:
        bound = _tau_bound(sk, v=v, e=e, held=held, market=market)
        if fractional and bound <= 1.0 / (1.0 - 1e-9):
            tau_star = 1.0  # tau >= 1 is always feasible (_tau_bound)
        else:
            if fractional and np.isfinite(bound):
                # Stage 2 at the bound: an optimal answer there proves tau* = bound, as tau*
                # is never above it, and saves stage 1.
                p.bounds(tau, lo=_tau_floor(bound))
                x, _, spent = _stage_two(
                    sk, tau=bound, time_limit=time_limit, settled_only=True, **common
                )
                if x is not None:
                    return x, bound, "optimal", spent
                # Not proven there (the bound may not be feasible): stage 1 finds tau*.
                seconds, time_limit = spent, max(time_limit - spent, 1e-3)
                p.bounds(tau, lo=0.0)
            # Only tau* is kept from stage 1, so its LP needs no vertex (no crossover).
            first = p.maximise([(tau, 1.0)], time_limit=time_limit, relax=relax, vertex=False)
            seconds += first.seconds
            if first.status == "no_solution":
                return np.zeros(sk.cols.size), 0.0, "fallback", seconds
            status = first.status
            tau_star = float(first["tau"][0])
        p.bounds(tau, lo=_tau_floor(tau_star))
    x, second, more = _stage_two(sk, tau=tau_star, time_limit=time_limit, after=first, **common)
    if x is None:
        return np.zeros(sk.cols.size), 0.0, "fallback", seconds + more
    return x, tau_star, status if second == "optimal" else second, seconds + more


def _stage_two(
    sk: Skeleton,
    *,
    tau: float,
    v: np.ndarray,
    e: np.ndarray,
    g: np.ndarray,
    held: np.ndarray,
    market: Market,
    om: OpenMarket,
    time_limit: float,
    relax: bool,
    settled_only: bool = False,
    after: lp.Solution | None = None,
) -> tuple[np.ndarray | None, str, float]:
    """Stage 2 with tau kept at ``tau`` (its bound on the program already set): arc GPUs
    over sk.cols (None when no incumbent was found), the solver's status, seconds.
    ``settled_only``: only by ``_settled_first`` from eg's interior point, which proves the
    answer optimal; None where that does not end optimal (or is not tried). ``after``:
    stage 1's solution, whose optimal basis (tau at tau*, which the bound keeps) starts the
    simplex method when eg's interior point is not there to start from."""
    start, began = None, time.perf_counter()
    floors = dict(v=v, e=e, g=g, held=held, tau=_tau_floor(tau))
    if relax or market.divisible:
        start = _interior_start(sk, market, **floors, time_limit=time_limit)
    if settled_only and (start is None or not _meets_floors(start, sk, market, **floors)):
        # eg's guarantee rows are elastic: a point short of its floors (by 100 % on the
        # instances measured, against 1e-8 at most where they can be met) says tau is not
        # feasible, and crossover would only find that out at length.
        return None, "optimal", time.perf_counter() - began
    settled = None
    if start is not None:
        left = max(time_limit - (time.perf_counter() - began), 1e-3)
        settled = _settled_first(sk, market, om, start, **floors, relax=relax, time_limit=left)
    spent = time.perf_counter() - began
    if settled is not None or settled_only:
        return settled, "optimal", spent
    basis = None
    if start is None and after is not None and after.basis is not None:
        # Stage 2 has stalled in eg's interior point where tau* leaves its floors no room (a
        # few large tenants): the simplex method from stage 1's vertex, 4 s where HiGHS's
        # interior point took 15 s at 100k bids (docs/clearing.md).
        basis = after.basis(highs.START_SHARE * max(time_limit - spent, 1e-3))
        spent = time.perf_counter() - began
    second = sk.program.maximise(
        [(sk.x, v[sk.cols])],
        time_limit=max(time_limit - spent, 1e-3),
        relax=relax,
        start=start,
        basis=basis,
    )
    x = None if second.status == "no_solution" else np.clip(second["x"], 0.0, None)
    return x, second.status, spent + second.seconds


def _meets_floors(
    start: lp.Start,
    sk: Skeleton,
    market: Market,
    *,
    v: np.ndarray,
    e: np.ndarray,
    g: np.ndarray,
    held: np.ndarray,
    tau: float,
) -> bool:
    """Whether eg's point ``start`` gives every tenant its stage-2 floor, max(tau e_i, g_i),
    to 1e-6 of it."""
    x = np.asarray(start.values["x"])
    tenant = market.arrays.arc_tenant[sk.cols]
    u = held + np.bincount(tenant, weights=v[sk.cols] * x, minlength=held.size)
    floor = _floors(e, g, tau)
    return bool(np.all(u >= floor - 1e-6 * np.maximum(floor, 1.0)))


def _fair_rows(
    sk: Skeleton, market: Market, *, v: np.ndarray, e: np.ndarray, g: np.ndarray, held: np.ndarray
) -> lp.Block:
    """tau, and the rows u_i >= tau e_i (every tenant with e_i > 0) and u_i >= g_i, less
    what each tenant already holds (``held``), on the skeleton's program."""
    counted = np.flatnonzero(e > EPS)
    U = utility_rows(market, sk.cols, v)
    tau = sk.program.variables("tau", 1)
    sk.program.constrain(
        "share", [(sk.x, U[counted]), (tau, -e[counted][:, None])], lo=-held[counted]
    )
    guarantee_rows(sk, market, v, g - held)
    return tau


def _settled_first(
    sk: Skeleton,
    market: Market,
    om: OpenMarket,
    start: lp.Start,
    *,
    v: np.ndarray,
    e: np.ndarray,
    g: np.ndarray,
    held: np.ndarray,
    tau: float,
    relax: bool,
    time_limit: float,
) -> np.ndarray | None:
    """Stage 2's optimal vertex (arc GPUs over sk.cols, ``sk`` built on ``om``) found on the
    bids its interior point leaves unsettled; None when that does not end optimal (the caller solves it whole).

    A bid is settled when the point puts its whole room on one arc (within SETTLED of it)
    and next to nothing on its others: at 100k bids of the benchmark 55% of the bids, and
    the point and the LP's vertex agreed on all but 6 of them. Those bids keep that arc,
    full, as GPUs their tenant holds (not a tenant left with settled bids only that would
    then fall short of its floor); the LP of the rest, its share and guarantee rows less
    what the settled bids give, is solved from the same point. Its tier prices pi_t and
    tenant duals lambda_i then price each settled bid: with mu_b = (1 + lambda_i) v_e - pi_t
    on its arc e, mu_b >= 0 and no other arc of the bid above it, they extend the LP's duals
    to a dual solution of the whole of stage 2 in complementary slackness with the
    allocation put together, so that allocation is optimal for it, and a vertex of it (each
    settled arc at its bid's bound). A settled bid those duals price otherwise joins the
    rest, which is solved again from where it ended, for SETTLE_ROUNDS rounds."""
    a = market.arrays
    bid = a.arc_bid[sk.cols]
    room = om.bid_room[bid]
    x_at, mu_at, pi_at, share_at, floor_at = _point_over_all(sk, market, start, g=g, held=held)
    full, settled = _settled_bids(sk, market, x_at, room, v=v, e=e, g=g, held=held, tau=tau)
    counted = np.flatnonzero(e > EPS)
    tol = highs.DUAL_TOL * np.maximum(1.0, np.abs(v))
    began = time.perf_counter()
    for _ in range(SETTLE_ROUNDS):
        on = full & settled[bid]
        rest, still = _unsettled_program(
            sk, market, om, on, room, v=v, e=e, g=g, held=held, tau=tau
        )
        rest_bids, _ = unique_inverse(a.arc_bid[rest.cols])
        begun = _start_of_rest(rest, rest_bids, still, x_at, mu_at, pi_at, share_at, floor_at)
        left = max(time_limit - (time.perf_counter() - began), 1e-3)
        try:
            sol = rest.program.maximise(
                [(rest.x, v[rest.cols])], time_limit=left, relax=relax, start=begun
            )
        except SolverError:
            return None
        if sol.status != "optimal":
            return None
        x_at[rest.cols] = np.clip(sol["x"], 0.0, None)
        pi_at, share_at = np.asarray(sol.dual("capacity")), np.asarray(sol.dual("share"))
        mu_at[rest_bids] = sol.dual("quantity")
        floor_at[:] = 0.0
        floor_at[still] = sol.dual("guarantee")
        duals = (pi_at, share_at, floor_at)
        mu, wrong = _mispriced_settled(sk, market, on, settled, v, tol, counted, *duals)
        if not wrong.any():
            return np.where(on, room, np.where(settled[bid], 0.0, x_at[sk.cols]))
        settled &= ~wrong
        mu_at[wrong] = np.maximum(mu[wrong], 0.0)
    return None


def _point_over_all(
    sk: Skeleton, market: Market, start: lp.Start, *, g: np.ndarray, held: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(x over every arc, mu over every bid, pi, share and floor duals over every row):
    the interior point ``start``, kept whole so each round's answer can move it."""
    a = market.arrays
    N, E = a.n_tenants, a.arc_bid.size
    bid = a.arc_bid[sk.cols]
    x_at = np.zeros(E)
    x_at[sk.cols] = start.values["x"]
    mu_at = np.zeros(a.n_bids)
    bids, _ = unique_inverse(bid)
    mu_at[bids] = start.duals["quantity"]
    pi_at = np.asarray(start.duals["capacity"], dtype=float)
    share_at = np.asarray(start.duals["share"], dtype=float)
    floor_at = np.zeros(N)
    floor_at[g - held > EPS] = start.duals["guarantee"]
    return x_at, mu_at, pi_at, share_at, floor_at


def _settled_bids(
    sk: Skeleton,
    market: Market,
    x_at: np.ndarray,
    room: np.ndarray,
    *,
    v: np.ndarray,
    e: np.ndarray,
    g: np.ndarray,
    held: np.ndarray,
    tau: float,
) -> tuple[np.ndarray, np.ndarray]:
    """(full over sk.cols, settled over bids): the arcs the point fills, and the bids whose
    whole room is on one of them, less those of a tenant that would then fall short of its
    floor with settled bids only."""
    a = market.arrays
    N = a.n_tenants
    bid = a.arc_bid[sk.cols]
    full = x_at[sk.cols] >= (1.0 - SETTLED) * room
    busy = np.bincount(bid, weights=x_at[sk.cols] > SETTLED * room, minlength=a.n_bids)
    settled = np.zeros(a.n_bids, dtype=bool)
    settled[bid[full]] = True
    settled &= busy == 1
    floor = _floors(e, g, tau)
    open_bid = np.bincount(a.bid_tenant[bid[~settled[bid]]], minlength=N) > 0
    worth = np.where(full & settled[bid], v[sk.cols] * room, 0.0)
    reach = held + np.bincount(a.arc_tenant[sk.cols], weights=worth, minlength=N)
    settled &= ~(~open_bid & (reach < floor))[a.bid_tenant]
    return full, settled


def _unsettled_program(
    sk: Skeleton,
    market: Market,
    om: OpenMarket,
    on: np.ndarray,
    room: np.ndarray,
    *,
    v: np.ndarray,
    e: np.ndarray,
    g: np.ndarray,
    held: np.ndarray,
    tau: float,
) -> tuple[Skeleton, np.ndarray]:
    """(the LP of the bids not settled, its fair rows less what the settled arcs ``on``
    give; the tenants still below their guarantee)."""
    a = market.arrays
    N, E = a.n_tenants, a.arc_bid.size
    gpus = np.zeros(E)
    gpus[sk.cols[on]] = room[on]
    more = held + np.bincount(a.arc_tenant, weights=v * gpus, minlength=N)
    rest = market_program(market, residual(om, gpus), what="maxmin problem (unsettled bids)")
    rest.program.bounds(_fair_rows(rest, market, v=v, e=e, g=g, held=more), lo=tau)
    still = np.flatnonzero(g - more > EPS)
    return rest, still


def _start_of_rest(
    rest: Skeleton,
    rest_bids: np.ndarray,
    still: np.ndarray,
    x_at: np.ndarray,
    mu_at: np.ndarray,
    pi_at: np.ndarray,
    share_at: np.ndarray,
    floor_at: np.ndarray,
) -> lp.Start:
    """The point kept over every arc and row, cut to the LP of the rest's columns and rows."""
    return lp.Start(
        values={"x": x_at[rest.cols]},
        duals={
            "capacity": pi_at,
            "quantity": mu_at[rest_bids],
            "share": share_at,
            "guarantee": floor_at[still],
        },
    )


def _mispriced_settled(
    sk: Skeleton,
    market: Market,
    on: np.ndarray,
    settled: np.ndarray,
    v: np.ndarray,
    tol: np.ndarray,
    counted: np.ndarray,
    pi: np.ndarray,
    share: np.ndarray,
    floor: np.ndarray,
) -> tuple[np.ndarray, np.ndarray]:
    """(mu over bids, wrong over bids): each settled bid's price mu_b = (1 + lambda_i) v_e
    - pi_t on its arc, and the settled bids it does not hold for (another arc above it, or
    mu_b < 0)."""
    a = market.arrays
    bid = a.arc_bid[sk.cols]
    lam = np.zeros(a.n_tenants)
    lam[counted] -= share  # a >= row of a maximisation: its dual is <= 0
    lam -= floor
    gain = (1.0 + lam[a.arc_tenant]) * v - pi[a.arc_tier]
    mu = np.full(a.n_bids, -np.inf)
    mu[bid[on]] = gain[sk.cols[on]]
    wrong = np.zeros(a.n_bids, dtype=bool)
    wrong[bid[(gain[sk.cols] > mu[bid] + tol[sk.cols]) & ~on]] = True
    wrong |= mu < -highs.DUAL_TOL * np.maximum(1.0, np.abs(mu))
    wrong &= settled
    return mu, wrong


def _prices(market: Market, x: np.ndarray) -> np.ndarray:
    """Each tier's price: the best limit there of a divisible bid left short by ``x`` (E,),
    and at least the reserve."""
    a = market.arrays
    short = np.bincount(a.arc_bid, weights=x, minlength=a.n_bids) < a.quantity - EPS
    want = np.full(a.n_tiers, -np.inf)
    sel = short[a.arc_bid] & ~market.is_gang[a.arc_bid]
    np.maximum.at(want, a.arc_tier[sel], a.arc_price[sel])
    return np.maximum(a.reserve, want)


def _floors(e: np.ndarray, g: np.ndarray, tau: float) -> np.ndarray:
    """Each tenant's stage-2 floor: max(tau e_i, g_i), e_i counted where it is above 0."""
    return np.maximum(np.where(e > EPS, tau * e, 0.0), g)


def _tau_floor(tau_star: float) -> float:
    """The bound stage 2 keeps tau at: tau* less 1e-7 of it, for the solver's tolerance."""
    return max(0.0, tau_star - 1e-7 * max(1.0, tau_star))


def _interior_start(
    sk: Skeleton,
    market: Market,
    *,
    v: np.ndarray,
    e: np.ndarray,
    g: np.ndarray,
    held: np.ndarray,
    tau: float,
    time_limit: float,
) -> lp.Start | None:
    """Stage 2's LP at an interior point near its optimum (eg.interior), as a start for
    crossover (highs.solve); None below STRUCTURED_ARCS columns, with gangs or share caps
    (not in eg's program), or when the interior point stops short.

    eg's program is stage 2 with tau at its bound: u_i >= max(tau e_i, g_i), each tenant's
    values in units of its best (as fisher's), weighted by that unit so that the objective
    is sum_i u_i / (the sum of the units). Its duals are turned back into the LP's: the
    tier and bid rows' times that sum, a tenant's floor dual onto whichever of its share
    and guarantee rows is the floor."""
    if (
        sk.cols.size < STRUCTURED_ARCS
        or sk.has_gangs
        or market.capped[market.arc_group[sk.cols]].any()
    ):
        return None
    a = market.arrays
    bids, b_row = unique_inverse(a.arc_bid[sk.cols])
    tenants, t_row = np.unique(a.arc_tenant[sk.cols], return_inverse=True)
    if tenants.size * market.tier_room.size**2 > eg.MAX_BLOCK:
        return None
    scale = np.zeros(tenants.size)
    np.maximum.at(scale, t_row, v[sk.cols])
    scale[scale <= 0] = 1.0
    counted = e > EPS
    share_is_floor = counted & (tau * e >= g)
    floor = np.where(share_is_floor, tau * e, g)[tenants]
    point = eg.interior(
        eg.Program(
            arc_bid=b_row,
            arc_tier=a.arc_tier[sk.cols],
            value=v[sk.cols] / scale[t_row],
            bid_room=market.bid_room[bids],
            bid_buyer=np.searchsorted(tenants, a.bid_tenant[bids]),
            weight=scale / scale.sum(),
            held=held[tenants] / scale,
            floor=np.where(floor - held[tenants] > EPS, floor / scale, 0.0),
            capacity=market.tier_room,
            linear=True,
        ),
        time_limit=time_limit,
    )
    if point is None:
        return None
    units = scale.sum()
    floor_dual = np.zeros(a.n_tenants)
    floor_dual[tenants] = -units * point.lam / scale  # a >= row of a maximisation
    duals = {
        "capacity": units * point.pi,
        "quantity": units * point.mu,
        "share": np.where(share_is_floor, floor_dual, 0.0)[counted],
        "guarantee": np.where(share_is_floor, 0.0, floor_dual)[g - held > EPS],
    }
    return lp.Start(values={"x": np.clip(point.x, 0.0, None)}, duals=duals)


def _tau_bound(
    sk: Skeleton, *, v: np.ndarray, e: np.ndarray, held: np.ndarray, market: Market
) -> float:
    """An upper bound on stage 1's tau* (fractional GPUs), and at least 1.

    tau >= 1 is always feasible: the tenants' fractional equal-split bundles (the bundles
    that define e_i) fit together, as the shares of a tier sum to at most its capacity, and
    they meet every guarantee (g_i <= e_i). And no counted tenant can get more than its whole
    remaining demand valued at its best tier for each bid (``most``), so tau* is at most the
    least most_i / e_i. That bound is 1 in large rounds where some tenant's bid or two fit
    in its split (stage 1 is then saved); where capacity is scarce (a third of the demand)
    it was tau* itself on every part measured, the tenant of least demand for its split
    getting all of it (docs/clearing.md), and stage 2 run at it proves that and saves
    stage 1.
    """
    a = market.arrays
    best = np.zeros(a.n_bids)
    np.maximum.at(best, a.arc_bid[sk.cols], v[sk.cols])
    most = held + np.bincount(a.bid_tenant, weights=best * market.bid_room, minlength=a.n_tenants)
    counted = e > EPS
    return max(1.0, float((most[counted] / e[counted]).min(initial=np.inf)))


def share_priority(held: np.ndarray, denom: np.ndarray) -> Callable[[np.ndarray], np.ndarray]:
    """Rounding's priority (rounding.round_whole, higher first): the lowest share ratio
    (held + utility) / e_i first; a tenant not counted (``denom`` infinite: no share) after
    every tenant that is, as max-min fairness does not count it."""
    counted = np.isfinite(denom)
    return lambda utility: np.where(counted, -(utility + held) / denom, -np.inf)


def _worst_ratio(
    x: np.ndarray, held: np.ndarray, v: np.ndarray, denom: np.ndarray, market: Market
) -> float:
    """The smallest u_i / e_i among the tenants counted (0 when none is)."""
    a = market.arrays
    utility = held + np.bincount(a.arc_tenant, weights=v * x, minlength=a.n_tenants)
    ratios = (utility / denom)[np.isfinite(denom)]
    return float(ratios.min()) if ratios.size else 0.0


def maxmin(market: Market, params: Mapping[str, Any]) -> Outcome:
    """The mechanism, on the market with each tenant's interchangeable bids pooled where
    that makes it much smaller (pools.py), its awards then spread over the bids."""
    out = on_pools(market, _maxmin, params)
    return replace(out, prices=_prices(market, out.x))


def _maxmin(market: Market, params: Mapping[str, Any]) -> Outcome:
    a = market.arrays
    N, B = a.n_tenants, a.n_bids
    time_limit = float(params["time_limit"])
    values = tenant_values(market, params["values"])
    v = values[a.arc_tenant, a.arc_tier]
    g, e = guarantee_values(market, values)
    held = np.bincount(a.arc_tenant, weights=v * market.floor_x, minlength=N)
    om = open_market(market)
    common = dict(v=v, e=e, g=g, held=held, market=market, om=om, time_limit=time_limit)

    sk = market_program(market, om, what="maxmin problem")
    exact = market.divisible or sk.cols.size <= MILP_COLUMNS
    xs, tau, status, seconds = _stages(sk, relax=not exact, **common)
    x = np.zeros(a.arc_bid.size)
    if status == "fallback" or not exact:
        if status == "fallback":
            sk = market_program(market, om, what="maxmin problem", gangs=False)
            xs, tau, _, more = _stages(sk, relax=True, **common)
            seconds += more
        x[sk.cols] = xs
    else:
        x[sk.cols] = xs if market.divisible else np.rint(xs)
        x = gangs_whole(market, x)
    loss, rounding_seconds = 0.0, 0.0
    denom = np.where(e > EPS, e, np.inf)
    if exact and not market.divisible and status != "fallback":
        # What whole GPUs cost: the fractional optimum's worst ratio against the whole one.
        relaxed = market_program(market, om, what="maxmin problem (relaxed)")
        _, tau_lp, _, more = _stages(relaxed, relax=True, **common)
        seconds += more
        loss = max(0.0, tau_lp - _worst_ratio(x, held, v, denom, market))
    if not market.divisible and np.abs(x - np.rint(x)).max(initial=0.0) > 1e-6:
        start = time.perf_counter()
        got = np.bincount(a.arc_bid, weights=x, minlength=B)
        gang_min = np.where(market.is_gang & (got >= a.min_quantity - 1e-6), a.min_quantity, 0.0)
        if market.is_gang.any():
            x[market.is_gang[a.arc_bid] & (gang_min[a.arc_bid] == 0)] = 0.0
        whole = round_whole(
            om,
            x=x,
            arc_tenant=a.arc_tenant,
            arc_value=v,
            guarantee=g - held,
            priority=share_priority(held, denom),
            gang_min=gang_min,
            lowest_first=True,
        )
        loss = _worst_ratio(x, held, v, denom, market) - _worst_ratio(whole, held, v, denom, market)
        x = whole
        rounding_seconds = time.perf_counter() - start
        if status == "optimal" and not exact:
            status = "rounded"
    total = market.floor_x + x
    return Outcome(
        x=total,
        prices=_prices(market, total),
        status=status,
        solve_seconds=seconds,
        rounding_seconds=rounding_seconds,
        rounding_loss=loss,
        entitlement=a.weight,
        values=values,
        arc_value=v,
        guarantee=g,
        fair=e,
    )
