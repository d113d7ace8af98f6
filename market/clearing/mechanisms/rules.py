"""Market rules every mechanism obeys: gangs, share caps, reserved quotas, the guarantee.

- A **gang** bid (minimum above 1 GPU, or above 0 in divisible mode) is all-or-nothing above
  its minimum, and sits on one tier unless the bid allows mixed tiers.
- A **share cap** bounds the GPUs one tenant holds on a tier.
- A **reserved quota** (tenant x tier, optional, empty by default) is GPUs set aside for a
  tenant before any mechanism runs, filled from its highest limits on the tier; the rest of
  the market is shared by the mechanism (``*_room``). With quotas set, they are the tenants'
  guarantee.
- The **guarantee** (sharing incentive): a tenant with weight w_i > 0 gets at least the value
  to it of its best bundle within its entitled share of every tier, w_i / W x C_t GPUs of
  tier t (W sums the weights of the tenants bidding this round), its share caps and its demand —
  that is, min(its demand's value, its weighted equal split's value). Mechanisms hold it as a
  constraint of their programs, never as a reservation, so tenants can still trade tiers.
  In whole-GPU mode the shares are floored to whole GPUs, so the guarantees always hold
  together in whole GPUs. Gang bids carry no guarantee: they cannot be served in part.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from market.clearing.instance.inputs import Arrays

EPS = 1e-9


@dataclass(frozen=True)
class Market:
    arrays: Arrays
    divisible: bool
    is_gang: np.ndarray  # (B,) bool, all-or-nothing above a minimum
    one_tier: np.ndarray  # (B,) bool, a gang that must sit on a single tier
    arc_group: np.ndarray  # (E,) index of the arc's (tenant, tier) group
    group_tenant: np.ndarray  # (G,) tenant index
    group_tier: np.ndarray  # (G,) tier index
    group_cap: np.ndarray  # (G,) GPUs a tenant may hold on the tier
    group_share: np.ndarray  # (G,) GPUs of the tier the tenant is entitled to, fractional
    capped: np.ndarray  # (G,) bool, the tenant's demand there exceeds its cap
    value: np.ndarray  # (E,) tenant's best limit on the arc's tier, credits/GPU-hour
    reserved_quotas_set: bool  # reserved quotas replace the guarantee
    floor_x: np.ndarray  # (E,) GPUs given by the reserved quotas
    bid_room: np.ndarray  # (B,) GPUs a bid may still get after quotas
    tier_room: np.ndarray  # (T,) GPUs left on the tier after quotas
    group_room: np.ndarray  # (G,) GPUs the tenant may still get under its cap


def whole(values: np.ndarray, divisible: bool) -> np.ndarray:
    # The epsilon keeps 0.3 * 10 = 2.9999999999999996 from flooring to 2.
    return values if divisible else np.floor(values + EPS)


def gangs_whole(market: Market, x: np.ndarray) -> np.ndarray:
    """``x`` (E,) with every gang bid below its minimum set to 0: a mixed-integer solve may
    leave a gang it turned down a few 1e-7 GPUs (its switch is 0 only within the solver's
    integrality tolerance), and a gang is all or nothing."""
    a = market.arrays
    got = np.bincount(a.arc_bid, weights=x, minlength=a.n_bids)
    short = market.is_gang & (got < a.min_quantity - 1e-6)
    return np.where(short[a.arc_bid], 0.0, x)


def segment_starts(keys: np.ndarray) -> np.ndarray:
    """Start offsets of the runs of equal values in a sorted key array."""
    if keys.size == 0:
        return np.zeros(0, dtype=np.int64)
    return np.concatenate(([0], np.flatnonzero(np.diff(keys)) + 1))


def unique_inverse(keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``np.unique(keys, return_inverse=True)``, without its sort when ``keys`` are sorted
    already (the bids of arcs in arc order, say). For 200k sorted keys, best of 30: 2.7-4.0 ms
    against 5.6-8.1 ms for numpy's with the inverse, 16-20 ms for ``np.unique(keys)`` alone."""
    if keys.size and np.any(keys[1:] < keys[:-1]):
        return np.unique(keys, return_inverse=True)
    starts = segment_starts(keys)
    first = np.zeros(keys.size, dtype=np.int64)
    first[starts] = 1
    return keys[starts], np.cumsum(first) - 1


