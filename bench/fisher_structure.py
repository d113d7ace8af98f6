"""fisher's program at 100k bids without the conic solver: a measurement, not a solver we ship.

    .venv/bin/python bench/fisher_structure.py                       # 1k, 10k and 100k bids
    .venv/bin/python bench/fisher_structure.py --sizes 1000,10000,5

For `bench/clearing.py`'s instances, builds the Eisenberg-Gale program as `fisher` does (the
guarantee rows included) and solves it twice: by Clarabel, as `fisher._solve_eg` does, and by
a barrier method that uses the program's structure, whose answer is proven by the exact dual
function D(pi). It prints both times, the barrier's Newton steps, its proven gap and how far
its prices are from Clarabel's. docs/clearing.md ("fisher at 100k bids: three ways around the
conic solver") gives the figures and what they mean.

*D(pi), exactly.* Only the T capacity rows link tenants. At prices pi each tenant's part of the
Lagrangian, max w_i log u_i - pi . y_i over its bids with u_i >= g_i, has an exact answer: v is
the tenant's value of a tier, so at a marginal utility alpha = w_i / u_i each bid takes its tier
of largest alpha v_t - pi_t if positive. As alpha grows a bid steps along the upper envelope of
those lines; U(alpha) is a step function and alpha U(alpha) = w_i crosses once, on a step (the
bids stepping there are split) or between two; the guarantee raises alpha to where U reaches
g_i. D(pi) = pi . C + sum_i (w_i log u_i - pi . y_i) bounds the optimum from above.

*The barrier method.* min -sum_i w_i log u_i + sum_i rho_i e_i - tau (sum log x + sum log s_b +
sum log c_t + sum log e_i + sum log(u_i + e_i - g_i)): the guarantee rows made elastic (e_i,
at a penalty rho_i) so that a strictly feasible start exists. The Newton matrix is a diagonal
plus a rank-one term per bid, per tenant and per tier. It is solved per bid (Sherman-Morrison,
written with the sums over each arc's *other* arcs, which does not lose precision as bids
fill), per tenant (Sherman-Morrison) and over the tiers (a T x T Woodbury system), and that
solve preconditions conjugate gradients on the exact matrix. tau falls tenfold once a point is
centred; after each fall, pi_t = tau / c_t and D(pi) prove the gap.
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import cvxpy as cp
import numpy as np
import scipy.sparse as sp

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from clearing import instance  # noqa: E402  (bench/clearing.py's instances)

from market.clearing import lp  # noqa: E402
from market.clearing.fisher import CLARABEL_OPTIONS, buyer_budgets, program_arcs  # noqa: E402
from market.clearing.guarantee import guarantee_bundles  # noqa: E402
from market.clearing.inputs import instance_arrays  # noqa: E402
from market.clearing.rules import EPS, build_market, open_market  # noqa: E402
from market.clearing.values import tenant_values  # noqa: E402


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


@dataclass(frozen=True)
class Answer:
    """The tenants' answers at prices pi, and D(pi)."""

    x: np.ndarray  # (K,) GPUs
    utility: np.ndarray  # (n,)
    bound: np.ndarray  # (n,) bool, held at its guarantee
    dual: float  # D(pi)
    alpha: np.ndarray  # (n,)


def envelope_steps(p: Program, pi: np.ndarray, starts: np.ndarray):
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


def answers(p: Program, pi: np.ndarray, starts: np.ndarray) -> Answer:
    n, T = p.weight.size, p.capacity.size
    eb, ea, efrom, eto = envelope_steps(p, pi, starts)
    before = np.where(efrom >= 0, p.value[np.maximum(efrom, 0)], 0.0)
    step = p.value[eto] - before  # > 0
    du = p.bid_room[eb] * step
    et = p.bid_buyer[eb]
    order = np.lexsort((ea, et))
    eb, ea, efrom, eto, step, du, et = (a[order] for a in (eb, ea, efrom, eto, step, du, et))
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

    def first_where(mask: np.ndarray) -> np.ndarray:
        hit = np.minimum.reduceat(np.where(mask, idx, E), tenant_start)
        return hit  # E where none

    # The crossing of alpha U(alpha) with w.
    f = first_where(ea * incl >= w[et])
    none = f == E
    fg = group[np.minimum(f, E - 1)]
    a_at = np.where(none, np.inf, ea[np.minimum(f, E - 1)])
    um, up = g_minus[fg], g_plus[fg]
    flat = ~none & (a_at * um >= w)
    jump = ~none & ~flat
    u = np.where(none, total, np.where(flat, um, w / np.where(jump, a_at, 1.0)))
    alpha = np.where(jump, a_at, w / u)
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
        alpha = np.where(bound, a_g, alpha)
        fg = np.where(bound, gg, fg)
        jump = jump & ~bound
    # Each event applies in full below the tenant's alpha, by theta at it, not above.
    at_e = a_at[et]
    apply = np.where(ea < at_e, 1.0, np.where(ea == at_e, theta[et], 0.0))
    moved = apply * p.bid_room[eb]
    K = p.arc_bid.size
    x = np.bincount(eto, weights=moved, minlength=K)
    x -= np.bincount(efrom[efrom >= 0], weights=moved[efrom >= 0], minlength=K)
    x = np.maximum(x, 0.0)
    y = np.bincount(p.arc_tier, weights=x, minlength=T)
    dual = float(pi @ p.capacity + w @ np.log(u) - pi @ y)
    return Answer(x=x, utility=u, bound=bound, dual=dual, alpha=alpha)


