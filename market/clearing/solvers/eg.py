"""fisher's Eisenberg-Gale program by an interior-point method built on its structure,
with a proof of every answer.

The program (fisher.py, each buyer's values in its own scale, weights w that sum to 1):

    max  sum_i w_i log u_i,   u_i = h_i + sum_{k of i} v_k x_k
    s.t. sum_{k of b} x_k <= r_b   (bids)      sum_{k on t} x_k <= C_t   (tiers)
         u_i >= g_i               (guarantees) x >= 0

*The method.* A primal-dual path-following method (predictor-corrector). The guarantee rows
are made elastic, u_i + e_i >= g_i with e_i >= 0 at a price rho_i in the objective, so that a
strictly feasible start exists (the guarantees can leave no interior: at equal values only
the equal split meets them all); the penalty is far above any guarantee's dual, and the
proof below checks that every guarantee holds. After eliminating the slacks and the duals,
each step solves one system whose matrix is a diagonal plus a rank-one term per bid, per
tenant and per tier. It is solved exactly by blocks: per bid (for each arc, the sums over
the *other* arcs of its bid are taken directly, never as a total less the arc's own: as a
bid fills, one arc's weight can be 1e16 times another's, and the subtraction loses every
digit), per tenant (Sherman-Morrison), over the T tiers (a T x T system); that solve then
preconditions conjugate gradients on the exact matrix, which end in about one iteration.
A step costs a few sums over the arcs, laid out for them (``_by_arc_count``: the bids with c
arcs side by side as a (c, bids) block, so that a sum over a bid's other arcs adds whole
rows), the system's products each one compiled pass or two (bidsums.py); at 100k bids the
method takes about 25 steps where the conic solver takes 39 iterations of a factorisation
of the whole program.

*The proof.* Only the T tier rows link tenants. At prices pi each tenant's part of the
Lagrangian, max w_i log u_i - pi . y_i over its own bids with u_i >= g_i, has an exact
answer: v is the tenant's value of a tier, so at a marginal utility alpha = w_i / u_i a bid
takes all its GPUs on its tier of largest alpha v_t - pi_t if that is positive. As alpha
grows a bid steps along the upper envelope of those lines; the tenant's value U(alpha) is
a step function, and alpha U(alpha) = w_i crosses once, on a step (the bids stepping there
are split) or between two; the guarantee raises alpha to where U reaches g_i. So
D(pi) = pi . C + sum_i (w_i log u_i - pi . y_i) is computed exactly (``dual_bound``), and it
bounds the optimum from above at every pi >= 0. An answer is returned only when the
method's allocation, which meets every row (a guarantee to SHORT), is within GAP_ABS or
GAP_REL of D at the method's tier duals; otherwise ``solve`` answers None and the caller
solves the conic program.

*Linear programs* (``Program.linear``: the objective sum_i w_i u_i, maxmin's stage 2):
``interior`` runs the same method, with primal and dual steps of their own, to a point near
the optimum, unproven; a crossover from it finds an optimal vertex (maxmin.py).

Not for: share caps that bind or gang minimums, or more than MAX_BLOCK tenants x tiers^2
(fisher and maxmin do not call it then).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace

import numpy as np
import scipy.sparse as sp

from market.clearing.solvers import bidsums

GAP_ABS, GAP_REL = 1e-7, 1e-6  # the proven gap asked for: as the conic solver's settings
SHORT = 1e-9  # a guarantee may be missed by this much, relative
PENALTY = 1e3  # rho_i = PENALTY * w_i / g_i: a guarantee's dual is far below it
MAX_STEPS = 80
MAX_BLOCK = 20_000_000  # tenants x tiers x tiers held at once in a step (8 bytes each)
CG_STEPS = 50  # conjugate-gradient iterations per system at most
# ... and this many in a row without halving the least residual end them (see _System.solve).
CG_STALL = 5
SOLVE_TOL = 1e-8  # a system is solved when its residual is this small, relative to its right side
# The same for ``interior``: its point only starts a crossover, and the linear program's
# systems take several conjugate-gradient steps more to 1e-8 (5 a system, against 2).
INTERIOR_SOLVE_TOL = 1e-5
# See _path. Five, not three: a start far from the optimum can take three short steps (0.5-4 %
# of the way) before the complementarity falls, and three more halfway; counted as a stall at
# three, two parts of 34 of the platform's million-bid maxmin round went to HiGHS from nothing.
STALL, STALL_GAP = 5, 1e-4
SUPPORT_GAP = 1e-6  # ``interior`` stops at this complementarity, relative to the objective
EMPTY = 1e-9  # a tier with no more room than this, relative to the largest, takes nothing
STEP_BACK = 0.99  # the fraction of the longest step that keeps every variable positive


@dataclass(frozen=True)
class Program:
    """One fisher program (as fisher._solve_eg states it): K arcs of nb bids and n buyers,
    each buyer's values in its own scale, weights that sum to 1."""

    arc_bid: np.ndarray  # (K,) bid row, sorted
    arc_tier: np.ndarray  # (K,) tier index
    value: np.ndarray  # (K,) the buyer's value of a GPU on the arc, > 0
    bid_room: np.ndarray  # (nb,) GPUs
    bid_buyer: np.ndarray  # (nb,) buyer row
    weight: np.ndarray  # (n,) > 0, sums to 1
    held: np.ndarray  # (n,) value already held (reserved quotas)
    floor: np.ndarray  # (n,) guaranteed value, 0 where nothing is left to guarantee
    capacity: np.ndarray  # (T,) GPUs
    # True: the linear objective sum_i w_i u_i instead (maxmin's stage 2, for ``interior``).
    linear: bool = False

    @property
    def starts(self) -> np.ndarray:
        return np.searchsorted(self.arc_bid, np.arange(self.bid_room.size))

    def gradient(self, u: np.ndarray) -> np.ndarray:
        """d objective / d u_i."""
        return self.weight if self.linear else self.weight / u

    def curvature(self, u: np.ndarray) -> np.ndarray:
        """-d2 objective / d u_i^2."""
        return np.zeros(u.size) if self.linear else self.weight / u**2


