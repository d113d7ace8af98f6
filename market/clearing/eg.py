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
A step costs a few sparse products over the arcs; at 100k bids the method takes about 25
steps where the conic solver takes 39 iterations of a factorisation of the whole program.

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

Not for: share caps that bind or gang minimums, or more than MAX_BLOCK tenants x tiers^2
(fisher does not call it then).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp

GAP_ABS, GAP_REL = 1e-7, 1e-6  # the proven gap asked for: as the conic solver's settings
SHORT = 1e-9  # a guarantee may be missed by this much, relative
PENALTY = 1e3  # rho_i = PENALTY * w_i / g_i: a guarantee's dual is far below it
MAX_STEPS = 80
MAX_BLOCK = 20_000_000  # tenants x tiers x tiers held at once in a step (8 bytes each)
CG_STEPS = 50  # conjugate-gradient iterations per system at most
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

    @property
    def starts(self) -> np.ndarray:
        return np.searchsorted(self.arc_bid, np.arange(self.bid_room.size))


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
class _Point:
    """Primal x, e (elastic guarantee slack) and the duals of x >= 0 (nu), the bid rows (mu),
    the tier rows (pi), the guarantee rows (lam) and e >= 0 (kap)."""

    x: np.ndarray
    e: np.ndarray
    nu: np.ndarray
    mu: np.ndarray
    pi: np.ndarray
    lam: np.ndarray
    kap: np.ndarray


@dataclass(frozen=True)
class _Rows:
    """The program's rows as sparse matrices over the arcs."""

    B: sp.csr_matrix  # (nb, K) bids
    A: sp.csr_matrix  # (T, K) tiers
    V: sp.csr_matrix  # (n, K) tenants' values
    need: np.ndarray  # (n,) bool, a guarantee row
    rho: np.ndarray  # (n,) its elastic slack's price
    pairs: tuple[np.ndarray, np.ndarray]  # (k, j): every two arcs of one bid, both ways


def solve(p: Program, *, time_limit: float) -> Solution | None:
    """The optimum within the proven gap, or None (no proof within MAX_STEPS or
    ``time_limit`` seconds: the caller solves the conic program)."""
    deadline = time.perf_counter() + time_limit
    K, nb, n, T = p.arc_bid.size, p.bid_room.size, p.weight.size, p.capacity.size
    kb, kt, ki = p.arc_bid, p.arc_tier, p.bid_buyer[p.arc_bid]
    w, h, g = p.weight, p.held, p.floor
    need = g > 0
    rows = _Rows(
        B=sp.csr_matrix((np.ones(K), (kb, np.arange(K))), shape=(nb, K)),
        A=sp.csr_matrix((np.ones(K), (kt, np.arange(K))), shape=(T, K)),
        V=sp.csr_matrix((p.value, (ki, np.arange(K))), shape=(n, K)),
        need=need,
        rho=np.where(need, PENALTY * w / np.maximum(g, 1e-300), 0.0),
        pairs=_pairs_of_arcs(kb),
    )
    # A strictly feasible start: half of each bid spread over its arcs, scaled to half of
    # every tier; the elastic slack e covers what that start lacks of a guarantee.
    x = p.bid_room[kb] / (2.0 * np.bincount(kb, minlength=nb)[kb])
    x *= min(1.0, float(np.min(0.5 * p.capacity / np.maximum(rows.A @ x, 1e-300))))
    u = h + rows.V @ x
    e = np.where(need, np.maximum(g - u, 0) + 0.1 * np.maximum(g, 1e-6), 1.0)
    m = K + nb + T + 2 * int(need.sum())
    # Duals that meet stationarity at the start: small tier prices and guarantee duals, each
    # bid's dual a little above its best arc's marginal value, each arc's the difference.
    lam = np.where(need, 1.0 / (m * (u + e - g)), 0.0)
    marg = (w / u + lam)[ki] * p.value
    pi = np.full(T, 0.1 * float(marg.mean()))
    mu = np.zeros(nb)
    np.maximum.at(mu, kb, marg)
    mu = mu * 1.01 + 1e-300
    point = _Point(x=x, e=e, nu=mu[kb] + pi[kt] - marg, mu=mu, pi=pi, lam=lam, kap=rows.rho - lam)
    for step in range(MAX_STEPS):
        if time.perf_counter() > deadline:
            return None
        u = h + rows.V @ point.x
        products = sum(float(q @ val) for val, q in _complements(p, rows, point))
        if products < 10 * GAP_ABS:
            # Near the end: ask for the proof.
            value = float(w @ np.log(u))
            short = float(np.max(np.where(need, (g - u) / np.maximum(g, 1e-300), -1.0)))
            gap = dual_bound(p, np.maximum(point.pi, 0.0)) - value
            if gap <= max(GAP_ABS, GAP_REL * abs(value)) and short <= SHORT:
                return Solution(x=point.x, prices=point.pi, steps=step, gap=gap)
        point = _advance(p, rows, point, products / m)
        if point is None:
            return None
    return None