def objective(p: Program, x: np.ndarray) -> float:
    buyer = p.bid_buyer[p.arc_bid]
    u = p.held + np.bincount(buyer, weights=p.value * x, minlength=p.weight.size)
    if (u <= 0).any():
        return -np.inf
    return float(p.weight @ np.log(u))


def program(tenants: int, bids: int, tiers: int) -> Program:
    """The program fisher._solve_eg states for bench/clearing.py's instance (whole GPUs)."""
    market = build_market(instance_arrays(instance(tenants, bids, tiers)), divisible=False)
    a = market.arrays
    N = a.n_tenants
    v = tenant_values(market, None)[a.arc_tenant, a.arc_tier]
    budget, _ = buyer_budgets(market)
    g, _ = guarantee_bundles(market, v)
    held = np.bincount(a.arc_tenant, weights=v * market.floor_x, minlength=N)
    om = open_market(market)
    cols = program_arcs(market, om, v, budget)
    if (om.arc_capped[cols] >= 0).any():
        raise SystemExit("a share cap binds in this instance: not covered by this measurement")
    buyers, t_row = np.unique(a.bid_tenant[om.arc_bid[cols]], return_inverse=True)
    bid_rows, b_row = np.unique(om.arc_bid[cols], return_inverse=True)
    scale = np.zeros(buyers.size)
    np.maximum.at(scale, t_row, v[cols])
    need = g[buyers] - held[buyers] > EPS
    return Program(
        arc_bid=b_row,
        arc_tier=om.arc_tier[cols],
        value=v[cols] / scale[t_row],
        bid_room=om.bid_room[bid_rows],
        bid_buyer=np.searchsorted(buyers, a.bid_tenant[bid_rows]),
        weight=budget[buyers] / budget[buyers].sum(),
        held=held[buyers] / scale,
        floor=np.where(need, g[buyers] / scale, 0.0),
        capacity=om.tier_room,
    )


def by_clarabel(p: Program) -> tuple[np.ndarray, float, float]:
    """Tier duals, seconds, objective: the conic program as fisher._solve_eg states it."""
    n, T = p.weight.size, p.capacity.size
    x = cp.Variable(p.arc_bid.size, nonneg=True)
    u = p.held + lp.incidence(p.bid_buyer[p.arc_bid], n, p.value) @ x
    capacity = lp.incidence(p.arc_tier, T) @ x <= p.capacity
    rows = [lp.incidence(p.arc_bid, p.bid_room.size) @ x <= p.bid_room, capacity]
    need = np.flatnonzero(p.floor > 0)
    if need.size:
        rows.append(u[need] >= p.floor[need])
    problem = cp.Problem(cp.Maximize(p.weight @ cp.log(u)), rows)
    start = time.perf_counter()
    problem.solve(solver=cp.CLARABEL, **CLARABEL_OPTIONS)
    seconds = time.perf_counter() - start
    return np.asarray(capacity.dual_value).ravel(), seconds, float(problem.value)


@dataclass(frozen=True)
class Barrier:
    prices: np.ndarray  # (T,) tier duals
    seconds: float
    steps: int  # Newton steps
    cg: int  # conjugate-gradient iterations in all
    gap: float  # D(pi) - objective, proven
    short: float  # largest shortfall below a guarantee, relative


