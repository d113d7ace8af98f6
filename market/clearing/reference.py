"""The mechanisms as their mathematics: each written once, as a plain cvxpy program.

This is the statement of docs/clearing.md's programs, and the oracle the fast paths (the
min-cost flows, column generation, eg.py's interior point, maxmin's stage shortcuts, the
pools, the partitioned clear) are held to (tests/market/clearing/test_reference.py). It
makes no attempt at speed: a few hundred arcs at most.

Notation. An arc e = (b, t) is a bid b's acceptable tier t (limit p_e >= reserve r_t);
i(e) is the bid's tenant. x_e >= 0: GPUs on the arc. q_b: the bid's quantity, m_b its gang
minimum; C_t: the tier's capacity, a_t its share cap; w_i: the tenant's weight; v_e: the
value of a GPU on the arc to its tenant (the limit for welfare; the tenant's own value of
the tier for maxmin and fisher). u_i = sum_{e of i} v_e x_e. Whole GPUs make x integer
(welfare and maxmin are then mixed-integer programs); fisher is stated fractionally.
Reserved quotas are not stated here: with them set the guarantee is the quota.
"""

from __future__ import annotations

from dataclasses import dataclass

import cvxpy as cp
import numpy as np
import scipy.sparse as sp

from market.clearing.instance.inputs import Arrays

EPS = 1e-9  # as rules.EPS: floor(0.3 * 10 + EPS) is 3, where 0.3 * 10 = 2.9999999999999996
CAPACITY = 1  # market_rules' capacity rows


@dataclass(frozen=True)
class Answer:
    x: np.ndarray  # (E,) GPUs per arc
    objective: float  # the mechanism's objective (maxmin: stage 2's sum_i u_i)
    utility: np.ndarray  # (N,) u_i, in the mechanism's values
    guarantee: np.ndarray  # (N,) g_i
    prices: np.ndarray | None = None  # (T,) where the program defines them
    tau: float | None = None  # maxmin's stage-1 optimum


def rows(index: np.ndarray, n: int, weights: np.ndarray | None = None) -> sp.csr_matrix:
    """(n, E): weights (default 1) at (index[e], e); ``rows(arc_tier, T) @ x`` sums per tier."""
    data = np.ones(index.size) if weights is None else weights
    return sp.csr_matrix((data, (index, np.arange(index.size))), shape=(n, index.size))


def tier_values(a: Arrays, values: np.ndarray | None = None) -> np.ndarray:
    """v_e: ``values`` (N, T), by default each tenant's best limit on the tier."""
    if values is None:
        values = np.zeros((a.n_tenants, a.n_tiers))
        np.maximum.at(values, (a.arc_tenant, a.arc_tier), a.arc_price)
    return values[a.arc_tenant, a.arc_tier]


def caps(a: Arrays, divisible: bool) -> np.ndarray:
    """floor(a_t C_t), the most GPUs of tier t one tenant may hold (a_t C_t if divisible)."""
    cap = a.cap_share * a.capacity
    return cap if divisible else np.floor(cap + EPS)


def capped(a: Arrays, divisible: bool) -> np.ndarray:
    """(N * T,) bool, by group i * T + t: the tenant's demand on the tier exceeds a cap below
    1 (a cap of 1 is the capacity itself, and a cap the demand fits adds nothing: neither is
    a row, so neither takes a share of the price)."""
    group = a.arc_tenant * a.n_tiers + a.arc_tier
    demand = np.bincount(group, weights=a.quantity[a.arc_bid], minlength=a.n_tenants * a.n_tiers)
    limit = np.tile(caps(a, divisible), a.n_tenants)
    return (np.tile(a.cap_share, a.n_tenants) < 1.0) & (demand > limit + EPS)


def gangs(a: Arrays, divisible: bool) -> np.ndarray:
    """(B,) bool: all-or-nothing above a minimum (a minimum of 1 GPU is none in whole GPUs)."""
    return a.min_quantity > (0.0 if divisible else 1.0)


def market_rules(a: Arrays, x: cp.Variable, *, divisible: bool) -> list[cp.Constraint]:
    """The constraints every mechanism shares (docs/clearing.md, "Market rules"); the
    capacity rows are ``[CAPACITY]``, whose duals are prices."""
    T, N, B = a.n_tiers, a.n_tenants, a.n_bids
    cap = capped(a, divisible)
    rules = [
        x >= 0,
        rows(a.arc_tier, T) @ x <= a.capacity,  # capacity
        rows(a.arc_bid, B) @ x <= a.quantity,  # quantity
        # share caps: sum_{e of i on t} x_e <= cap_t, where one can bind
        (rows(a.arc_tenant * T + a.arc_tier, N * T) @ x)[cap]
        <= np.tile(caps(a, divisible), N)[cap],
    ]
    for b in np.unique(a.arc_bid[gangs(a, divisible)[a.arc_bid]]):  # x_b = 0 or in [m_b, q_b]
        arcs = np.flatnonzero(a.arc_bid == b)
        m, q = a.min_quantity[b], a.quantity[b]
        if a.mixed_tiers[b]:  # the gang's GPUs may come from several tiers
            z = cp.Variable(boolean=True)
            rules += [m * z <= cp.sum(x[arcs]), cp.sum(x[arcs]) <= q * z]
        else:  # on one tier: a switch per tier, at most one on
            z = cp.Variable(arcs.size, boolean=True)
            rules += [m * z <= x[arcs], x[arcs] <= q * z, cp.sum(z) <= 1]
    return rules


