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
from dataclasses import dataclass

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
    capped = m.arc_capped >= 0
    # Candidate arcs, grouped by tenant, each tenant's in the order it would take them.
    arc = np.flatnonzero(frac > EPS)
    arc = arc[np.lexsort((m.arc_tier[arc], m.arc_bid[arc], -frac[arc], arc_tenant[arc]))]
    s = _State(
        xi=xi,
        bid_left=m.bid_room - np.bincount(m.arc_bid, weights=xi, minlength=B),
        tier_left=m.tier_room - np.bincount(m.arc_tier, weights=xi, minlength=T),
        group_left=m.group_room
        - np.bincount(m.arc_capped[capped], weights=xi[capped], minlength=G),
        utility=np.bincount(arc_tenant, weights=arc_value * xi, minlength=N),
        arc=arc,
        owner=arc_tenant[arc],
        taken=np.zeros(arc.size, dtype=bool),
    )
    while arc.size and s.tier_left.max(initial=0.0) >= 1.0 - EPS:
        rank = _rank(s.utility, guarantee, priority(s.utility))
        if not _one_pass(m, s, arc_value=arc_value, rank=rank):
            break
    total = np.bincount(m.arc_bid, weights=xi, minlength=B)
    drop = (gang_min > 0) & (total < gang_min - EPS)
    xi[drop[m.arc_bid]] = 0.0
    return xi


@dataclass(frozen=True)
class _State:
    """What the passes change, in place."""

    xi: np.ndarray  # (E,) whole GPUs per arc
    bid_left: np.ndarray  # (B,) room left
    tier_left: np.ndarray  # (T,)
    group_left: np.ndarray  # (G,)
    utility: np.ndarray  # (N,) value of xi to each tenant
    arc: np.ndarray  # (C,) candidate arcs, grouped by tenant, in the order it takes them
    owner: np.ndarray  # (C,) the tenant of each candidate
    taken: np.ndarray  # (C,) bool, the candidate already got its GPU


def _rank(utility: np.ndarray, guarantee: np.ndarray, score: np.ndarray) -> np.ndarray:
    """(N,) each tenant's place in a pass: furthest below its guarantee, then priority, then
    index."""
    below = np.where(guarantee > EPS, utility / np.maximum(guarantee, EPS), np.inf)
    order = np.lexsort((np.arange(utility.size), -score, np.minimum(below, 1.0)))
    rank = np.empty(utility.size, dtype=np.int64)
    rank[order] = np.arange(utility.size)
    return rank


def _one_pass(m: OpenMarket, s: _State, *, arc_value: np.ndarray, rank: np.ndarray) -> bool:
    """One GPU to each tenant that can take one, in ``rank`` order; True if any was given.

    Bids and share-cap groups belong to one tenant, which takes at most one GPU a pass, so
    only tier room is contested within a pass. Each tenant's first arc with room is found
    for all tenants at once; the grants are accepted in rank order up to the first that
    would overfill a tier, that tier is closed, and the tenants from there on choose again
    (at most one round per tier).
    """
    room = np.floor(s.tier_left + EPS)
    done = np.zeros(rank.size, dtype=bool)  # tenants served or passed over in this pass
    given = False
    while True:
        g = m.arc_capped[s.arc]
        group_ok = g < 0
        group_ok[~group_ok] = s.group_left[g[~group_ok]] >= 1.0 - EPS
        ok = (
            ~s.taken
            & ~done[s.owner]
            & group_ok
            & (s.bid_left[m.arc_bid[s.arc]] >= 1.0 - EPS)
            & (room[m.arc_tier[s.arc]] >= 1.0)
        )
        pick = np.flatnonzero(ok)
        if pick.size == 0:
            return given
        # The first arc of each tenant (candidates are grouped by tenant, in its order).
        pick = pick[np.r_[True, s.owner[pick][1:] != s.owner[pick][:-1]]]
        pick = pick[np.argsort(rank[s.owner[pick]], kind="stable")]
        tier = m.arc_tier[s.arc[pick]]
        # k-th grant on its tier, in rank order (1-based).
        order = np.argsort(tier, kind="stable")
        count = np.empty(pick.size, dtype=np.int64)
        starts = np.r_[0, np.flatnonzero(np.diff(tier[order])) + 1]
        lengths = np.diff(np.r_[starts, order.size])
        count[order] = np.arange(order.size) - np.repeat(starts, lengths) + 1
        over = np.flatnonzero(count > room[tier])
        stop = over[0] if over.size else pick.size
        k = pick[:stop]
        e = s.arc[k]
        s.xi[e] += 1.0
        s.taken[k] = True
        done[s.owner[k]] = True
        np.subtract.at(s.bid_left, m.arc_bid[e], 1.0)
        np.subtract.at(s.tier_left, m.arc_tier[e], 1.0)
        np.subtract.at(room, m.arc_tier[e], 1.0)
        c = m.arc_capped[e]
        np.subtract.at(s.group_left, c[c >= 0], 1.0)
        np.add.at(s.utility, s.owner[k], arc_value[e])
        given = given or stop > 0
        if stop == pick.size:
            return given