def by_barrier(p: Program, *, cut: float = 0.1, max_outer: int = 30) -> Barrier | None:
    """The structured barrier method; None when no proven gap is reached."""
    start = time.perf_counter()
    K, nb, n, T = p.arc_bid.size, p.bid_room.size, p.weight.size, p.capacity.size
    kb, kt, v = p.arc_bid, p.arc_tier, p.value
    ki = p.bid_buyer[kb]
    w, h, g = p.weight, p.held, p.floor
    need = g > 0
    B = sp.csr_matrix((np.ones(K), (kb, np.arange(K))), shape=(nb, K))
    A = sp.csr_matrix((np.ones(K), (kt, np.arange(K))), shape=(T, K))
    V = sp.csr_matrix((v, (ki, np.arange(K))), shape=(n, K))
    # A strictly feasible start: half of each bid spread over its arcs, scaled to half of
    # every tier; the elastic guarantee slack covers what that start lacks.
    x = p.bid_room[kb] / (2.0 * np.bincount(kb, minlength=nb)[kb])
    x *= min(1.0, float(np.min(0.5 * p.capacity / np.maximum(A @ x, 1e-300))))
    u = h + V @ x
    e = np.where(need, np.maximum(g - u, 0) + 0.1 * np.maximum(g, 1e-6), 1.0)
    rho = np.where(need, 1e3 * w / np.maximum(g, 1e-12), 0.0)
    tau = 1.0 / (K + nb + T + 2 * need.sum())
    starts = p.starts
    steps = cg_total = 0

    def state(x, e):
        u = h + V @ x
        s = p.bid_room - B @ x
        c = p.capacity - A @ x
        z = np.where(need, u + e - g, 1.0)
        return u, s, c, z

    def gradient(x, e, tau):
        u, s, c, z = state(x, e)
        tz = np.where(need, tau / z, 0.0)
        gx = -(w / u)[ki] * v - tau / x + (tau / s)[kb] + (tau / c)[kt] - tz[ki] * v
        ge = np.where(need, rho - tau / e - tau / z, 0.0)
        return gx, ge

    def inside(x, e):
        u, s, c, z = state(x, e)
        ok = (x > 0).all() and (s > 0).all() and (c > 0).all()
        return ok and not (need & ((e <= 0) | (z <= 0))).any()

    for _ in range(max_outer):
        for _ in range(60):
            u, s, c, z = state(x, e)
            gx, ge = gradient(x, e, tau)
            tz2 = np.where(need, tau / z**2, 0.0)
            hee = np.where(need, tau / e**2 + tau / z**2, 1.0)
            omega = w / u**2 + tz2 - tz2**2 / hee  # the tenant's term, e eliminated
            d, sig, gam = tau / x**2, tau / s**2, tau / c**2
            rhs = -gx + v * (tz2 / hee * ge)[ki]
            dx, used = _direction(B, V, A, kb, ki, kt, v, d, sig, omega, gam, rhs)
            cg_total += used
            de = np.where(need, (-ge - tz2 * (V @ dx)) / hee, 0.0)
            decrement = -(gx @ dx + ge @ de)
            steps += 1
            if decrement / tau <= 1e-3:
                break
            # The longest step that stays inside (95 % of it), halved while the barrier's
            # slope along it is positive.
            reach = 1.0
            for val, dv, where in (
                (x, dx, None),
                (s, -(B @ dx), None),
                (c, -(A @ dx), None),
                (e, de, need),
                (z, V @ dx + de, need),
            ):
                down = dv < 0 if where is None else where & (dv < 0)
                if down.any():
                    reach = min(reach, float(np.min(-val[down] / dv[down])))
            a = min(1.0, 0.95 * reach)
            while a > 1e-12:
                if inside(x + a * dx, e + a * de):
                    gx1, ge1 = gradient(x + a * dx, e + a * de, tau)
                    if gx1 @ dx + ge1 @ de <= 0:
                        break
                a *= 0.5
            x, e = x + a * dx, e + a * de
        u, s, c, z = state(x, e)
        pi = tau / c
        value = float(w @ np.log(u))
        gap = answers(p, pi, starts).dual - value
        short = float(np.max(np.where(need, (g - u) / np.maximum(g, 1e-300), -1.0)))
        if gap <= max(1e-7, 1e-6 * abs(value)) and short <= 1e-9:
            return Barrier(pi, time.perf_counter() - start, steps, cg_total, gap, short)
        tau *= cut
    return None