def guarantee(a: Arrays, v: np.ndarray, *, divisible: bool, fractional: bool = False):
    """g_i (N,): the value to tenant i of its best bundle within its entitled share of every
    tier, s_it = min(w_i / W C_t, cap_t) (W: the weights of the tenants that bid), and its
    non-gang demand. Whole GPUs floor the shares; ``fractional`` keeps them (e_i, maxmin's
    and the diagnostics' normaliser). The tenants' problems are apart, so one LP solves all.
    """
    T, N = a.n_tiers, a.n_tenants
    bidding = np.zeros(N, dtype=bool)
    bidding[a.arc_tenant] = True
    total = a.weight[bidding].sum()
    share = np.outer(a.weight / total if total > 0 else 0 * a.weight, a.capacity)
    share = np.minimum(share, caps(a, divisible))
    if not (divisible or fractional):
        share = np.floor(share + EPS)
    y = cp.Variable(a.arc_bid.size)
    held = rows(a.arc_tenant, N, v) @ y
    program = cp.Problem(
        cp.Maximize(cp.sum(held)),
        [
            y >= 0,
            y[np.flatnonzero(gangs(a, divisible)[a.arc_bid])] == 0,  # gangs carry none
            rows(a.arc_bid, a.n_bids) @ y <= a.quantity,  # its demand
            rows(a.arc_tenant * T + a.arc_tier, N * T) @ y <= share.ravel(),  # its shares
        ],
    )
    _solve(program, cp.HIGHS)
    return np.maximum(held.value, 0.0)


def welfare(a: Arrays, *, divisible: bool) -> Answer:
    """max sum_e (p_e - r_t) x_e  s.t. the market rules and sum_{e of i} p_e x_e >= g_i:
    the surplus over the reserve, every tenant's guarantee in its own limits. Prices (no
    gang bids): r_t + pi_t, pi the least optimal duals of the LP (``least_prices``)."""
    p, N = a.arc_price, a.n_tenants
    g = guarantee(a, p, divisible=divisible)
    x = cp.Variable(p.size, integer=not divisible)
    surplus = p - a.reserve[a.arc_tier]
    u = rows(a.arc_tenant, N, p) @ x
    program = cp.Problem(
        cp.Maximize(surplus @ x), [*market_rules(a, x, divisible=divisible), u >= g]
    )
    _solve(program, cp.HIGHS)
    prices = None if gangs(a, divisible).any() else a.reserve + least_prices(a, g, divisible)
    return Answer(x.value, program.value, u.value, g, prices)


def least_prices(a: Arrays, g: np.ndarray, divisible: bool) -> np.ndarray:
    """pi (T,): the least sum_t pi_t over the optimal duals of welfare's LP (relaxation),
    pi_t of capacity, gamma_it of the share caps, mu_b of the quantities, lambda_i of the
    guarantees: every arc priced out, pi_t + gamma_i(e)t + mu_b - lambda_i p_e >= p_e - r_t,
    at the primal optimum's value (strong duality). Without a binding guarantee this is the
    least competitive-equilibrium price vector."""
    T, N, B = a.n_tiers, a.n_tenants, a.n_bids
    x = cp.Variable(a.arc_bid.size)
    primal = cp.Problem(
        cp.Maximize((a.arc_price - a.reserve[a.arc_tier]) @ x),
        [*market_rules(a, x, divisible=divisible), rows(a.arc_tenant, N, a.arc_price) @ x >= g],
    )
    _solve(primal, cp.HIGHS)
    pi, gamma, mu, lam = (cp.Variable(n, nonneg=True) for n in (T, N * T, B, N))
    group = a.arc_tenant * T + a.arc_tier
    dual = a.capacity @ pi + np.tile(caps(a, divisible), N) @ gamma + a.quantity @ mu - g @ lam
    program = cp.Problem(
        cp.Minimize(cp.sum(pi)),
        [
            pi[a.arc_tier]
            + gamma[group]
            + mu[a.arc_bid]
            - cp.multiply(lam[a.arc_tenant], a.arc_price)
            >= a.arc_price - a.reserve[a.arc_tier],
            dual <= primal.value + 1e-9 * (1.0 + abs(primal.value)),
            gamma[~capped(a, divisible)] == 0,  # no row, no dual
        ],
    )
    _solve(program, cp.HIGHS)
    return np.maximum(pi.value, 0.0)


