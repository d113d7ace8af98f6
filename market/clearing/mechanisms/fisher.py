"""Fisher market: Eisenberg-Gale proportional fairness with budgets, under the guarantee.

max  sum_i B_i log u_i,  u_i = h_i + sum_{e of i} v_e x_e   (h_i: value of a reserved quota)
s.t. the market's constraints, and u_i >= g_i (the guarantee, guarantee.guarantee_values)

B_i is the tenant's budget where one is set (credits per hour); otherwise the market's money,
M = what every bid could pay at most, shared in proportion to the weights. A tenant with
weight 0 (when others have weight) or no money is no buyer in the fair division: once the
buyers are served it gets what is left that it values (a fill LP) and pays the prices, never
above its budget. Demand caps (bid
quantities) break the textbook guarantees of the Fisher market — on Gavel's 26-job instance
with one GPU per job, equal budgets leave the worst job at 0.909 of its split — which is why
the guarantee is a constraint here; envy is reported by ``clear``.

Prices are the capacity duals scaled to money (the objective is normalised by the sum of the
budgets of the buyers in the program, so the dual of a tier is scaled back by it), never
below the reserve; a tier where nothing sold is priced
at its reserve. A tenant is never charged above its budget (``clear`` scales its charges).
A mixed-integer conic solver is not available, so gang bids are relaxed, then fixed: a gang
that got its minimum keeps it (on its best tier, unless it may mix tiers) as a lower bound,
the others are dropped, and the problem is solved again. Whole GPUs: up to MILP_COLUMNS arcs, a
mixed-integer program maximises the EG objective linearised at the fractional optimum,
sum_i (B_i / u_i) u_i(x), with the guarantee rows and exact gang rows; above that, the
fractional solution is rounded in the same priority, guarantees first (rounding.py).
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

import cvxpy as cp
import numpy as np
import scipy.sparse as sp

from market.clearing.errors import SolverError
from market.clearing.mechanisms.guarantee import guarantee_values
from market.clearing.mechanisms.pools import on_pools
from market.clearing.mechanisms.rules import (
    EPS,
    Market,
    OpenMarket,
    Outcome,
    open_market,
    unique_inverse,
)
from market.clearing.mechanisms.values import tenant_values
from market.clearing.outcome.rounding import round_whole
from market.clearing.solvers import eg, lp
from market.clearing.solvers.program import guarantee_rows, market_program, residual, utility_rows

# The objective is a budget-weighted mean of logs (weights sum to 1), so a duality gap of
# 1e-6 relative is far below what one whole GPU changes. At the default 1e-8 the solver
# stalls near 1e-7 on 100k-bid instances and ends "almost solved".
CLARABEL_OPTIONS = {"tol_gap_abs": 1e-7, "tol_gap_rel": 1e-6}
# Tried in turn when one fails or ends without a usable answer (seen on a 1,181-job replay):
# the interior-point solver with looser gaps and more iterations, then a first-order one.
SOLVER_ATTEMPTS = (
    (cp.CLARABEL, CLARABEL_OPTIONS),
    (cp.CLARABEL, {"tol_gap_abs": 1e-6, "tol_gap_rel": 1e-5, "max_iter": 400}),
    (cp.SCS, {"eps_abs": 1e-7, "eps_rel": 1e-7, "max_iters": 50_000}),
)
# The setting each solver reads its wall-clock limit from, in seconds (params.time_limit).
TIME_SETTING = {cp.CLARABEL: "time_limit", cp.SCS: "time_limit_secs"}
MILP_COLUMNS = 600  # whole-GPU programs up to this many arcs are solved exactly
# From this many arcs the program is solved by eg.py's interior point, which uses its
# structure and proves its answer (the conic solver when it cannot, or with share caps or
# gang minimums). Measured (docs/clearing.md): the same time as Clarabel at 1k bids (2k
# arcs), 0.33 s against 0.46-0.66 s at 10k, 3.0 s against 10-16 s at 100k.
STRUCTURED_ARCS = 2_000
LEFTOVER = 1e-6  # a budget-less tenant's weight in the whole-GPU objective, relative
LOG_GRID = 1.25  # ratio between the utilities whose tangents bound log u in whole-GPU mode
FEASIBLE = 1e-6  # relative row violation accepted from an "almost solved" conic result
GANG_SLACK = 1e-4  # a relaxed gang within this fraction of its minimum counts as served


def _solve_eg(
    om: OpenMarket,
    cols: np.ndarray,
    *,
    tenant: np.ndarray,
    v: np.ndarray,
    budget: np.ndarray,
    held: np.ndarray,
    guarantee: np.ndarray,
    arc_min: np.ndarray,
    bid_min: np.ndarray,
    time_limit: float,
) -> tuple[np.ndarray, np.ndarray, float, str]:
    """Arc GPUs (E,), tier prices (T,) in money per GPU, seconds, status."""
    T = om.tier_room.size
    k = _Layout.of(om, cols, tenant=tenant, v=v, budget=budget, held=held, guarantee=guarantee)
    start = time.perf_counter()
    if (
        cols.size >= STRUCTURED_ARCS
        and k.buyers.size * T * T <= eg.MAX_BLOCK
        and not (arc_min[cols] > 0).any()
        and not (bid_min[k.bids] > 0).any()
        and (om.arc_capped[cols] < 0).all()
    ):
        program = _eg_program(om, cols, k, tenant=tenant, v=v, held=held, guarantee=guarantee)
        found = eg.solve(program, time_limit=time_limit)
        if found is not None:
            out = np.zeros(om.arc_bid.size)
            out[cols] = np.clip(found.x, 0.0, None)
            prices = np.maximum(found.prices, 0.0) * k.money
            return out, prices, time.perf_counter() - start, "optimal"
    x, problem, constraints, capacity = _conic_program(
        om, cols, k, v=v, held=held, guarantee=guarantee, arc_min=arc_min, bid_min=bid_min
    )
    status = _solve(problem, constraints, time_limit=time_limit - (time.perf_counter() - start))
    seconds = time.perf_counter() - start
    out = np.zeros(om.arc_bid.size)
    out[cols] = np.clip(x.value, 0.0, None)
    prices = np.maximum(np.asarray(capacity.dual_value).ravel(), 0.0) * k.money
    return out, prices, seconds, status


@dataclass(frozen=True)
class _Layout:
    """The buyers and bids of the program on ``cols``: each arc's row among them, each
    buyer's value scale and budget weight, the buyers below their guarantee, and the money
    the prices are in."""

    buyers: np.ndarray
    t_row: np.ndarray
    bids: np.ndarray
    b_row: np.ndarray
    scale: np.ndarray
    weight: np.ndarray
    need: np.ndarray
    money: float

    @classmethod
    def of(
        cls,
        om: OpenMarket,
        cols: np.ndarray,
        *,
        tenant: np.ndarray,
        v: np.ndarray,
        budget: np.ndarray,
        held: np.ndarray,
        guarantee: np.ndarray,
    ) -> _Layout:
        buyers, t_row = np.unique(tenant[om.arc_bid[cols]], return_inverse=True)
        # The duals are per unit of the program's money, the buyers' budgets in it: a tenant
        # with money and nothing in the program (no bid) is not in the prices.
        money = np.where(np.isin(np.arange(budget.size), buyers), budget, 0.0).sum()
        bids, b_row = unique_inverse(om.arc_bid[cols])
        # Each buyer's utility in units of its own best value per GPU: log(u / s) differs from
        # log u by a constant, so the optimum and the tier duals are the same, but utilities
        # are about the number of GPUs won whatever the spread of values across tenants. One
        # scale for all (the largest value) left the buyers of low value with utilities near
        # 1e-5 and the interior point stalled on some 125k-bid programs ("insufficient
        # progress").
        scale = np.zeros(buyers.size)
        np.maximum.at(scale, t_row, v[cols])
        scale[scale <= 0] = 1.0
        weight = budget[buyers] / budget[buyers].sum()
        need = np.flatnonzero(guarantee[buyers] - held[buyers] > EPS)
        return cls(buyers, t_row, bids, b_row, scale, weight, need, money)


def _eg_program(
    om: OpenMarket,
    cols: np.ndarray,
    k: _Layout,
    *,
    tenant: np.ndarray,
    v: np.ndarray,
    held: np.ndarray,
    guarantee: np.ndarray,
) -> eg.Program:
    """The Eisenberg-Gale program on ``cols`` for the structured interior point, each
    buyer's values in units of its scale."""
    buyers, need, scale = k.buyers, k.need, k.scale
    floor = np.zeros(buyers.size)
    floor[need] = guarantee[buyers][need] / scale[need]
    return eg.Program(
        arc_bid=k.b_row,
        arc_tier=om.arc_tier[cols],
        value=v[cols] / scale[k.t_row],
        bid_room=om.bid_room[k.bids],
        bid_buyer=np.searchsorted(buyers, tenant[k.bids]),
        weight=k.weight,
        held=held[buyers] / scale,
        floor=floor,
        capacity=om.tier_room,
    )