def _direction(B, V, A, kb, ki, tier_of_arc, v, d, sig, omega, gam, rhs) -> tuple[np.ndarray, int]:
    """The Newton direction for the matrix diag(d) + B' diag(sig) B + V' diag(omega) V
    + A' diag(gam) A, and the conjugate-gradient iterations it took."""
    nb, K = B.shape
    used = 0
    dinv, inv_sig = 1.0 / d, 1.0 / sig
    # Per bid: for each arc, the sum over the bid's other arcs, without subtracting
    # the arc from a total it dominates.
    most = np.zeros(nb)
    np.maximum.at(most, kb, dinv)
    at_most = np.flatnonzero(dinv == most[kb])
    top = np.zeros(K, dtype=bool)
    top[at_most[np.unique(kb[at_most], return_index=True)[1]]] = True
    others = np.where(top, (B @ np.where(top, 0.0, dinv))[kb], (B @ dinv)[kb] - dinv)
    denom = (inv_sig[kb] + dinv + others)[:, None]

    def per_bid(Y):
        DY = dinv[:, None] * Y
        rest = np.where(top[:, None], (B @ np.where(top[:, None], 0.0, DY))[kb], (B @ DY)[kb] - DY)
        return dinv[:, None] * (Y * (inv_sig[kb] + others)[:, None] - rest) / denom

    qv = per_bid(v[:, None])[:, 0]
    t_den = 1.0 + omega * (V @ qv)

    def per_tenant(Y):
        QY = per_bid(Y)
        return QY - qv[:, None] * ((omega / t_den)[:, None] * (V @ QY))[ki]

    # P^-1 of the tier indicators: a bid's arcs are on distinct tiers, so for arc k and tier
    # t the sum over the bid's other arcs on t is the bid's sum on t, or 0 on k's own tier.
    T = gam.size
    kt = tier_of_arc
    W = np.bincount(kb * T + kt, weights=dinv, minlength=nb * T).reshape(nb, T)
    R = W[kb]
    R[np.arange(K), kt] = 0.0
    QA = dinv[:, None] * (-R)
    QA[np.arange(K), kt] += dinv * (inv_sig[kb] + others)
    QA /= denom
    Z = QA - qv[:, None] * ((omega / t_den)[:, None] * (V @ QA))[ki]
    S = np.diag(1.0 / gam) + A @ Z

    def solve(r):
        Pr = per_tenant(r[:, None])[:, 0]
        return Pr - Z @ np.linalg.solve(S, A @ Pr)

    def newton(y):
        return d * y + B.T @ (sig * (B @ y)) + V.T @ (omega * (V @ y)) + A.T @ (gam * (A @ y))

    dx = solve(rhs)
    r = rhs - newton(dx)
    size = np.linalg.norm(rhs)
    if np.linalg.norm(r) > 1e-10 * size:
        zr = solve(r)
        direction, rz = zr.copy(), r @ zr
        for _ in range(50):
            used += 1
            hd = newton(direction)
            step = rz / (direction @ hd)
            dx, r = dx + step * direction, r - step * hd
            if np.linalg.norm(r) <= 1e-10 * size:
                break
            zr = solve(r)
            rz, rz_old = r @ zr, rz
            direction = zr + (rz / rz_old) * direction
    return dx, used


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--sizes",
        nargs="*",
        default=["100,1000,5", "1000,10000,5", "10000,100000,8"],
        help="tenants,bids,tiers triples",
    )
    args = parser.parse_args()
    print(f"# {time.strftime('%Y-%m-%d %H:%M %Z')}  nproc={__import__('os').cpu_count()}")
    print(
        f"{'bids':>7} {'arcs':>7} {'clarabel':>9} {'barrier':>8} {'steps':>6} {'cg':>5} {'gap':>9} {'short':>9} {'price diff':>10}"
    )
    for size in args.sizes:
        tenants, bids, tiers = (int(s) for s in size.split(","))
        p = program(tenants, bids, tiers)
        duals, conic_seconds, _ = by_clarabel(p)
        b = by_barrier(p)
        if b is None:
            print(f"{bids:7} {p.arc_bid.size:7} {conic_seconds:9.3f}  barrier: no proven gap")
            continue
        diff = float(np.max(np.abs(b.prices / np.maximum(duals, 1e-300) - 1)))
        print(
            f"{bids:7} {p.arc_bid.size:7} {conic_seconds:9.3f} {b.seconds:8.3f} {b.steps:6} {b.cg:5} "
            f"{b.gap:9.2e} {b.short:9.2e} {diff:10.2e}",
            flush=True,
        )


if __name__ == "__main__":
    main()