def fill_in_order(segment: np.ndarray, wanted: np.ndarray, room: np.ndarray) -> np.ndarray:
    """Items sorted by segment: each segment's ``wanted`` total goes to its items in order,
    each item taking at most its ``room``. Returns what each item takes."""
    before = np.cumsum(room) - room
    starts = segment_starts(segment)
    before -= np.repeat(before[starts], np.diff(np.append(starts, segment.size)))
    return np.clip(wanted - before, 0.0, room)


def build_market(
    arrays: Arrays,
    *,
    divisible: bool,
    reserved_quotas: Mapping[tuple[int, int], float] | None = None,
) -> Market:
    """The instance's groups, caps and shares; ``reserved_quotas`` maps (tenant, tier)
    indices to GPUs."""
    a = arrays
    T, E = a.n_tiers, a.arc_bid.size
    is_gang = a.min_quantity > (0.0 if divisible else 1.0)
    key = a.arc_tenant * T + a.arc_tier
    group_key, arc_group = np.unique(key, return_inverse=True)
    G = group_key.size
    group_tenant, group_tier = group_key // T, group_key % T

    value_g = np.zeros(G)
    np.maximum.at(value_g, arc_group, a.arc_price)
    demand_all = np.bincount(arc_group, weights=a.quantity[a.arc_bid], minlength=G)
    capacity_g = a.capacity[group_tier]
    group_cap = whole(a.cap_share[group_tier] * capacity_g, divisible)
    # W: the weights of every tenant with an acceptable bid, so a share is a slice of the
    # whole market (the proportional share a Fisher market at equal budgets always gives).
    bidding = np.zeros(a.n_tenants, dtype=bool)
    bidding[group_tenant] = True
    total_w = float(a.weight[bidding].sum())
    share = a.weight[group_tenant] * capacity_g / total_w if total_w > 0 else np.zeros(G)
    group_share = np.minimum(share, group_cap)

    floor_x = np.zeros(E)
    room = a.quantity.copy()
    if reserved_quotas:
        wanted = np.zeros(G)
        index = {int(k): g for g, k in enumerate(group_key.tolist())}
        for (tenant, tier), gpus in reserved_quotas.items():
            g = index.get(tenant * T + tier)
            if g is not None:
                wanted[g] = min(whole(np.asarray(float(gpus)), divisible), group_cap[g])
        floor_x, room = _reserve(a, arc_group, ~is_gang, wanted)
    group_floor = np.bincount(arc_group, weights=floor_x, minlength=G)
    tier_room = a.capacity - np.bincount(a.arc_tier, weights=floor_x, minlength=T)
    return Market(
        arrays=a,
        divisible=divisible,
        is_gang=is_gang,
        one_tier=is_gang & ~a.mixed_tiers,
        arc_group=arc_group,
        group_tenant=group_tenant,
        group_tier=group_tier,
        group_cap=group_cap,
        group_share=group_share,
        # A share of 1 is the tier's capacity itself, which the tier row already holds.
        capped=(a.cap_share[group_tier] < 1.0) & (demand_all > group_cap + EPS),
        value=value_g[arc_group],
        reserved_quotas_set=bool(reserved_quotas),
        floor_x=floor_x,
        bid_room=room,
        tier_room=np.maximum(tier_room, 0.0),
        group_room=np.maximum(group_cap - group_floor, 0.0),
    )