def _conic_program(
    om: OpenMarket,
    cols: np.ndarray,
    k: _Layout,
    *,
    v: np.ndarray,
    held: np.ndarray,
    guarantee: np.ndarray,
    arc_min: np.ndarray,
    bid_min: np.ndarray,
) -> tuple[cp.Variable, cp.Problem, list, cp.Constraint]:
    """(x, problem, constraints, capacity row): the Eisenberg-Gale program on ``cols`` as a
    cvxpy problem, with the gangs' minimums, the guarantees and the capped groups."""
    buyers, t_row, bids, b_row, scale, need = k.buyers, k.t_row, k.bids, k.b_row, k.scale, k.need
    T = om.tier_room.size
    x = cp.Variable(cols.size, nonneg=True)
    utility = held[buyers] / scale + lp.incidence(t_row, buyers.size, v[cols] / scale[t_row]) @ x
    per_bid = lp.incidence(b_row, bids.size) @ x
    capacity = lp.incidence(om.arc_tier[cols], T) @ x <= om.tier_room
    constraints = [per_bid <= om.bid_room[bids], capacity]
    if (arc_min[cols] > 0).any():
        at = np.flatnonzero(arc_min[cols] > 0)
        constraints.append(x[at] >= arc_min[cols][at])
    if (bid_min[bids] > 0).any():
        at = np.flatnonzero(bid_min[bids] > 0)
        constraints.append(per_bid[at] >= bid_min[bids][at])
    if need.size:
        constraints.append(utility[need] >= guarantee[buyers][need] / scale[need])
    c = om.arc_capped[cols]
    if (c >= 0).any():
        groups, g_row = np.unique(c[c >= 0], return_inverse=True)
        in_group = lp.incidence(g_row, groups.size)
        constraints.append(in_group @ x[np.flatnonzero(c >= 0)] <= om.group_room[groups])
    problem = cp.Problem(cp.Maximize(k.weight @ cp.log(utility)), constraints)
    return x, problem, constraints, capacity


