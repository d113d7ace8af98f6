"""Market rules shared by every policy: gangs, share caps and entitlement floors.

The entitlement floor is a reservation made before any policy runs. For each tier, a
tenant with weight w_i gets w_i / W_t of the capacity (W_t sums the weights of the tenants
with an acceptable bid on the tier), floored to whole GPUs, capped by the tier's share cap
and by its divisible demand there. The reservation is filled from the tenant's highest
limits on the tier (ties: bid id), tiers in instance order; a bid already used up by an
earlier tier's floor is not counted again, so the floors that stand (``group_floor``) are
always feasible together. Gang bids never fill a floor: they cannot be served in part.
Policies then share out what is left (``*_room``), so every policy holds the floors.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .inputs import Arrays

EPS = 1e-9


@dataclass(frozen=True)
class Market:
    arrays: Arrays
    divisible: bool
    is_gang: np.ndarray  # (B,) bool, all-or-nothing above a minimum
    arc_group: np.ndarray  # (E,) index of the arc's (tenant, tier) group
    group_tenant: np.ndarray  # (G,) tenant index
    group_tier: np.ndarray  # (G,) tier index
    group_cap: np.ndarray  # (G,) GPUs a tenant may hold on the tier
    group_floor: np.ndarray  # (G,) GPUs reserved for the tenant on the tier
    capped: np.ndarray  # (G,) bool, the tenant's demand there exceeds its cap
    value: np.ndarray  # (E,) tenant's best limit on the arc's tier, credits/GPU-hour
    floor_x: np.ndarray  # (E,) GPUs given by the floor reservation
    bid_room: np.ndarray  # (B,) GPUs a bid may still get after floors
    tier_room: np.ndarray  # (T,) GPUs left on the tier after floors
    group_room: np.ndarray  # (G,) GPUs the tenant may still get under its cap


def _whole(values: np.ndarray, divisible: bool) -> np.ndarray:
    # The epsilon keeps 0.3 * 10 = 2.9999999999999996 from flooring to 2.
    return values if divisible else np.floor(values + EPS)


def segment_starts(keys: np.ndarray) -> np.ndarray:
    """Start offsets of the runs of equal values in a sorted key array."""
    if keys.size == 0:
        return np.zeros(0, dtype=np.int64)
    return np.concatenate(([0], np.flatnonzero(np.diff(keys)) + 1))


def build_market(arrays: Arrays, *, divisible: bool) -> Market:
    a = arrays
    T, E = a.n_tiers, a.arc_bid.size
    mq = a.min_quantity
    is_gang = mq > (0.0 if divisible else 1.0)
    arc_tenant = a.arc_tenant
    key = arc_tenant * T + a.arc_tier
    group_key, arc_group = np.unique(key, return_inverse=True)
    G = group_key.size
    group_tenant, group_tier = group_key // T, group_key % T

    value_g = np.zeros(G)
    np.maximum.at(value_g, arc_group, a.arc_price)
    demand_all = np.bincount(arc_group, weights=a.quantity[a.arc_bid], minlength=G)
    divisible_arc = ~is_gang[a.arc_bid]
    demand_div = np.bincount(arc_group, weights=a.quantity[a.arc_bid] * divisible_arc, minlength=G)

    capacity_g = a.capacity[group_tier]
    group_cap = _whole(a.cap_share[group_tier] * capacity_g, divisible)
    w = a.weight[group_tenant]
    total_w = np.bincount(group_tier, weights=w, minlength=T)[group_tier]
    share = np.divide(w * capacity_g, total_w, out=np.zeros(G), where=total_w > 0)
    wanted = np.minimum(np.minimum(_whole(share, divisible), group_cap), demand_div)

    room = a.quantity.copy()
    floor_x = np.zeros(E)
    for t in range(T):
        idx = np.flatnonzero((a.arc_tier == t) & divisible_arc & (wanted[arc_group] > 0))
        if idx.size == 0:
            continue
        idx = idx[np.lexsort((a.arc_bid[idx], -a.arc_price[idx], arc_group[idx]))]
        g = arc_group[idx]
        rem = room[a.arc_bid[idx]]
        before = np.cumsum(rem) - rem
        starts = segment_starts(g)
        before -= np.repeat(before[starts], np.diff(np.append(starts, idx.size)))
        take = np.clip(wanted[g] - before, 0.0, rem)
        floor_x[idx] = take
        room[a.arc_bid[idx]] -= take  # a bid has one arc per tier, so no index repeats

    group_floor = np.bincount(arc_group, weights=floor_x, minlength=G)
    tier_room = a.capacity - np.bincount(a.arc_tier, weights=floor_x, minlength=T)
    return Market(
        arrays=a,
        divisible=divisible,
        is_gang=is_gang,
        arc_group=arc_group,
        group_tenant=group_tenant,
        group_tier=group_tier,
        group_cap=group_cap,
        group_floor=group_floor,
        # A share of 1 is the tier's capacity itself, which the tier row already holds.
        capped=(a.cap_share[group_tier] < 1.0) & (demand_all > group_cap + EPS),
        value=value_g[arc_group],
        floor_x=floor_x,
        bid_room=room,
        tier_room=np.maximum(tier_room, 0.0),
        group_room=np.maximum(group_cap - group_floor, 0.0),
    )


@dataclass(frozen=True)
class OpenMarket:
    arc_bid: np.ndarray  # (E,) bid index, sorted
    arc_tier: np.ndarray  # (E,) tier index
    arc_capped: np.ndarray  # (E,) capped-group index, -1 if the arc's group has no binding cap
    arc_price: np.ndarray  # (E,) credits/GPU-hour
    bid_room: np.ndarray  # (B,) GPUs
    group_room: np.ndarray  # (G,) GPUs
    tier_room: np.ndarray  # (T,) GPUs


@dataclass(frozen=True)
class Outcome:
    """What a policy hands back to ``clear``."""

    x: np.ndarray  # (E,) GPUs per arc, floors included
    prices: np.ndarray  # (T,) credits/GPU-hour, at or above the reserve
    status: str  # "optimal", "time_limit" or "fallback"
    solve_seconds: float
    rounding_seconds: float
    rounding_loss: float  # the policy's objective lost by whole-GPU rounding
    entitlement: np.ndarray  # (N,) weights used for envy: budgets (fisher) or weights
    values: np.ndarray  # (N, T) value of a GPU to each tenant, credits/GPU-hour


def open_market(market: Market, *, bids: np.ndarray | None = None) -> OpenMarket:
    """The arcs of the given bids (all by default) over the room left after floors."""
    keep = (
        np.ones(market.arrays.arc_bid.size, dtype=bool)
        if bids is None
        else bids[market.arrays.arc_bid]
    )
    return OpenMarket(
        arc_bid=market.arrays.arc_bid[keep],
        arc_tier=market.arrays.arc_tier[keep],
        arc_capped=np.where(market.capped, np.arange(market.capped.size), -1)[
            market.arc_group[keep]
        ],
        arc_price=market.arrays.arc_price[keep],
        bid_room=market.bid_room.copy(),
        group_room=market.group_room.copy(),
        tier_room=market.tier_room.copy(),
    )