def _envelope_steps(p: Program, pi: np.ndarray, starts: np.ndarray):
    """Every bid's steps along the upper envelope of its lines alpha v - pi_t (and 0), as
    alpha grows: (bid, alpha, arc left or -1, arc taken), in order within each bid."""
    nb = p.bid_room.size
    kb, value, price = p.arc_bid, p.value, pi[p.arc_tier]
    cur_v, cur_c, cur_k = np.zeros(nb), np.zeros(nb), np.full(nb, -1)
    out_b, out_a, out_from, out_to = [], [], [], []
    low = np.zeros(nb)
    while True:
        up = value > cur_v[kb]
        if not up.any():
            break
        with np.errstate(divide="ignore", invalid="ignore"):
            alpha = np.where(up, (price - cur_c[kb]) / (value - cur_v[kb]), np.inf)
        alpha = np.where(up, np.maximum(alpha, low[kb]), np.inf)
        first = np.minimum.reduceat(alpha, starts)
        cand = up & (alpha == first[kb])
        steep = np.maximum.reduceat(np.where(cand, value, -1.0), starts)
        pick = np.flatnonzero(cand & (value == steep[kb]))
        b, at = np.unique(kb[pick], return_index=True)
        k = pick[at]
        out_b.append(b)
        out_a.append(first[b])
        out_from.append(cur_k[b])
        out_to.append(k)
        cur_v[b], cur_c[b], cur_k[b], low[b] = value[k], price[k], k, first[b]
    return (
        np.concatenate(out_b),
        np.concatenate(out_a),
        np.concatenate(out_from),
        np.concatenate(out_to),
    )


