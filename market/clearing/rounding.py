"""Whole-GPU rounding of a fractional allocation, in the mechanism's own priority.

Flooring every arc keeps every upper bound (bid quantity, share cap, tier capacity), since
those are whole numbers. The GPUs that flooring frees are handed out again one at a time,
in passes: in each pass every tenant may get at most one GPU, tenants taken in order of

1. the furthest below its guarantee (utility / guarantee, lowest first),
2. the mechanism's priority at the current utilities (highest first),
3. tenant index (names sorted), for a deterministic tie-break;

a tenant's GPU goes to its arc with the largest fractional part that still has room (ties:
bid id, then tier). Priorities are recomputed between passes, so a tenant that got a GPU
falls back behind the others, as the mechanism would have it. A gang bid that ends below
its minimum is dropped to 0, which no hard constraint forbids.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from .rules import EPS, OpenMarket


def round_whole(
    m: OpenMarket,
    *,
    x: np.ndarray,
    arc_tenant: np.ndarray,
    arc_value: np.ndarray,
    guarantee: np.ndarray,
    priority: Callable[[np.ndarray], np.ndarray],
    gang_min: np.ndarray,
) -> np.ndarray:
    """Whole GPUs per arc (E,). ``priority(utility (N,)) -> (N,)``, higher goes first;
    gang_min (B,): GPUs a kept gang bid needs, 0 otherwise."""
    T, B, G, N = m.tier_room.size, m.bid_room.size, m.group_room.size, guarantee.size
    xi = np.floor(x + EPS)
    frac = x - xi
    bid_left = m.bid_room - np.bincount(m.arc_bid, weights=xi, minlength=B)
    tier_left = m.tier_room - np.bincount(m.arc_tier, weights=xi, minlength=T)
    capped = m.arc_capped >= 0
    group_left = m.group_room - np.bincount(m.arc_capped[capped], weights=xi[capped], minlength=G)
    utility = np.bincount(arc_tenant, weights=arc_value * xi, minlength=N)

    candidates = np.flatnonzero(frac > EPS)
    # Per tenant, its candidate arcs in the order it would take them.
    candidates = candidates[
        np.lexsort((m.arc_tier[candidates], m.arc_bid[candidates], -frac[candidates]))
    ]
    by_tenant: dict[int, list[int]] = {}
    for e in candidates.tolist():
        by_tenant.setdefault(int(arc_tenant[e]), []).append(e)
    while by_tenant and tier_left.max(initial=0.0) >= 1.0 - EPS:
        below = np.where(guarantee > EPS, utility / np.maximum(guarantee, EPS), np.inf)
        score = priority(utility)
        tenants = np.array(sorted(by_tenant))
        order = tenants[np.lexsort((tenants, -score[tenants], np.minimum(below[tenants], 1.0)))]
        given = False
        for i in order.tolist():
            arcs = by_tenant[i]
            for k, e in enumerate(arcs):
                g = m.arc_capped[e]
                if (
                    bid_left[m.arc_bid[e]] >= 1.0 - EPS
                    and tier_left[m.arc_tier[e]] >= 1.0 - EPS
                    and (g < 0 or group_left[g] >= 1.0 - EPS)
                ):
                    xi[e] += 1.0
                    bid_left[m.arc_bid[e]] -= 1.0
                    tier_left[m.arc_tier[e]] -= 1.0
                    if g >= 0:
                        group_left[g] -= 1.0
                    utility[i] += arc_value[e]
                    del arcs[k]
                    given = True
                    break
            # Arcs with no room left now will have none later either: drop them.
            by_tenant[i] = [
                e
                for e in arcs
                if bid_left[m.arc_bid[e]] >= 1.0 - EPS and tier_left[m.arc_tier[e]] >= 1.0 - EPS
            ]
            if not by_tenant[i]:
                del by_tenant[i]
        if not given:
            break
    total = np.bincount(m.arc_bid, weights=xi, minlength=B)
    drop = (gang_min > 0) & (total < gang_min - EPS)
    xi[drop[m.arc_bid]] = 0.0
    return xi
