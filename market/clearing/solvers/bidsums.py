"""The sums over arcs of eg.py's systems, each fused into one compiled pass or two.

In numpy each was several passes over the arcs, one array operation each, every one reading
and writing whole arrays of K arcs. Each function here gives the same numbers as the numpy
expression it replaces (eg.py names it), in the same order of additions, so the method's
points do not move.

The arcs are in ``eg._by_arc_count``'s order: ``groups`` (G, 3) holds (c, first, end) for the
bids of c arcs, laid out as a (c, bids) block, so that arc i of a bid has its bid's other
arcs at rows (i + s) mod c, s = 1 .. c - 1, of the same column. Sums over a bid's other arcs
are taken directly, never as the bid's total less the arc's own (see eg._Rows.others).
"""

from __future__ import annotations

import numpy as np
from numba import njit


@njit(cache=True)
def per_bid(groups, dinv, base, denom, y):
    """dinv * (y * base - others(dinv * y)) / denom: Q^-1 y (eg._System._per_bid)."""
    out = np.zeros(y.size)
    for g in range(groups.shape[0]):
        c, lo, hi = groups[g, 0], groups[g, 1], groups[g, 2]
        m = (hi - lo) // c
        for s in range(1, c):
            for i in range(c):
                src, dst = lo + ((i + s) % c) * m, lo + i * m
                for b in range(m):
                    out[dst + b] += dinv[src + b] * y[src + b]
    for k in range(y.size):
        out[k] = dinv[k] * (y[k] * base[k] - out[k]) / denom[k]
    return out


@njit(cache=True)
def tenant_terms(q, qv, coef, v, ki, kt, n, T):
    """q -= qv * (coef * V q)[ki], in place; then A q, its sum per tier (eg._System._blocks)."""
    value = np.zeros(n)
    for k in range(q.size):
        value[ki[k]] += v[k] * q[k]
    tiers = np.zeros(T)
    for k in range(q.size):
        q[k] -= qv[k] * (coef[ki[k]] * value[ki[k]])
        tiers[kt[k]] += q[k]
    return tiers


@njit(cache=True)
def z_times(groups, a, sig_k, dinv, qv, kt, ki, c, tenant):
    """a * (sig_k * c[kt] + spread(dinv, c[kt])) - qv * tenant[ki]: Z c, with ``tenant`` the
    tenants' term coef * (VQA c) (eg._System._z_times)."""
    out = np.zeros(a.size)
    for g in range(groups.shape[0]):
        m_, lo, hi = groups[g, 0], groups[g, 1], groups[g, 2]
        m = (hi - lo) // m_
        for s in range(1, m_):
            for i in range(m_):
                src, dst = lo + ((i + s) % m_) * m, lo + i * m
                for b in range(m):
                    out[dst + b] += dinv[src + b] * (c[kt[dst + b]] - c[kt[src + b]])
    for k in range(a.size):
        ck = c[kt[k]]
        out[k] = a[k] * (sig_k[k] * ck + out[k]) - qv[k] * tenant[ki[k]]
    return out


@njit(cache=True)
def times(d, y, sig, kb, v, omega, ki, gam, kt, nb, n, T):
    """d y + B' diag(sig) B y + V' diag(omega) V y + A' diag(gam) A y (eg._System._times)."""
    bids, value, tiers = np.zeros(nb), np.zeros(n), np.zeros(T)
    for k in range(y.size):
        bids[kb[k]] += y[k]
        value[ki[k]] += v[k] * y[k]
        tiers[kt[k]] += y[k]
    out = np.empty(y.size)
    for k in range(y.size):
        out[k] = (
            d[k] * y[k]
            + sig[kb[k]] * bids[kb[k]]
            + v[k] * (omega[ki[k]] * value[ki[k]])
            + gam[kt[k]] * tiers[kt[k]]
        )
    return out


@njit(cache=True)
def tier_sum(blocks, a, dinv, cell, kt, tenant_tier, vqa, own, n, T):
    """sum over the tenants i of cross_i + outer(tenant_tier_i, vqa_i) - diag(own_i), each
    (T, T): cross_i[t, u] the sum of a_k dinv_j over the pairs (k, j) of arcs of one bid with
    k a tenant i's arc on t and j on u (eg._System.__init__; bincount of eg._shifted at
    cross_cell, in the same order)."""
    cross = np.zeros(n * T * T)
    for g in range(blocks.shape[0]):
        c, lo, hi = blocks[g, 0], blocks[g, 1], blocks[g, 2]
        m = (hi - lo) // c
        for s in range(1, c):
            for i in range(c):
                src, dst = lo + ((i + s) % c) * m, lo + i * m
                for b in range(m):
                    k, j = dst + b, src + b
                    cross[cell[k] * T + kt[j]] += a[k] * dinv[j]
    total = np.zeros((T, T))
    for i in range(n):
        for t in range(T):
            for u in range(T):
                term = cross[(i * T + t) * T + u] + tenant_tier[i, t] * vqa[i, u]
                if t == u:
                    term -= own[i, t]
                total[t, u] += term
    return total
