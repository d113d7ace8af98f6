"""bidsums' compiled sums give eg's systems the same numbers, bit for bit, as the numpy
expressions they replaced (the method's points, and so every fisher and maxmin answer, must
not move): each kernel against that expression on random layouts, with values spread over
sixteen orders of magnitude so that any change in the order of additions shows."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp

from market.clearing.solvers import bidsums


def _layout(seed: int):
    """Arcs in eg._by_arc_count's layout: the bids of c arcs as a (c, bids) block, each bid's
    arcs on distinct tiers; tenants, tiers and positive numbers per arc, bid and tenant."""
    rng = np.random.default_rng(seed)
    T, n = 5, int(rng.integers(1, 30))
    kb, kt, blocks, nb, lo = [], [], [], 0, 0
    for c in (1, 2, 3, 4):
        m = int(rng.integers(0, 40))
        if m == 0:
            continue
        tiers = np.array([rng.choice(T, size=c, replace=False) for _ in range(m)]).T  # (c, m)
        kb.append(np.tile(np.arange(nb, nb + m), c))
        kt.append(tiers.ravel())
        blocks.append((c, lo, lo + c * m))
        nb, lo = nb + m, lo + c * m
    kb, kt = np.concatenate(kb), np.concatenate(kt)
    ki = rng.integers(0, n, size=nb)[kb]

    def spread_out(size):
        return 10.0 ** rng.uniform(-8, 8, size=size)

    return {
        "blocks": np.array(blocks, dtype=np.int64).reshape(-1, 3),
        "groups": blocks,
        "kb": kb,
        "kt": kt,
        "ki": ki,
        "n": n,
        "nb": nb,
        "T": T,
        "arc": lambda: spread_out(kb.size),
        "bid": lambda: spread_out(nb),
        "tenant": lambda: spread_out(n),
        "tier": lambda: spread_out(T),
        "cell": lambda: spread_out((n, T)),
    }


def _others(groups, y):
    out = np.zeros(y.size)
    for c, lo, hi in groups:
        ys, acc = y[lo:hi].reshape(c, -1), out[lo:hi].reshape(c, -1)
        for j in range(1, c):
            acc[: c - j] += ys[j:]
            acc[c - j :] += ys[:j]
    return out


def _spread(groups, d, c):
    out = np.zeros(d.size)
    for m, lo, hi in groups:
        ds, cs, acc = (a[lo:hi].reshape(m, -1) for a in (d, c, out))
        for j in range(1, m):
            acc[: m - j] += ds[j:] * (cs[: m - j] - cs[j:])
            acc[m - j :] += ds[:j] * (cs[m - j :] - cs[:j])
    return out


def _values(L, y):
    V = sp.csr_matrix((L["v"], (L["ki"], np.arange(L["kb"].size))), shape=(L["n"], L["kb"].size))
    return V @ y


SEEDS = range(12)


@pytest.mark.parametrize("seed", SEEDS)
def test_per_bid_is_the_numpy_expression(seed):
    L = _layout(seed)
    dinv, base, denom, y = L["arc"](), L["arc"](), L["arc"](), L["arc"]()
    expected = dinv * (y * base - _others(L["groups"], dinv * y)) / denom
    assert np.array_equal(bidsums.per_bid(L["blocks"], dinv, base, denom, y), expected)


@pytest.mark.parametrize("seed", SEEDS)
def test_tenant_terms_are_the_numpy_expression(seed):
    L = _layout(seed)
    L["v"] = L["arc"]()
    q, qv, coef = L["arc"](), L["arc"](), L["tenant"]()
    expected = q - qv * (coef * _values(L, q))[L["ki"]]
    tiers = np.bincount(L["kt"], weights=expected, minlength=L["T"])
    got = q.copy()
    got_tiers = bidsums.tenant_terms(got, qv, coef, L["v"], L["ki"], L["kt"], L["n"], L["T"])
    assert np.array_equal(got, expected)
    assert np.array_equal(got_tiers, tiers)


@pytest.mark.parametrize("seed", SEEDS)
def test_z_times_is_the_numpy_expression(seed):
    L = _layout(seed)
    a, sig_k, dinv, qv = L["arc"](), L["arc"](), L["arc"](), L["arc"]()
    c, tenant = L["tier"](), L["tenant"]()
    ck = c[L["kt"]]
    expected = a * (sig_k * ck + _spread(L["groups"], dinv, ck)) - qv * tenant[L["ki"]]
    got = bidsums.z_times(L["blocks"], a, sig_k, dinv, qv, L["kt"], L["ki"], c, tenant)
    assert np.array_equal(got, expected)


@pytest.mark.parametrize("seed", SEEDS)
def test_times_is_the_numpy_expression(seed):
    L = _layout(seed)
    L["v"] = L["arc"]()
    d, y, sig, omega, gam = L["arc"](), L["arc"](), L["bid"](), L["tenant"](), L["tier"]()
    kb, ki, kt = L["kb"], L["ki"], L["kt"]
    expected = (
        d * y
        + (sig * np.bincount(kb, weights=y, minlength=L["nb"]))[kb]
        + L["v"] * (omega * _values(L, y))[ki]
        + (gam * np.bincount(kt, weights=y, minlength=L["T"]))[kt]
    )
    got = bidsums.times(d, y, sig, kb, L["v"], omega, ki, gam, kt, L["nb"], L["n"], L["T"])
    assert np.array_equal(got, expected)


@pytest.mark.parametrize("seed", SEEDS)
def test_tier_sum_is_the_numpy_expression(seed):
    # The per-tenant (T, T) blocks: every ordered pair (k, j) of one bid's arcs adds a_k dinv_j
    # at (k's tenant, k's tier, j's tier), then each tenant's outer product and diagonal.
    L = _layout(seed)
    n, T, kt, ki = L["n"], L["T"], L["kt"], L["ki"]
    a, dinv = L["arc"](), L["arc"]()
    tenant_tier, vqa, own = L["cell"](), L["cell"](), L["cell"]()
    cell = ki * T + kt
    pair_weight, pair_cell = [], []
    for c, lo, hi in L["groups"]:
        arcs = np.arange(lo, hi).reshape(c, -1)
        for s in range(1, c):
            for k, j in ((arcs[: c - s], arcs[s:]), (arcs[c - s :], arcs[:s])):
                pair_weight.append((a[k] * dinv[j]).ravel())
                pair_cell.append((cell[k] * T + kt[j]).ravel())
    cross = (
        np.bincount(
            np.concatenate(pair_cell + [np.zeros(0, dtype=np.int64)]),
            weights=np.concatenate(pair_weight + [np.zeros(0)]),
            minlength=n * T * T,
        )
        .astype(float)
        .reshape(n, T, T)
    )
    cross += tenant_tier[:, :, None] * vqa[:, None, :]
    cross.reshape(n, T * T)[:, :: T + 1] -= own
    got = bidsums.tier_sum(L["blocks"], a, dinv, cell, kt, tenant_tier, vqa, own, n, T)
    assert np.array_equal(got, cross.sum(axis=0))
