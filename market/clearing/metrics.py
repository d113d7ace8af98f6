"""Fairness and efficiency figures of an allocation (pure numpy)."""

from __future__ import annotations

import numpy as np

from .market import Market

ENVY_BLOCK = 2048  # tenants per block of the pairwise envy product, bounds memory


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


def equal_split_utility(market: Market, values: np.ndarray) -> np.ndarray:
    """e_i (N,): utility of an equal split of every tier among the tenants bidding on it,
    each tier's slice capped by the tenant's demand there, the bundle scaled down to the
    tenant's total demand."""
    a = market.arrays
    N, T = a.n_tenants, a.n_tiers
    demand_g = np.bincount(
        market.arc_group, weights=a.quantity[a.arc_bid], minlength=market.group_tier.size
    )
    bidders = np.bincount(market.group_tier, minlength=T)
    slice_t = np.divide(a.capacity, bidders, out=np.zeros(T), where=bidders > 0)
    bundle = np.zeros((N, T))
    bundle[market.group_tenant, market.group_tier] = np.minimum(
        slice_t[market.group_tier], demand_g
    )
    total = np.bincount(a.bid_tenant, weights=a.quantity, minlength=N)
    size = bundle.sum(axis=1)
    scale = np.minimum(1.0, np.divide(total, size, out=np.ones(N), where=size > 0))
    return scale * (bundle * values).sum(axis=1)


def share_ratios(utility: np.ndarray, weight: np.ndarray, fair: np.ndarray) -> np.ndarray:
    """u_i / (w_i e_i) for the tenants with an entitlement (w_i > 0 and e_i > 0)."""
    counted = (weight > 0) & (fair > 0)
    return utility[counted] / (weight[counted] * fair[counted])


def jain(ratios: np.ndarray) -> float:
    if ratios.size == 0 or not np.any(ratios):
        return 1.0
    return float(ratios.sum() ** 2 / (ratios.size * (ratios**2).sum()))


def envy_count(values: np.ndarray, bundles: np.ndarray, entitlement: np.ndarray) -> int:
    """Tenants i that prefer some j's bundle scaled to their entitlement:
    (eta_i / eta_j) v_i . x_j > v_i . x_i (relative tolerance 1e-6)."""
    who = np.flatnonzero(entitlement > 0)
    held = who[bundles[who].any(axis=1)]
    if held.size == 0:
        return 0
    # Equal normalised bundles give equal products; dropping repeats shrinks the product.
    scaled = np.unique(bundles[held] / entitlement[held, None], axis=0)
    own = (values * bundles).sum(axis=1)
    count = 0
    for start in range(0, who.size, ENVY_BLOCK):
        block = who[start : start + ENVY_BLOCK]
        best = (values[block] @ scaled.T).max(axis=1) * entitlement[block]
        count += int(np.count_nonzero(best > own[block] * (1 + 1e-6) + 1e-9))
    return count