def dual_bound(p: Program, pi: np.ndarray) -> float:
    """D(pi): at every pi >= 0 an upper bound on the optimum."""
    starts = p.starts
    n, T = p.weight.size, p.capacity.size
    eb, ea, efrom, eto = _envelope_steps(p, pi, starts)
    before = np.where(efrom >= 0, p.value[np.maximum(efrom, 0)], 0.0)
    du = p.bid_room[eb] * (p.value[eto] - before)  # > 0: the value the step adds
    et = p.bid_buyer[eb]
    order = np.lexsort((ea, et))
    eb, ea, efrom, eto, du, et = (a[order] for a in (eb, ea, efrom, eto, du, et))
    E = ea.size
    idx = np.arange(E)
    tenant_start = np.searchsorted(et, np.arange(n))
    tenant_end = np.append(tenant_start[1:], E)
    cs = np.cumsum(du)
    offset = np.where(tenant_start > 0, cs[np.maximum(tenant_start - 1, 0)], 0.0)
    incl = p.held[et] + cs - offset[et]  # U just past the event
    new = np.ones(E, dtype=bool)
    new[1:] = (et[1:] != et[:-1]) | (ea[1:] != ea[:-1])
    group = np.cumsum(new) - 1
    g_first = np.flatnonzero(new)
    g_last = np.append(g_first[1:], E) - 1
    g_minus = incl[g_first] - du[g_first]  # U just before the step
    g_plus = incl[g_last]
    w, total = p.weight, incl[tenant_end - 1]

    def first_where(mask: np.ndarray) -> np.ndarray:  # per tenant; E where none
        return np.minimum.reduceat(np.where(mask, idx, E), tenant_start)

    # The crossing of alpha U(alpha) with w.
    f = first_where(ea * incl >= w[et])
    none = f == E
    fg = group[np.minimum(f, E - 1)]
    a_at = np.where(none, np.inf, ea[np.minimum(f, E - 1)])  # inf: every step taken
    um, up = g_minus[fg], g_plus[fg]
    flat = ~none & (np.where(none, 0.0, a_at) * um >= w)
    jump = ~none & ~flat
    u = np.where(none, total, np.where(flat, um, w / np.where(jump, a_at, 1.0)))
    theta = np.where(jump, (u - um) / np.maximum(up - um, 1e-300), 0.0)
    # The guarantee raises alpha to where U reaches it.
    bound = p.floor > u * (1 + 1e-12)
    if bound.any():
        fgu = first_where(incl >= p.floor[et] * (1 - 1e-12))
        fgu = np.where(fgu == E, tenant_end - 1, fgu)
        gg = group[fgu]
        a_g = ea[fgu]
        th_g = np.clip((p.floor - g_minus[gg]) / np.maximum(g_plus[gg] - g_minus[gg], 1e-300), 0, 1)
        a_at = np.where(bound, a_g, a_at)
        theta = np.where(bound, th_g, theta)
        u = np.where(bound, p.floor, u)
    # Each event applies in full below the tenant's alpha, by theta at it, not above.
    at_e = a_at[et]
    apply = np.where(ea < at_e, 1.0, np.where(ea == at_e, theta[et], 0.0))
    moved = apply * p.bid_room[eb]
    K = p.arc_bid.size
    x = np.bincount(eto, weights=moved, minlength=K)
    x -= np.bincount(efrom[efrom >= 0], weights=moved[efrom >= 0], minlength=K)
    x = np.maximum(x, 0.0)
    y = np.bincount(p.arc_tier, weights=x, minlength=T)
    return float(pi @ p.capacity + w @ np.log(u) - pi @ y)


def objective(p: Program, x: np.ndarray) -> float:
    """sum_i w_i log u_i of the GPUs x (K,)."""
    buyer = p.bid_buyer[p.arc_bid]
    u = p.held + np.bincount(buyer, weights=p.value * x, minlength=p.weight.size)
    if (u <= 0).any():
        return -np.inf
    return float(p.weight @ np.log(u))


@dataclass(frozen=True)
class Solution:
    x: np.ndarray  # (K,) GPUs
    prices: np.ndarray  # (T,) tier duals, in the objective's units
    steps: int
    gap: float  # proven: dual_bound(prices) - objective(x)


@dataclass
class Point:
    """An interior point: primal x (K,) and the elastic guarantee slack e (n,), and the
    duals of x >= 0 (nu, K), the bid rows (mu, nb), the tier rows (pi, T), the guarantee
    rows (lam, n) and e >= 0 (kap, n), in the objective's units."""

    x: np.ndarray
    e: np.ndarray
    nu: np.ndarray
    mu: np.ndarray
    pi: np.ndarray
    lam: np.ndarray
    kap: np.ndarray