def _solve(problem: cp.Problem, constraints: list, *, time_limit: float) -> str:
    """Solve with the first of SOLVER_ATTEMPTS that ends optimal, or "almost solved" and
    feasible to FEASIBLE ("inaccurate"); a SolverError naming the last status otherwise.
    The attempts share ``time_limit`` seconds: each is given what the ones before it left,
    and once it is spent the solve ends with a SolverError that says so."""
    deadline = time.perf_counter() + time_limit
    last = "not run"
    for solver, options in SOLVER_ATTEMPTS:
        left = deadline - time.perf_counter()
        if left <= 0:
            break
        try:
            problem.solve(solver=solver, **options, **{TIME_SETTING[solver]: left})
        except cp.error.SolverError as exc:
            last = f"{solver} failed ({exc})"
            continue
        if problem.status == cp.OPTIMAL:
            return "optimal"
        if problem.status == cp.OPTIMAL_INACCURATE and _feasible(constraints):
            return "inaccurate"  # "almost solved" and feasible: good for whole GPUs
        last = f"{solver} stopped with status {problem.status!r}"
    if time.perf_counter() >= deadline:
        raise SolverError(
            f"fisher problem: the conic solver reached the time limit of {time_limit:g} s "
            f"({last}); raise params.time_limit or simplify the instance"
        )
    raise SolverError(f"fisher problem: the conic solver gave no result: {last}")


def _feasible(constraints: list) -> bool:
    """Every row holds to FEASIBLE, relative to its bound."""
    for c in constraints:
        if any(v.value is None for v in c.variables()):
            return False
        bound = float(np.max(np.abs(c.args[1].value), initial=0.0))
        if float(np.max(c.violation(), initial=0.0)) > FEASIBLE * (1.0 + bound):
            return False
    return True


def eg_objective(budget: np.ndarray, utility: np.ndarray) -> float:
    counted = budget > 0
    return float(budget[counted] @ np.log(np.maximum(utility[counted], 1e-300)))