def _reserve(
    a: Arrays, arc_group: np.ndarray, divisible_bid: np.ndarray, wanted: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Fill each (tenant, tier) quota from the tenant's highest limits there (ties: bid id),
    tiers in instance order; a bid used up on an earlier tier is not counted again, so the
    quotas that stand are feasible together. Gang bids never fill a quota."""
    room = a.quantity.copy()
    floor_x = np.zeros(a.arc_bid.size)
    for t in range(a.n_tiers):
        idx = np.flatnonzero((a.arc_tier == t) & divisible_bid[a.arc_bid] & (wanted[arc_group] > 0))
        if idx.size == 0:
            continue
        idx = idx[np.lexsort((a.arc_bid[idx], -a.arc_price[idx], arc_group[idx]))]
        take = fill_in_order(arc_group[idx], wanted[arc_group[idx]], room[a.arc_bid[idx]])
        floor_x[idx] = take
        room[a.arc_bid[idx]] -= take  # a bid has one arc per tier, so no index repeats
    return floor_x, room


def weight_quotas(arrays: Arrays, *, divisible: bool) -> dict[tuple[int, int], float]:
    """Quotas that reproduce a per-tier split by weight: w_i / W_t of every tier a tenant
    bids on (W_t over the tenants bidding there), floored to whole GPUs."""
    a = arrays
    T = a.n_tiers
    pairs = np.unique(a.arc_tenant * T + a.arc_tier)
    tenant, tier = pairs // T, pairs % T
    w = a.weight[tenant]
    total = np.bincount(tier, weights=w, minlength=T)[tier]
    share = np.divide(w * a.capacity[tier], total, out=np.zeros(pairs.size), where=total > 0)
    share = np.minimum(
        whole(share, divisible), whole(a.cap_share[tier] * a.capacity[tier], divisible)
    )
    return {
        (int(i), int(t)): float(s)
        for i, t, s in zip(tenant.tolist(), tier.tolist(), share.tolist(), strict=True)
        if s > 0
    }


@dataclass(frozen=True)
class OpenMarket:
    arc_bid: np.ndarray  # (E,) bid index, sorted
    arc_tier: np.ndarray  # (E,) tier index
    arc_capped: np.ndarray  # (E,) capped-group index, -1 if the arc's group has no binding cap
    arc_price: np.ndarray  # (E,) what a GPU on the arc is worth to the program
    bid_room: np.ndarray  # (B,) GPUs
    group_room: np.ndarray  # (G,) GPUs
    tier_room: np.ndarray  # (T,) GPUs


@dataclass(frozen=True)
class Outcome:
    """What a mechanism hands back to ``clear``."""

    x: np.ndarray  # (E,) GPUs per arc, quotas included
    prices: np.ndarray  # (T,) credits/GPU-hour, at or above the reserve
    status: str  # "optimal", "time_limit", "fallback" or "inaccurate"
    solve_seconds: float
    rounding_seconds: float
    rounding_loss: float  # the mechanism's objective lost by whole-GPU rounding
    entitlement: np.ndarray  # (N,) weights used for envy: budgets (fisher) or weights
    values: np.ndarray  # (N, T) value of a GPU to each tenant, credits/GPU-hour
    arc_value: np.ndarray  # (E,) value of a GPU on the arc to its tenant (the guarantee's unit)
    guarantee: np.ndarray  # (N,) guaranteed value, arc_value units
    fair: np.ndarray  # (N,) value of the weighted equal split (fractional shares), same units
    budget_cap: np.ndarray | None = None  # (N,) most a tenant may be charged, credits/hour


def open_market(market: Market, *, arc_price: np.ndarray | None = None) -> OpenMarket:
    """The room left after quotas, every arc; ``arc_price`` defaults to the limits."""
    a = market.arrays
    return OpenMarket(
        arc_bid=a.arc_bid,
        arc_tier=a.arc_tier,
        arc_capped=np.where(market.capped, np.arange(market.capped.size), -1)[market.arc_group],
        arc_price=a.arc_price if arc_price is None else arc_price,
        bid_room=market.bid_room.copy(),
        group_room=market.group_room.copy(),
        tier_room=market.tier_room.copy(),
    )