@dataclass(frozen=True)
class _Rows:
    """The program's rows over the arcs: bids B, tiers A, tenants' values V. Their products
    with a vector of the arcs are sums by index (B y, A y) and a sparse product (V y); the
    transposed products are gathers (B' s = s[kb])."""

    kb: np.ndarray  # (K,) each arc's bid
    kt: np.ndarray  # (K,) tier
    ki: np.ndarray  # (K,) tenant
    v: np.ndarray  # (K,) value
    V: sp.csr_matrix  # (n, K)
    nb: int
    need: np.ndarray  # (n,) bool, a guarantee row
    rho: np.ndarray  # (n,) its elastic slack's price
    groups: tuple[tuple[int, int, int], ...]  # (c, first, end): the arcs of the bids of c arcs
    blocks: np.ndarray  # (G, 3) the same groups as an array, for bidsums
    cell: np.ndarray  # (K,) tenant x T + tier

    def bids(self, y: np.ndarray) -> np.ndarray:
        """B y: the sum over each bid's arcs."""
        return np.bincount(self.kb, weights=y, minlength=self.nb)

    def tiers(self, y: np.ndarray, T: int) -> np.ndarray:
        """A y: the sum over each tier's arcs."""
        return np.bincount(self.kt, weights=y, minlength=T)

    def values(self, y: np.ndarray) -> np.ndarray:
        """V y: each tenant's value of y."""
        return self.V @ y

    def others(self, y: np.ndarray) -> np.ndarray:
        """For each arc, the sum of y over the other arcs of its bid, taken directly (never as
        the bid's total less the arc's own: as a bid fills, one arc's term can be 1e16 times
        another's, and the subtraction loses every digit)."""
        out = np.zeros(y.size)
        for c, lo, hi in self.groups:
            ys, acc = y[lo:hi].reshape(c, -1), out[lo:hi].reshape(c, -1)  # acc: a view of out
            for j in range(1, c):  # arc i of a bid gets arc (i + j) mod c's term
                acc[: c - j] += ys[j:]
                acc[c - j :] += ys[:j]
        return out

    def spread(self, d: np.ndarray, c: np.ndarray) -> np.ndarray:
        """For each arc k, sum_j d_j (c_k - c_j) over the other arcs j of its bid (as
        differences, for the reason above)."""
        out = np.zeros(d.size)
        for m, lo, hi in self.groups:
            ds, cs, acc = (a[lo:hi].reshape(m, -1) for a in (d, c, out))
            for j in range(1, m):
                acc[: m - j] += ds[j:] * (cs[: m - j] - cs[j:])
                acc[m - j :] += ds[:j] * (cs[m - j :] - cs[:j])
        return out


def _by_arc_count(p: Program) -> tuple[np.ndarray, tuple[tuple[int, int, int], ...]]:
    """An order of the arcs in which the bids with c arcs come together, and the groups
    (c, first, end). Within a group, the first arc of every bid, in the order of the bids,
    then every bid's second arc, and so on: the group reshapes to (c, bids), and what one
    arc of a bid does with another is a sum over whole rows."""
    kb = p.arc_bid
    per_bid = np.bincount(kb, minlength=p.bid_room.size)
    count = per_bid[kb]
    position = np.arange(kb.size) - (np.cumsum(per_bid) - per_bid)[kb]  # arcs sorted by bid
    order = np.lexsort((kb, position, count))
    count = count[order]
    edges = np.flatnonzero(np.diff(count)) + 1
    firsts, ends = np.r_[0, edges], np.r_[edges, count.size]
    groups = tuple(
        (int(count[lo]), int(lo), int(hi)) for lo, hi in zip(firsts, ends, strict=True) if hi > lo
    )
    return order, groups


def solve(p: Program, *, time_limit: float) -> Solution | None:
    """The optimum within the proven gap, or None (no proof within MAX_STEPS or
    ``time_limit`` seconds: the caller solves the conic program)."""
    found = _ordered(p, True, time_limit)
    if found is None:
        return None
    point, steps, gap = found
    return Solution(x=point.x, prices=point.pi, steps=steps, gap=gap)


def interior(p: Program, *, time_limit: float) -> Point | None:
    """A linear program's (``Program.linear``) primal-dual point once its complementarity
    is SUPPORT_GAP of the objective, unproven; None when the method stops short. From it a
    crossover finds an optimal vertex in a few simplex steps (maxmin.py, highs.solve)."""
    if not p.linear:
        raise ValueError("interior is for a linear objective (Program.linear)")
    found = _ordered(p, False, time_limit)
    return None if found is None else found[0]