def maxmin(a: Arrays, *, divisible: bool, values: np.ndarray | None = None) -> Answer:
    """e_i: tenant i's fractional equal-split value (``guarantee(fractional=True)``).
    Stage 1: max tau  s.t. the market rules, u_i >= g_i, u_i >= tau e_i (e_i > 0).
    Stage 2: max sum_i u_i  s.t. the same rows and tau >= tau* (less 1e-7 of it, for the
    solvers' tolerance): the Pareto fill. tau is not capped at 1."""
    v = tier_values(a, values)
    g = guarantee(a, v, divisible=divisible)
    e = guarantee(a, v, divisible=divisible, fractional=True)
    counted = np.flatnonzero(e > EPS)
    x = cp.Variable(v.size, integer=not divisible)
    tau = cp.Variable(nonneg=True)
    u = rows(a.arc_tenant, a.n_tenants, v) @ x
    fair = [*market_rules(a, x, divisible=divisible), u >= g]
    fair.append(u[counted] >= tau * e[counted])
    tau_star = 0.0
    if counted.size:
        _solve(cp.Problem(cp.Maximize(tau), fair), cp.HIGHS)
        tau_star = float(tau.value)
    bound = tau >= tau_star - 1e-7 * max(1.0, tau_star)
    program = cp.Problem(cp.Maximize(cp.sum(u)), [*fair, bound])
    _solve(program, cp.HIGHS)
    return Answer(x.value, program.value, u.value, g, tau=tau_star)


def budgets(a: Arrays) -> np.ndarray:
    """B_i: the tenant's budget, or else its weight's share of the market's money M (what
    every bid could pay at most: quantity x best limit, over the tenants without one)."""
    best = np.zeros(a.n_bids)
    np.maximum.at(best, a.arc_bid, a.arc_price)
    most = np.bincount(a.bid_tenant, weights=a.quantity * best, minlength=a.n_tenants)
    free = np.isnan(a.budget)
    weight = np.where(free, a.weight, 0.0)
    share = weight / weight.sum() if weight.sum() > 0 else free / max(free.sum(), 1)
    return np.where(free, most[free].sum() * share, a.budget)


def fisher(a: Arrays, *, divisible: bool = True, values: np.ndarray | None = None) -> Answer:
    """Eisenberg-Gale, no gang bids:
    max sum_i B_i log u_i  s.t. the market rules and u_i >= g_i, over the buyers: tenants
    with money and, when any tenant has weight, weight, and something of value to win.
    Prices: the capacity duals (money per GPU), at least the reserve; the reserve where
    nothing sold. Tenants outside the fair division (who take leftovers) are not stated.
    x is fractional: ``divisible=False`` states the whole-GPU rules (caps and shares
    floored) over fractional GPUs, the relaxation that bounds the whole-GPU clear."""
    v = tier_values(a, values)
    budget = budgets(a)
    g = guarantee(a, v, divisible=divisible)
    can_win = np.bincount(
        a.arc_tenant, weights=v * (caps(a, divisible)[a.arc_tier] > 0), minlength=a.n_tenants
    )
    buyer = (budget > 0) & (can_win > 0) & ((a.weight > 0) | ~(a.weight > 0).any())
    x = cp.Variable(v.size)
    u = rows(a.arc_tenant, a.n_tenants, v) @ x
    rules = market_rules(a, x, divisible=divisible)
    program = cp.Problem(
        cp.Maximize(budget[buyer] @ cp.log(u[buyer])), [*rules, u[buyer] >= g[buyer]]
    )
    _solve(program, cp.CLARABEL)
    sold = np.bincount(a.arc_tier, weights=x.value, minlength=a.n_tiers) > 1e-6
    prices = np.where(sold, np.maximum(a.reserve, rules[CAPACITY].dual_value), a.reserve)
    return Answer(x.value, program.value, u.value, g, prices)


def _solve(program: cp.Problem, solver: str) -> None:
    """Solved to optimality: a mixed-integer program to a relative gap of 1e-9, not HiGHS's
    default 1e-4 (seen: stage 2 at 15,603 where rounding reached 15,604)."""
    options = {"mip_rel_gap": 1e-9} if solver == cp.HIGHS and program.is_mixed_integer() else {}
    program.solve(solver=solver, **options)
    if program.status != cp.OPTIMAL:
        raise RuntimeError(f"reference program ended {program.status!r}")