def budgets(market: Market) -> np.ndarray:
    """B_i (N,), credits per hour: given, or the market's money shared by weight."""
    a = market.arrays
    N, B = a.n_tenants, a.n_bids
    best = np.zeros(B)
    np.maximum.at(best, a.arc_bid, a.arc_price)
    most = np.bincount(a.bid_tenant, weights=a.quantity * best, minlength=N)
    given = ~np.isnan(a.budget)
    free = ~given
    weights = np.where(free, a.weight, 0.0)
    money = most[free].sum()
    if weights.sum() > 0:
        share = money * weights / weights.sum()
    else:
        share = np.full(N, money / max(int(free.sum()), 1))
    return np.where(given, np.nan_to_num(a.budget), share)


def buyer_budgets(market: Market) -> tuple[np.ndarray, np.ndarray]:
    """(B_i (N,), left out (N,) bool): the budgets of the buyers in the fair division, 0 for
    the tenants left out of it."""
    a = market.arrays
    budget = budgets(market)
    # Without weight, no entitlement: such a tenant (and one without money) is not a buyer in
    # the fair division; it takes what is left that it values. Holding it out also keeps the
    # guarantees (shares of the weighted tenants) from forcing a buyer's utility to 0.
    left_out = (budget <= 0) | ((a.weight <= 0) & bool((a.weight > 0).any()))
    return np.where(left_out, 0.0, budget), left_out


def program_arcs(market: Market, om: OpenMarket, v: np.ndarray, budget: np.ndarray) -> np.ndarray:
    """The arcs of the Eisenberg-Gale program: only arcs that can carry a GPU enter, since a
    log term whose utility is forced to 0 has no optimum (a tenant with nothing obtainable is
    left out of the objective instead)."""
    a = market.arrays
    open_group = (om.arc_capped < 0) | (om.group_room[np.maximum(om.arc_capped, 0)] > EPS)
    return np.flatnonzero(
        (v > 0)
        & (budget[a.arc_tenant] > 0)
        & (om.bid_room[om.arc_bid] > EPS)
        & (om.tier_room[om.arc_tier] > EPS)
        & open_group
    )


def fisher(market: Market, params: Mapping[str, Any]) -> Outcome:
    """The mechanism, on the market with each tenant's interchangeable bids pooled where
    that makes it much smaller (pools.py; the budgets its bids' limits set are kept), its
    awards then spread over the bids."""
    out = on_pools(market, _fisher, params, budget=budgets(market))
    a = market.arrays  # its budgets, not the pooled market's (given there from its bids)
    return replace(out, budget_cap=np.where(np.isnan(a.budget), np.inf, a.budget))


def _fisher(market: Market, params: Mapping[str, Any]) -> Outcome:
    a = market.arrays
    N = a.n_tenants
    values = tenant_values(market, params["values"])
    v = values[a.arc_tenant, a.arc_tier]
    budget, left_out = buyer_budgets(market)
    g, fair = guarantee_values(market, values)
    held = np.bincount(a.arc_tenant, weights=v * market.floor_x, minlength=N)
    om = open_market(market)
    cols = program_arcs(market, om, v, budget)
    time_limit = float(params["time_limit"])
    common = dict(
        tenant=a.bid_tenant, v=v, budget=budget, held=held, guarantee=g, time_limit=time_limit
    )
    x, paid, seconds, status, arc_min, bid_min = _solve_with_gangs(market, om, cols, common)
    if left_out.any():
        x, more = _fill(market, om, x, left_out=left_out, v=v, time_limit=time_limit)
        seconds += more
    sold = np.bincount(a.arc_tier, weights=x, minlength=a.n_tiers) > EPS
    prices = np.where(sold, np.maximum(a.reserve, paid), a.reserve)
    loss, rounding_seconds = 0.0, 0.0
    if not market.divisible:
        x, prices, status, more, rounding_seconds, loss = _rounded(
            market,
            om,
            x=x,
            prices=prices,
            v=v,
            budget=budget,
            held=held,
            g=g,
            arc_min=arc_min,
            bid_min=bid_min,
            status=status,
            time_limit=time_limit,
        )
        seconds += more
    return Outcome(
        x=market.floor_x + x,
        prices=prices,
        status=status,
        solve_seconds=seconds,
        rounding_seconds=rounding_seconds,
        rounding_loss=loss,
        entitlement=budget,
        values=values,
        arc_value=v,
        guarantee=g,
        fair=fair,
        budget_cap=np.where(np.isnan(a.budget), np.inf, a.budget),
    )