def _pairs_of_arcs(kb: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Every ordered pair (k, j), k != j, of arcs of one bid; arcs are sorted by bid."""
    pk, pj = [], []
    for gap in range(1, int(np.bincount(kb).max(initial=1))):
        same = np.flatnonzero(kb[gap:] == kb[:-gap])
        pk += [same, same + gap]
        pj += [same + gap, same]
    if not pk:
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
    return np.concatenate(pk), np.concatenate(pj)


def _complements(p: Program, rows: _Rows, pt: _Point) -> list[tuple[np.ndarray, np.ndarray]]:
    """(slack, dual) of every inequality: x, bid rows, tier rows, guarantee rows, e (the last
    two over the tenants with a guarantee row only)."""
    need = rows.need
    u = p.held + rows.V @ pt.x
    return [
        (pt.x, pt.nu),
        (p.bid_room - rows.B @ pt.x, pt.mu),
        (p.capacity - rows.A @ pt.x, pt.pi),
        ((u + pt.e - p.floor)[need], pt.lam[need]),
        (pt.e[need], pt.kap[need]),
    ]


def _advance(p: Program, rows: _Rows, pt: _Point, mean: float) -> _Point | None:
    """One predictor-corrector step from ``pt``; None when no step is possible."""
    B, A, V, need = rows.B, rows.A, rows.V, rows.need
    w, v, ki = p.weight, p.value, p.bid_buyer[p.arc_bid]
    x, e = pt.x, pt.e
    u = p.held + V @ x
    s, c = p.bid_room - B @ x, p.capacity - A @ x
    z = np.where(need, u + e - p.floor, 1.0)
    r_x = -V.T @ (w / u) - pt.nu + B.T @ pt.mu + A.T @ pt.pi - V.T @ pt.lam  # stationarity
    r_e = np.where(need, rows.rho - pt.kap - pt.lam, 0.0)
    lz = np.where(need, pt.lam / z, 0.0)
    hee = np.where(need, pt.kap / e + lz, 1.0)
    system = _System(
        B,
        V,
        A,
        p.arc_bid,
        ki,
        p.arc_tier,
        v,
        rows.pairs,
        d=pt.nu / x,
        sig=pt.mu / s,
        gam=pt.pi / c,
        omega=w / u**2 + lz - lz**2 / hee,
    )
    slacks = (x, s, c, z[need], e[need])
    duals = (pt.nu, pt.mu, pt.pi, pt.lam[need], pt.kap[need])

    def direction(targets):
        # The Newton step that moves each product slack * dual to itself + target.
        tx, ts, tc, tz_, te_ = targets
        tz, te = np.zeros(z.size), np.zeros(z.size)
        tz[need], te[need] = tz_, te_
        rhs_x = -r_x + tx / x - B.T @ (ts / s) - A.T @ (tc / c) + V.T @ np.where(need, tz / z, 0)
        rhs_e = np.where(need, -r_e + te / e + tz / z, 0.0)
        dx = system.solve(rhs_x - v * (lz / hee * rhs_e)[ki])
        de = np.where(need, (rhs_e - lz * (V @ dx)) / hee, 0.0)
        d_slack = (dx, -(B @ dx), -(A @ dx), (V @ dx + de)[need], de[need])
        d_dual = tuple(
            (t - q * ds) / sl for t, q, ds, sl in zip(targets, duals, d_slack, slacks, strict=True)
        )
        return d_slack, d_dual

    def longest(d_slack, d_dual) -> float:
        a = 1.0
        for current, change in zip(slacks + duals, d_slack + d_dual, strict=True):
            down = change < 0
            if down.any():
                a = min(a, float(np.min(-current[down] / change[down])))
        return a

    # Predictor: every product to 0. Corrector: to sigma times the mean, with the
    # predictor's second-order terms (Mehrotra).
    d_slack, d_dual = direction([-sl * q for sl, q in zip(slacks, duals, strict=True)])
    a = longest(d_slack, d_dual)
    after = sum(
        float((sl + a * ds) @ (q + a * dq))
        for sl, q, ds, dq in zip(slacks, duals, d_slack, d_dual, strict=True)
    )
    m = sum(sl.size for sl in slacks)
    target = (after / (mean * m)) ** 3 * mean
    d_slack, d_dual = direction(
        [
            target - sl * q - ds * dq
            for sl, q, ds, dq in zip(slacks, duals, d_slack, d_dual, strict=True)
        ]
    )
    a = min(1.0, STEP_BACK * longest(d_slack, d_dual))
    if a < 1e-8:
        return None
    de = np.zeros(z.size)
    de[need] = d_slack[4]
    lam, kap = pt.lam.copy(), pt.kap.copy()
    lam[need] += a * d_dual[3]
    kap[need] += a * d_dual[4]
    return _Point(
        x=x + a * d_slack[0],
        e=e + a * de,
        nu=pt.nu + a * d_dual[0],
        mu=pt.mu + a * d_dual[1],
        pi=pt.pi + a * d_dual[2],
        lam=lam,
        kap=kap,
    )


class _System:
    """diag(d) + B' diag(sig) B + V' diag(omega) V + A' diag(gam) A: bids B, tenants V (the
    arcs' values), tiers A. ``solve`` by blocks, then conjugate gradients on the exact matrix
    with that solve as the preconditioner."""

    def __init__(self, B, V, A, kb, ki, kt, v, pairs, *, d, sig, gam, omega):
        self.B, self.V, self.A, self.kb, self.ki = B, V, A, kb, ki
        self.d, self.sig, self.gam, self.omega = d, sig, gam, omega
        nb, K = B.shape
        T = gam.size
        self.dinv, self.inv_sig = 1.0 / d, 1.0 / sig
        # Per bid, for each arc: the sum over the bid's other arcs, taken over all but the
        # bid's largest for that arc, and as the total less the arc's own for the others
        # (no digit lost: the total is at least twice what is left).
        most = np.zeros(nb)
        np.maximum.at(most, kb, self.dinv)
        at_most = np.flatnonzero(self.dinv == most[kb])
        self.top = np.zeros(K, dtype=bool)
        self.top[at_most[np.unique(kb[at_most], return_index=True)[1]]] = True
        self.others = self._other_sums(self.dinv[:, None])[:, 0]
        self.denom = self.inv_sig[kb] + self.dinv + self.others
        self.qv = self._per_bid(v[:, None])[:, 0]
        self.t_den = 1.0 + omega * (V @ self.qv)
        # The tier columns Z = P^-1 A' (P: all but the tier terms), never as K x T arrays.
        # A bid's arcs are on distinct tiers, and denom is the same for all its arcs, so row
        # k of Q^-1 A' (Q: the bid terms) is own_k on k's own tier and -a_k dinv_j on the
        # tier of each other arc j of its bid (a_k = dinv_k / denom). What these rows are
        # multiplied by is summed as differences over the pairs (k, j) of one bid: a total
        # less a part would lose every digit once a bid fills (see above).
        pk, pj = pairs
        n = omega.size
        self.kt, self.pk, self.pj = kt, pk, pj
        self.a = self.dinv / self.denom
        own = self.dinv * (self.inv_sig[kb] + self.others) / self.denom
        self.coef = omega / self.t_den
        # V Q^-1 A' (n, T): arc j's row of V times its column block, v_j own_j less the
        # others' v_k a_k dinv_j, is dinv_j / denom (v_j inv_sig + sum_k (v_j - v_k) dinv_k).
        spread = np.bincount(pk, weights=(v[pk] - v[pj]) * self.dinv[pj], minlength=K)
        per_arc = self.a * (v * self.inv_sig[kb] + spread)
        self.VQA = np.bincount(ki * T + kt, weights=per_arc, minlength=n * T).reshape(n, T)
        # S = 1/gam + A Z, summed per tenant and tier first, then over the tenants: a tenant's
        # term nearly cancels its bids' terms when it is split between tiers (an (n, T, T)
        # array: 640k numbers at 10k tenants and 8 tiers).
        qv_tier = np.bincount(ki * T + kt, weights=self.qv, minlength=n * T).reshape(n, T)
        cross = np.bincount(
            (ki[pk] * T + kt[pk]) * T + kt[pj],
            weights=self.a[pk] * self.dinv[pj],
            minlength=n * T * T,
        ).reshape(n, T, T)
        diag = np.bincount(ki * T + kt, weights=own, minlength=n * T).reshape(n, T)
        per_tenant = -cross - (qv_tier * self.coef[:, None])[:, :, None] * self.VQA[:, None, :]
        per_tenant[:, np.arange(T), np.arange(T)] += diag
        self.S = np.diag(1.0 / gam) + per_tenant.sum(axis=0)

    def _z_times(self, c: np.ndarray) -> np.ndarray:
        """Z c for a T-vector c: (Q^-1 A' c)_k = a_k (inv_sig c_k + sum_j dinv_j (c_k - c_j))
        over the other arcs j of k's bid, c_k the price of k's tier."""
        ck = c[self.kt]
        pk, pj = self.pk, self.pj
        spread = np.bincount(pk, weights=self.dinv[pj] * (ck[pk] - ck[pj]), minlength=ck.size)
        qa = self.a * (self.inv_sig[self.kb] * ck + spread)
        return qa - self.qv * (self.coef * (self.VQA @ c))[self.ki]

    def _other_sums(self, Y: np.ndarray) -> np.ndarray:
        top, B, kb = self.top[:, None], self.B, self.kb
        return np.where(top, (B @ np.where(top, 0.0, Y))[kb], (B @ Y)[kb] - Y)

    def _per_bid(self, Y: np.ndarray) -> np.ndarray:
        DY = self.dinv[:, None] * Y
        rest = self._other_sums(DY)
        num = Y * (self.inv_sig[self.kb] + self.others)[:, None] - rest
        return self.dinv[:, None] * num / self.denom[:, None]

    def _blocks(self, r: np.ndarray) -> np.ndarray:
        q = self._per_bid(r[:, None])[:, 0]
        q -= self.qv * (self.omega / self.t_den * (self.V @ q))[self.ki]
        return q - self._z_times(np.linalg.solve(self.S, self.A @ q))

    def _times(self, y: np.ndarray) -> np.ndarray:
        B, V, A = self.B, self.V, self.A
        return (
            self.d * y
            + B.T @ (self.sig * (B @ y))
            + V.T @ (self.omega * (V @ y))
            + A.T @ (self.gam * (A @ y))
        )

    def solve(self, rhs: np.ndarray) -> np.ndarray:
        x = self._blocks(rhs)
        r = rhs - self._times(x)
        size = float(np.linalg.norm(rhs))
        if np.linalg.norm(r) <= 1e-10 * size:
            return x
        z = self._blocks(r)
        p, rz = z.copy(), float(r @ z)
        for _ in range(CG_STEPS):
            hp = self._times(p)
            step = rz / float(p @ hp)
            x, r = x + step * p, r - step * hp
            if np.linalg.norm(r) <= 1e-10 * size:
                break
            z = self._blocks(r)
            rz, rz_old = float(r @ z), rz
            p = z + (rz / rz_old) * p
        return x
