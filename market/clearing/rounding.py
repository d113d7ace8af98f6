"""Whole-GPU rounding of a fractional open-market allocation.

Flooring every arc keeps every upper bound (bid quantity, share cap, tier capacity), since
those are whole numbers. The capacity that flooring frees is then handed out one GPU per
arc, tier by tier, to the arcs with the largest fractional part: first to kept gang bids
still short of their minimum, then by fractional part, then by the policy's priority, then
by bid id. A gang bid that still ends below its minimum is dropped to 0, which no hard
constraint forbids. Floors are untouched: they are whole and were reserved beforehand.
"""

from __future__ import annotations

import numpy as np

from .market import EPS, OpenMarket, segment_starts


def round_whole(
    m: OpenMarket, *, x: np.ndarray, priority: np.ndarray, gang_min: np.ndarray
) -> np.ndarray:
    """Whole GPUs per arc (E,). gang_min (B,): GPUs a kept gang bid needs, 0 otherwise."""
    T, B, G = m.tier_room.size, m.bid_room.size, m.group_room.size
    xi = np.floor(x + EPS)
    frac = x - xi
    bid_left = m.bid_room - np.bincount(m.arc_bid, weights=xi, minlength=B)
    tier_left = m.tier_room - np.bincount(m.arc_tier, weights=xi, minlength=T)
    capped = m.arc_capped >= 0
    group_left = m.group_room - np.bincount(m.arc_capped[capped], weights=xi[capped], minlength=G)
    short = gang_min > np.bincount(m.arc_bid, weights=xi, minlength=B) + EPS
    for t in range(T):
        idx = np.flatnonzero((m.arc_tier == t) & (frac > EPS))
        idx = idx[bid_left[m.arc_bid[idx]] >= 1.0 - EPS]
        if idx.size == 0 or tier_left[t] < 1.0 - EPS:
            continue
        idx = idx[np.lexsort((m.arc_bid[idx], -priority[idx], -frac[idx], ~short[m.arc_bid[idx]]))]
        g = m.arc_capped[idx]
        ok = np.ones(idx.size, dtype=bool)
        has = g >= 0
        if has.any():
            sub = np.flatnonzero(has)
            order = sub[np.argsort(g[sub], kind="stable")]
            gs = g[order]
            starts = segment_starts(gs)
            rank = np.arange(order.size) - np.repeat(starts, np.diff(np.append(starts, order.size)))
            ok[order] = rank < np.floor(group_left[gs] + EPS)
        idx = idx[ok][: int(np.floor(tier_left[t] + EPS))]
        xi[idx] += 1.0
        bid_left[m.arc_bid[idx]] -= 1.0
        tier_left[t] -= idx.size
        np.subtract.at(group_left, m.arc_capped[idx][m.arc_capped[idx] >= 0], 1.0)
    total = np.bincount(m.arc_bid, weights=xi, minlength=B)
    drop = (gang_min > 0) & (total < gang_min - EPS)
    xi[drop[m.arc_bid]] = 0.0
    return xi