def _solve_with_gangs(
    market: Market, om: OpenMarket, cols: np.ndarray, common: dict[str, Any]
) -> tuple[np.ndarray, np.ndarray, float, str, np.ndarray, np.ndarray]:
    """(x, paid, seconds, status, arc_min, bid_min): the program solved on ``cols``; with
    gang bids, solved again with each gang fixed where the relaxation put it, or, when that
    fails, without any gang bid (status "fallback")."""
    a = market.arrays
    B = a.n_bids
    x = np.zeros(a.arc_bid.size)
    paid = np.zeros(a.n_tiers)  # the tiers' prices from the program, money per GPU
    seconds, status = 0.0, "optimal"
    arc_min, bid_min = np.zeros(a.arc_bid.size), np.zeros(B)
    if cols.size:
        x, paid, seconds, status = _solve_eg(om, cols, arc_min=arc_min, bid_min=bid_min, **common)
        if market.is_gang.any():
            fixed, arc_min, bid_min = _fix_gangs(market, cols, x)
            x = np.zeros(a.arc_bid.size)
            try:
                if fixed.size:
                    x, paid, more, status = _solve_eg(
                        om, fixed, arc_min=arc_min, bid_min=bid_min, **common
                    )
                    seconds += more
            except SolverError:
                # The gangs fixed where the relaxation put them can crowd out a guarantee:
                # drop every gang bid instead, which no hard constraint forbids.
                cols = cols[~market.is_gang[a.arc_bid[cols]]]
                arc_min, bid_min = np.zeros(a.arc_bid.size), np.zeros(B)
                status = "fallback"
                if cols.size:
                    x, paid, more, _ = _solve_eg(
                        om, cols, arc_min=arc_min, bid_min=bid_min, **common
                    )
                    seconds += more
    return x, paid, seconds, status, arc_min, bid_min


def _rounded(
    market: Market,
    om: OpenMarket,
    *,
    x: np.ndarray,
    prices: np.ndarray,
    v: np.ndarray,
    budget: np.ndarray,
    held: np.ndarray,
    g: np.ndarray,
    arc_min: np.ndarray,
    bid_min: np.ndarray,
    status: str,
    time_limit: float,
) -> tuple[np.ndarray, np.ndarray, str, float, float, float]:
    """(whole x, prices, status, solver seconds, rounding seconds, rounding loss): ``x``
    rounded to whole GPUs, a tier that sells nothing then priced at its reserve."""
    a = market.arrays
    N, B = a.n_tenants, a.n_bids
    start = time.perf_counter()
    utility = held + np.bincount(a.arc_tenant, weights=v * x, minlength=N)
    gang_min = np.maximum(bid_min, np.bincount(a.arc_bid, weights=arc_min, minlength=B))
    whole, more, status = _whole(
        market,
        om,
        x=x,
        v=v,
        budget=budget,
        held=held,
        target=g - held,
        gang_min=gang_min,
        status=status,
        time_limit=time_limit,
    )
    rounded = held + np.bincount(a.arc_tenant, weights=v * whole, minlength=N)
    loss = eg_objective(budget, utility) - eg_objective(budget, rounded)
    x = whole
    rounding_seconds = time.perf_counter() - start - more
    sold = np.bincount(a.arc_tier, weights=x, minlength=a.n_tiers) > EPS
    prices = np.where(sold, prices, a.reserve)
    return x, prices, status, more, rounding_seconds, loss