def _ordered(p: Program, proof: bool, time_limit: float) -> tuple[Point, int, float] | None:
    """The method on p's arcs that can carry GPUs, put in ``_by_arc_count``'s order, with a
    proof or without; the point's arc values back in p's order (0 on the arcs left out).

    A tier without room (reserved quotas can fill one, up to float dust) or a bid without
    room takes nothing, and its arcs are left out: at the start they would scale every arc
    to nothing, and the method's system would be singular. A tier left with no arc keeps a
    row with room 1, which binds nothing."""
    room = p.capacity > EMPTY * max(1.0, float(p.capacity.max(initial=0.0)))
    keep = np.flatnonzero(room[p.arc_tier] & (p.bid_room[p.arc_bid] > 0))
    if keep.size == 0:
        return None
    sub = replace(
        p,
        arc_bid=p.arc_bid[keep],
        arc_tier=p.arc_tier[keep],
        value=p.value[keep],
        capacity=np.where(room, p.capacity, 1.0),
    )
    order, groups = _by_arc_count(sub)
    arcs = {
        "arc_bid": sub.arc_bid[order],
        "arc_tier": sub.arc_tier[order],
        "value": sub.value[order],
    }
    deadline = time.perf_counter() + time_limit
    try:
        # The proof on ``sub`` (its arcs still sorted by bid): no allocation of p's puts
        # anything on the arcs left out, so both have the same optimum.
        found = _path(replace(sub, **arcs), groups, sub if proof else None, deadline=deadline)
    except (np.linalg.LinAlgError, ZeroDivisionError):  # a system it cannot solve
        return None
    if found is None:
        return None
    point, steps, gap = found
    x, nu = np.zeros(p.arc_bid.size), np.zeros(p.arc_bid.size)
    x[keep[order]], nu[keep[order]] = point.x, point.nu
    return replace(point, x=x, nu=nu), steps, gap


def _path(
    p: Program, groups, proof: Program | None, *, deadline: float
) -> tuple[Point, int, float] | None:
    """The method on ``p``, its arcs in the order of ``groups``; ``proof``, the same program
    with its arcs sorted by bid, for the dual function (None: no proof, the point where the
    complementarity is SUPPORT_GAP of the objective). The point, its steps and its proven gap
    (inf without a proof)."""
    K, nb, n, T = p.arc_bid.size, p.bid_room.size, p.weight.size, p.capacity.size
    kb, kt, ki = p.arc_bid, p.arc_tier, p.bid_buyer[p.arc_bid]
    w, h, g = p.weight, p.held, p.floor
    need = g > 0
    rows = _Rows(
        kb=kb,
        kt=kt,
        ki=ki,
        v=p.value,
        V=sp.csr_matrix((p.value, (ki, np.arange(K))), shape=(n, K)),
        nb=nb,
        need=need,
        rho=np.where(need, PENALTY * w / np.maximum(g, 1e-300), 0.0),
        groups=groups,
        blocks=np.array(groups, dtype=np.int64).reshape(-1, 3),
        cell=ki * T + kt,
    )
    # A strictly feasible start: half of each bid spread over its arcs, scaled to half of
    # every tier; the elastic slack e covers what that start lacks of a guarantee.
    x = p.bid_room[kb] / (2.0 * np.bincount(kb, minlength=nb)[kb])
    x *= min(1.0, float(np.min(0.5 * p.capacity / np.maximum(rows.tiers(x, T), 1e-300))))
    u = h + rows.values(x)
    e = np.where(need, np.maximum(g - u, 0) + 0.1 * np.maximum(g, 1e-6), 1.0)
    m = K + nb + T + 2 * int(need.sum())
    # Duals that meet stationarity at the start: small tier prices and guarantee duals, each
    # bid's dual a little above its best arc's marginal value, each arc's the difference.
    lam = np.where(need, 1.0 / (m * (u + e - g)), 0.0)
    marg = (p.gradient(u) + lam)[ki] * p.value
    pi = np.full(T, 0.1 * float(marg.mean()))
    mu = np.zeros(nb)
    np.maximum.at(mu, kb, marg)
    mu = mu * 1.01 + 1e-300
    point = Point(x=x, e=e, nu=mu[kb] + pi[kt] - marg, mu=mu, pi=pi, lam=lam, kap=rows.rho - lam)
    # Without a proof (a linear program's ``interior``) the systems are solved to
    # INTERIOR_SOLVE_TOL; when the complementarity stops falling (STALL steps without a tenth
    # off its lowest) they are solved to SOLVE_TOL; if it stalls again, or no step is
    # possible, the lowest point is the answer when it is within STALL_GAP of the objective.
    tol = SOLVE_TOL if proof is not None else INTERIOR_SOLVE_TOL
    best, best_products, since = point, np.inf, 0
    for step in range(MAX_STEPS):
        if time.perf_counter() > deadline:
            return None
        u = h + rows.values(point.x)
        products = sum(float(q @ val) for val, q in _complements(p, rows, point))
        if not np.isfinite(products):
            break
        if proof is None:
            scale = max(1.0, abs(float(w @ u)))
            if products <= SUPPORT_GAP * scale:
                return point, step, np.inf
            if products < 0.9 * best_products:
                best, best_products, since = point, products, 0
            elif (since := since + 1) >= STALL and tol > SOLVE_TOL:
                tol, since = SOLVE_TOL, 0
            elif since >= STALL:
                break
        elif products < 10 * GAP_ABS:
            # Near the end: ask for the proof.
            value = float(w @ np.log(u))
            short = float(np.max(np.where(need, (g - u) / np.maximum(g, 1e-300), -1.0)))
            gap = dual_bound(proof, np.maximum(point.pi, 0.0)) - value
            if gap <= max(GAP_ABS, GAP_REL * abs(value)) and short <= SHORT:
                return point, step, gap
        point = _advance(p, rows, point, products / m, tol)
        if point is None:
            break
    if proof is None and best_products <= STALL_GAP * max(
        1.0, abs(float(w @ (h + rows.values(best.x))))
    ):
        return best, step, np.inf
    return None


