"""Fairness and efficiency figures of an allocation (pure numpy)."""

from __future__ import annotations

import numpy as np

from market.clearing.mechanisms.rules import Market

# Entries of one block's (bundles x tenants) product in envy_count: bounds its memory (32 MB).
ENVY_BLOCK_CELLS = 1 << 22
# Envy below 0.1 % is not counted: the conic solver stops at a relative duality gap of 1e-6,
# and an allocation that close to the optimum can be off by ~sqrt(1e-6) in each share.
ENVY_TOLERANCE = 1e-3
# An upper bound rules a tenant out only this far below its threshold: the bound and the
# exact product add the same terms in another order, so they can differ in the last bits.
ENVY_BOUND_SLACK = 1e-12


def tenant_matrix(market: Market, x: np.ndarray) -> np.ndarray:
    """GPUs per tenant and tier (N, T)."""
    a = market.arrays
    N, T = a.n_tenants, a.n_tiers
    flat = np.bincount(a.arc_tenant * T + a.arc_tier, weights=x, minlength=N * T)
    return flat.reshape(N, T)


def value_matrix(market: Market) -> np.ndarray:
    """Each tenant's value of a GPU on each tier (N, T), credits/GPU-hour; 0 = no bid."""
    a = market.arrays
    values = np.zeros((a.n_tenants, a.n_tiers))
    values[a.arc_tenant, a.arc_tier] = market.value  # equal within a (tenant, tier) group
    return values


def jain(ratios: np.ndarray) -> float:
    if ratios.size == 0 or not np.any(ratios):
        return 1.0
    return float(ratios.sum() ** 2 / (ratios.size * (ratios**2).sum()))


def _running_best(columns: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """For c = 0..U, the maximum of each column of (U, K) over its first c rows and a row
    that holds it (row c = 0: zeros, held by row 0)."""
    best = np.maximum.accumulate(columns, axis=0)
    rows = np.arange(columns.shape[0])[:, None]
    # The last row equal to the running maximum so far holds it.
    held = np.maximum.accumulate(np.where(columns == best, rows, 0), axis=0)
    return (
        np.vstack([np.zeros((1, columns.shape[1])), best]),
        np.vstack([np.zeros((1, columns.shape[1]), dtype=held.dtype), held]),
    )


def envy_count(
    values: np.ndarray, bundles: np.ndarray, entitlement: np.ndarray, demand: np.ndarray
) -> int:
    """Tenants i that prefer another tenant j's bundle, scaled to i's entitlement and shrunk
    to i's total demand: (eta_i / eta_j) min(1, D_i / |x_j|) v_i . x_j > v_i . x_i, with a
    relative tolerance of ENVY_TOLERANCE. Without the shrink every small tenant would "envy"
    every large one for a bundle it could not use.

    values (N, T) credits per GPU-hour, bundles (N, T) GPUs, entitlement and demand (N,).

    The count is exact, and bounds settle nearly every tenant in linear time. With the U
    bundles held sorted by size, those tenant i takes whole (|x_j| <= D_i) are a prefix and
    those it shrinks a suffix; i's best is the larger of max_prefix v_i . x_j / eta_j and
    D_i max_suffix v_i . x_j / (eta_j |x_j|). Running maxima per tier down the sorted
    bundles (and of the bundle's total) bound each from above; the bundles that hold those
    maxima are real bundles, so their values bound it from below: O(U T + N T^2) in all.
    Only a tenant whose threshold lies between its two bounds is checked against every
    bundle, O(U T) each (at a million bids of bench/clearing.py: 26 of 100,000 tenants)."""
    who = np.flatnonzero(entitlement > 0)
    held = who[bundles[who].any(axis=1)]
    if held.size == 0:
        return 0
    by_size = np.argsort(bundles[held].sum(axis=1), kind="stable")
    held = held[by_size]
    size = bundles[held].sum(axis=1)
    per_eta = bundles[held] / entitlement[held, None]  # (U, T) bundle per unit of entitlement
    per_gpu = per_eta / size[:, None]  # (U, T) and per GPU of it
    U, T = per_eta.shape

    v, eta, dem = values[who], entitlement[who], demand[who]
    threshold = (v * bundles[who]).sum(axis=1) * (1 + ENVY_TOLERANCE) + 1e-9
    cut = np.searchsorted(size, dem, side="right")  # [0, cut) whole, [cut, U) shrunk

    # Whole: maxima over the first c bundles. Shrunk: over the last k = U - c (read backwards).
    whole_max, whole_at = _running_best(np.column_stack([per_eta, per_eta.sum(axis=1)]))
    gpu_max, gpu_at = _running_best(np.column_stack([per_gpu, per_gpu.sum(axis=1)])[::-1])
    gpu_at = U - 1 - gpu_at  # rows of the bundles in size order again

    lower, upper = np.zeros(who.size), np.zeros(who.size)
    step = max(1, ENVY_BLOCK_CELLS // ((T + 1) * T))
    for start in range(0, who.size, step):
        s = slice(start, start + step)
        c, k, vb, top = cut[s], U - cut[s], v[s], v[s].max(axis=1)
        wm, gm = whole_max[c], gpu_max[k]  # (B, T + 1): per tier, then of the total
        # v . x <= sum_t v_t max x_t, and <= max_t v_t x's total.
        up_whole = np.minimum((vb * wm[:, :T]).sum(axis=1), top * wm[:, T])
        up_gpu = np.minimum((vb * gm[:, :T]).sum(axis=1), top * gm[:, T])
        upper[s] = np.maximum(up_whole, dem[s] * up_gpu)
        lo_whole = np.einsum("bt,bkt->bk", vb, per_eta[whole_at[c]]).max(axis=1)
        lo_gpu = np.einsum("bt,bkt->bk", vb, per_gpu[gpu_at[k]]).max(axis=1)
        lower[s] = np.maximum(np.where(c > 0, lo_whole, 0.0), dem[s] * np.where(k > 0, lo_gpu, 0.0))
    sure = lower * eta > threshold
    unsettled = np.flatnonzero(~sure & (upper * eta * (1 + ENVY_BOUND_SLACK) > threshold))

    found = 0
    position = np.arange(U)[:, None]
    step = max(1, ENVY_BLOCK_CELLS // U)
    for start in range(0, unsettled.size, step):
        block = unsettled[start : start + step]
        c, vb = cut[block], v[block].T
        prefix = position < c[None, :]  # (U, B): the bundles each takes whole
        whole = np.where(prefix, per_eta @ vb, 0.0).max(axis=0)
        shrunk = np.where(prefix, 0.0, per_gpu @ vb).max(axis=0)
        best = np.maximum(whole, dem[block] * shrunk) * eta[block]
        found += int((best > threshold[block]).sum())
    return int(sure.sum()) + found