def _fix_gangs(
    market: Market, cols: np.ndarray, x: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """After the relaxed solve: the arcs kept, per-arc minimums (one-tier gangs on their best
    tier) and per-bid minimums (mixed-tier gangs)."""
    a = market.arrays
    E, B = a.arc_bid.size, a.n_bids
    arc_min, bid_min = np.zeros(E), np.zeros(B)
    keep = np.ones(E, dtype=bool)
    got = np.bincount(a.arc_bid, weights=x, minlength=B)
    first = np.searchsorted(a.arc_bid, np.arange(B + 1))  # arcs are sorted by bid
    for b in np.flatnonzero(market.is_gang).tolist():
        arcs = np.arange(first[b], first[b + 1])
        if market.one_tier[b]:
            e = arcs[np.argmax(x[arcs])] if arcs.size else -1  # its tier with the most GPUs
            if e >= 0 and x[e] >= a.min_quantity[b] * (1 - GANG_SLACK):
                arc_min[e] = a.min_quantity[b]
                keep[arcs[arcs != e]] = False
            else:
                keep[arcs] = False
        elif got[b] >= a.min_quantity[b] * (1 - GANG_SLACK):
            bid_min[b] = a.min_quantity[b]
        else:
            keep[arcs] = False
    return cols[keep[cols]], arc_min, bid_min


def _fill(
    market: Market,
    om: OpenMarket,
    x: np.ndarray,
    *,
    left_out: np.ndarray,
    v: np.ndarray,
    time_limit: float,
) -> tuple[np.ndarray, float]:
    """The tenants without money take what is left that they value: an LP over their arcs."""
    a = market.arrays
    rest = residual(om, x)
    cols = np.flatnonzero(
        left_out[a.arc_tenant]
        & (v > 0)
        & (rest.bid_room[a.arc_bid] > EPS)
        & ~market.is_gang[a.arc_bid]
    )
    if cols.size == 0:
        return x, 0.0
    sk = market_program(market, rest, what="fisher leftovers", gangs=False, cols=cols)
    sol = sk.program.maximise([(sk.x, v[cols])], relax=True, time_limit=time_limit)
    filled = x.copy()
    filled[cols] += np.clip(sol["x"], 0.0, None)
    return filled, sol.seconds


def _whole(
    market: Market,
    om: OpenMarket,
    *,
    x: np.ndarray,
    v: np.ndarray,
    budget: np.ndarray,
    held: np.ndarray,
    target: np.ndarray,
    gang_min: np.ndarray,
    status: str,
    time_limit: float,
) -> tuple[np.ndarray, float, str]:
    """Whole GPUs per arc, solver seconds, status.

    Up to MILP_COLUMNS arcs: max sum_i B_i t_i with t_i under the tangents of log u_i at a
    geometric grid of utilities (ratio LOG_GRID, from half the tenant's smallest GPU value
    to all it could get), the guarantee rows and exact gang rows: the Nash welfare in whole
    GPUs, within log(LOG_GRID)^2 / 8 per tenant. Tenants without money add their value at a
    tiny weight, so they only take what is left. Above that size, rounding in EG priority.
    """
    a = market.arrays
    N = a.n_tenants
    sk = market_program(market, om, what="fisher problem (whole GPUs)")
    # The buyers with something to win; a log term with nothing under it is unbounded.
    can_win = np.bincount(a.arc_tenant[sk.cols], weights=v[sk.cols] > 0, minlength=N) > 0
    buyers = np.flatnonzero((budget > 0) & can_win)
    if sk.cols.size <= MILP_COLUMNS:
        guarantee_rows(sk, market, v, target)
        U = utility_rows(market, sk.cols, v)
        p = sk.program
        t = p.variables("t", buyers.size, lo=-np.inf)
        best = np.zeros(a.n_bids)
        np.maximum.at(best, a.arc_bid, v)
        most = held + np.bincount(a.bid_tenant, weights=a.quantity * best, minlength=N)
        rows_u, rows_t, rhs = [], [], []
        for k, i in enumerate(buyers.tolist()):
            mine = v[sk.cols][a.arc_tenant[sk.cols] == i]
            low = 0.5 * mine[mine > 0].min()
            steps = int(np.ceil(np.log(max(most[i], low) / low) / np.log(LOG_GRID))) + 1
            for u_k in np.geomspace(low, max(most[i], low), num=max(steps, 2)):
                rows_u.append(-U[i] / u_k)  # t_i - u_i / u_k <= log u_k - 1
                rows_t.append(k)
                rhs.append(np.log(u_k) - 1.0 + held[i] / u_k)
        if rows_u:
            p.constrain(
                "nash",
                [
                    (sk.x, sp.vstack(rows_u).tocsr()),
                    (t, lp.incidence(np.array(rows_t), buyers.size).T.tocsr()),
                ],
                hi=np.array(rhs),
            )
        real = budget[buyers]
        tiny = LEFTOVER * (real.min() if real.size else 1.0) / max(float(v.max(initial=1.0)), EPS)
        leftover = np.where(np.isin(a.arc_tenant[sk.cols], buyers), 0.0, tiny * v[sk.cols])
        sol = p.maximise([(t, real), (sk.x, leftover)], time_limit=time_limit)
        if sol.status != "no_solution":
            whole = np.zeros(a.arc_bid.size)
            whole[sk.cols] = np.rint(sol["x"])
            return whole, sol.seconds, status if sol.status == "optimal" else sol.status
    whole = round_whole(
        om,
        x=x,
        arc_tenant=a.arc_tenant,
        arc_value=v,
        guarantee=target,
        priority=lambda u: np.where(budget > 0, budget / np.maximum(held + u, EPS), 0.0),
        gang_min=gang_min,
    )
    return whole, 0.0, "rounded" if status == "optimal" else status