def _complements(p: Program, rows: _Rows, pt: Point) -> list[tuple[np.ndarray, np.ndarray]]:
    """(slack, dual) of every inequality: x, bid rows, tier rows, guarantee rows, e (the last
    two over the tenants with a guarantee row only)."""
    need = rows.need
    u = p.held + rows.values(pt.x)
    return [
        (pt.x, pt.nu),
        (p.bid_room - rows.bids(pt.x), pt.mu),
        (p.capacity - rows.tiers(pt.x, pt.pi.size), pt.pi),
        ((u + pt.e - p.floor)[need], pt.lam[need]),
        (pt.e[need], pt.kap[need]),
    ]


def _advance(p: Program, rows: _Rows, pt: Point, mean: float, tol: float) -> Point | None:
    """One predictor-corrector step from ``pt``, its systems solved to ``tol``; None when no
    step is possible."""
    newton = _Newton.at(p, rows, pt, tol)
    slacks, duals = newton.slacks, newton.duals
    # Predictor: every product to 0. Corrector: to sigma times the mean, with the
    # predictor's second-order terms (Mehrotra).
    d_slack, d_dual = newton.direction([-sl * q for sl, q in zip(slacks, duals, strict=True)])
    a_p, a_d = newton.steps(d_slack, d_dual)
    after = sum(
        float((sl + a_p * ds) @ (q + a_d * dq))
        for sl, q, ds, dq in zip(slacks, duals, d_slack, d_dual, strict=True)
    )
    m = sum(sl.size for sl in slacks)
    target = (after / (mean * m)) ** 3 * mean
    d_slack, d_dual = newton.direction(
        [
            target - sl * q - ds * dq
            for sl, q, ds, dq in zip(slacks, duals, d_slack, d_dual, strict=True)
        ]
    )
    a_p, a_d = (min(1.0, STEP_BACK * a) for a in newton.steps(d_slack, d_dual))
    if min(a_p, a_d) < 1e-8:
        return None
    return _moved(pt, newton, d_slack, d_dual, a_p, a_d)


@dataclass(frozen=True)
class _Newton:
    """The Newton system of the barrier problem at a point: its residuals, its reduced
    system and the point's (slack, dual) pairs, whose products each step moves."""

    p: Program
    rows: _Rows
    x: np.ndarray
    e: np.ndarray
    s: np.ndarray
    c: np.ndarray
    z: np.ndarray
    r_x: np.ndarray
    r_e: np.ndarray
    lz: np.ndarray
    hee: np.ndarray
    system: _System
    slacks: tuple[np.ndarray, ...]
    duals: tuple[np.ndarray, ...]

    @classmethod
    def at(cls, p: Program, rows: _Rows, pt: Point, tol: float) -> _Newton:
        need, kb, kt, ki, T = rows.need, rows.kb, rows.kt, rows.ki, p.capacity.size
        v = p.value
        x, e = pt.x, pt.e
        u = p.held + rows.values(x)
        s, c = p.bid_room - rows.bids(x), p.capacity - rows.tiers(x, T)
        z = np.where(need, u + e - p.floor, 1.0)
        r_x = pt.mu[kb] + pt.pi[kt] - v * (p.gradient(u) + pt.lam)[ki] - pt.nu  # stationarity
        r_e = np.where(need, rows.rho - pt.kap - pt.lam, 0.0)
        lz = np.where(need, pt.lam / z, 0.0)
        hee = np.where(need, pt.kap / e + lz, 1.0)
        system = _System(
            rows,
            tol=tol,
            d=pt.nu / x,
            sig=pt.mu / s,
            gam=pt.pi / c,
            omega=p.curvature(u) + lz - lz**2 / hee,
        )
        slacks = (x, s, c, z[need], e[need])
        duals = (pt.nu, pt.mu, pt.pi, pt.lam[need], pt.kap[need])
        return cls(p, rows, x, e, s, c, z, r_x, r_e, lz, hee, system, slacks, duals)

    def direction(self, targets):
        # The Newton step that moves each product slack * dual to itself + target.
        rows, need, x, e, s, c, z = (
            self.rows,
            self.rows.need,
            self.x,
            self.e,
            self.s,
            self.c,
            self.z,
        )
        kb, kt, ki, T, v = rows.kb, rows.kt, rows.ki, self.p.capacity.size, self.p.value
        lz, hee = self.lz, self.hee
        tx, ts, tc, tz_, te_ = targets
        tz, te = np.zeros(z.size), np.zeros(z.size)
        tz[need], te[need] = tz_, te_
        rhs_x = -self.r_x + tx / x - (ts / s)[kb] - (tc / c)[kt] + v * np.where(need, tz / z, 0)[ki]
        rhs_e = np.where(need, -self.r_e + te / e + tz / z, 0.0)
        dx = self.system.solve(rhs_x - v * (lz / hee * rhs_e)[ki])
        vdx = rows.values(dx)
        de = np.where(need, (rhs_e - lz * vdx) / hee, 0.0)
        d_slack = (dx, -rows.bids(dx), -rows.tiers(dx, T), (vdx + de)[need], de[need])
        d_dual = tuple(
            (t - q * ds) / sl
            for t, q, ds, sl in zip(targets, self.duals, d_slack, self.slacks, strict=True)
        )
        return d_slack, d_dual

    def steps(self, d_slack, d_dual) -> tuple[float, float]:
        """The longest steps of the primal and of the dual variables: one for both when the
        objective is curved (its gradient moves with x), each its own for a linear one."""
        a_p, a_d = _longest(self.slacks, d_slack), _longest(self.duals, d_dual)
        return (a_p, a_d) if self.p.linear else (min(a_p, a_d),) * 2


def _longest(current, change) -> float:
    # Every variable is positive: the longest step is 1 / the largest -change / current.
    fall = max(float(np.max(-dv / cv, initial=0.0)) for cv, dv in zip(current, change, strict=True))
    return 1.0 if fall <= 1.0 else 1.0 / fall


def _moved(pt: Point, newton: _Newton, d_slack, d_dual, a_p: float, a_d: float) -> Point:
    """``pt`` moved a_p along the primal direction and a_d along the dual one."""
    need = newton.rows.need
    de = np.zeros(newton.z.size)
    de[need] = d_slack[4]
    lam, kap = pt.lam.copy(), pt.kap.copy()
    lam[need] += a_d * d_dual[3]
    kap[need] += a_d * d_dual[4]
    return Point(
        x=newton.x + a_p * d_slack[0],
        e=newton.e + a_p * de,
        nu=pt.nu + a_d * d_dual[0],
        mu=pt.mu + a_d * d_dual[1],
        pi=pt.pi + a_d * d_dual[2],
        lam=lam,
        kap=kap,
    )


class _System:
    """diag(d) + B' diag(sig) B + V' diag(omega) V + A' diag(gam) A: bids B, tenants V (the
    arcs' values), tiers A. ``solve`` by blocks, then conjugate gradients on the exact matrix
    with that solve as the preconditioner."""

    def __init__(self, rows: _Rows, *, tol: float, d, sig, gam, omega):
        self.rows, self.tol, self.d, self.sig, self.gam, self.omega = rows, tol, d, sig, gam, omega
        kb, v = rows.kb, rows.v
        n, T = omega.size, gam.size
        self.dinv, self.inv_sig = 1.0 / d, 1.0 / sig
        self.sig_k = self.inv_sig[kb]  # each arc's bid's
        # Per bid: each arc's sum of 1/d over the bid's other arcs, plus the bid's 1/sig
        # (``base``); with the arc's own 1/d it makes denom, the same for every arc of a bid.
        # Keep these sums and products in this order: denom as base + 1/d, and Q^-1 y as
        # a * (...), equal in value, took 139 conjugate-gradient products instead of 99 on
        # maxmin's stage 2 at 100k bids (its last systems are solved to rounding).
        others = rows.others(self.dinv)
        self.base = self.sig_k + others
        self.denom = self.sig_k + self.dinv + others
        self.a = self.dinv / self.denom
        self.qv = self._per_bid(v)
        self.t_den = 1.0 + omega * rows.values(self.qv)
        # The tier columns Z = P^-1 A' (P: all but the tier terms), never as K x T arrays.
        # A bid's arcs are on distinct tiers, and denom is the same for all its arcs, so row
        # k of Q^-1 A' (Q: the bid terms) is own_k on k's own tier and -a_k dinv_j on the
        # tier of each other arc j of its bid (a_k = dinv_k / denom). What these rows are
        # multiplied by is summed as differences over the pairs (k, j) of one bid: a total
        # less a part would lose every digit once a bid fills (see above).
        own = self.dinv * self.base / self.denom
        self.coef = omega / self.t_den
        # V Q^-1 A' (n, T): arc j's row of V times its column block, v_j own_j less the
        # others' v_k a_k dinv_j, is dinv_j / denom (v_j inv_sig + sum_k (v_j - v_k) dinv_k).
        per_arc = self.a * (v * self.sig_k + rows.spread(self.dinv, v))
        cell = rows.cell
        self.VQA = np.bincount(cell, weights=per_arc, minlength=n * T).reshape(n, T)
        # S = 1/gam + A Z, summed per tenant and tier first, then over the tenants: a tenant's
        # term nearly cancels its bids' terms when it is split between tiers (an (n, T, T)
        # array: 640k numbers at 10k tenants and 8 tiers).
        qv_tier = np.bincount(cell, weights=self.qv, minlength=n * T).reshape(n, T)
        diag = np.bincount(cell, weights=own, minlength=n * T).reshape(n, T)
        # Each tenant's cross + outer - diag, then their sum (bidsums.tier_sum).
        tenant_tier = qv_tier * self.coef[:, None]
        self.S = np.diag(1.0 / gam) - bidsums.tier_sum(
            rows.blocks, self.a, self.dinv, cell, rows.kt, tenant_tier, self.VQA, diag, n, T
        )

    def _z_times(self, c: np.ndarray) -> np.ndarray:
        """Z c for a T-vector c: (Q^-1 A' c)_k = a_k (inv_sig c_k + sum_j dinv_j (c_k - c_j))
        over the other arcs j of k's bid, c_k the price of k's tier."""
        rows = self.rows
        tenant = self.coef * (self.VQA @ c)
        return bidsums.z_times(
            rows.blocks, self.a, self.sig_k, self.dinv, self.qv, rows.kt, rows.ki, c, tenant
        )

    def _per_bid(self, y: np.ndarray) -> np.ndarray:
        """Q^-1 y, Q = diag(d) + B' diag(sig) B, bid by bid."""
        return bidsums.per_bid(self.rows.blocks, self.dinv, self.base, self.denom, y)

    def _blocks(self, r: np.ndarray) -> np.ndarray:
        rows = self.rows
        q = self._per_bid(r)
        # q less its tenants' terms, in place, and its sum per tier
        tiers = bidsums.tenant_terms(
            q, self.qv, self.coef, rows.v, rows.ki, rows.kt, self.omega.size, self.gam.size
        )
        return q - self._z_times(np.linalg.solve(self.S, tiers))

    def _times(self, y: np.ndarray) -> np.ndarray:
        rows = self.rows
        return bidsums.times(
            self.d,
            y,
            self.sig,
            rows.kb,
            rows.v,
            self.omega,
            rows.ki,
            self.gam,
            rows.kt,
            rows.nb,
            self.omega.size,
            self.gam.size,
        )

    def solve(self, rhs: np.ndarray) -> np.ndarray:
        """x with the system times x within ``tol`` of ``rhs``, relative; or, when conjugate
        gradients stop gaining (CG_STALL products without halving the least residual yet,
        as on the last systems of a path, solved to rounding), the x of the least residual."""
        x = self._blocks(rhs)
        r = rhs - self._times(x)
        size = float(np.linalg.norm(rhs))
        least = float(np.linalg.norm(r))
        if least <= self.tol * size:
            return x
        best, since = x, 0
        z = self._blocks(r)
        p, rz = z.copy(), float(r @ z)
        for _ in range(CG_STEPS):
            hp = self._times(p)
            curvature = float(p @ hp)
            if not (curvature > 0 and rz != 0):  # nothing left to gain along p
                break
            step = rz / curvature
            x, r = x + step * p, r - step * hp
            residual = float(np.linalg.norm(r))
            if residual <= self.tol * size:
                return x
            if residual < least:
                best, since = x, since + 1 if residual > 0.5 * least else 0
                least = residual
            else:
                since += 1
            if since >= CG_STALL:
                break
            z = self._blocks(r)
            rz, rz_old = float(r @ z), rz
            p = z + (rz / rz_old) * p
        return best
