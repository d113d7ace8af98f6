"""A tenant's interchangeable bids as one: the same market with fewer bids, for maxmin and
fisher.

Both value a tenant's GPU on a tier at the tenant's own value of that tier, whatever bid it
comes from, so two divisible bids of one tenant on the same tiers are interchangeable:
every allocation of the pair is one of a single bid of both quantities, and the program, its
optimum and its tenants' utilities are the same (and the guarantees: a tenant's rank function
sums the demand of its bids by their tiers). A round of a few large tenants (research teams
of hundreds of jobs each) has few distinct tier sets per tenant: 100 tenants of 300 bids on
8 tiers give about 8k such pools for 30k bids, and HiGHS's interior point took 2.3 s on the
whole program where it takes a quarter of that on the pooled one (docs/clearing.md).

Gang bids stay as they are. A pool's limit on a tier is its bids' best (the market's value of
the tier for the tenant is unchanged); the prices are set on the original bids afterwards.
What a pool wins goes to its bids by their best limit, highest first, then in id order, each
filled before the next gets any, its tiers taken in index order: the bid that offers more
wins, and among equal offers the earlier one, as in the welfare clear. (So the bids a tenant
leaves wanting are its lowest offers, and maxmin's price, the highest limit left wanting on
a tier, is no higher than it must be.)
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from market.clearing.mechanisms.rules import Market, Outcome, build_market

# Pool only where it makes the market at most this share of its bids. Measured (maxmin, 8
# tiers): pools of 53 % of 100k bids (1,000 tenants) 24.2 -> 12.5 s, of 76 % (3,000) 2.28 ->
# 1.56 s; of 81 % (the platform's parts and the benchmark's 10k bids, ten bids a tenant) about
# 5 %, within the noise for fisher; above that it would mostly cost its own passes.
POOL_BELOW = 0.8


@dataclass(frozen=True)
class Pools:
    """``market``: the pooled market; per arc of the original market, ``pool_arc``: its
    pool's arc on the same tier, and ``bid_lo``, ``bid_hi``: where its bid's GPUs begin and
    end, counted over its pool's bids in the order they are served. An arc gets the overlap
    of that span with the span of its pool's arc, the pool's arcs' GPUs counted in tier
    order."""

    market: Market
    pool_arc: np.ndarray
    bid_lo: np.ndarray
    bid_hi: np.ndarray

    def spread(self, x: np.ndarray) -> np.ndarray:
        """GPUs per original arc from ``x``, GPUs per pooled arc: each pool's bids in the order
        they are served take what its arcs hold, in tier order; whole numbers stay whole."""
        pa = self.market.arrays
        ends = np.cumsum(x)
        # The pool's arcs' GPUs counted from its first arc (arcs are in pool order).
        first = np.searchsorted(pa.arc_bid, pa.arc_bid)  # each pooled arc's pool's first arc
        before = ends - x - (ends[first] - x[first])
        arc_lo, arc_hi = before[self.pool_arc], (before + x)[self.pool_arc]
        return np.maximum(0.0, np.minimum(arc_hi, self.bid_hi) - np.maximum(arc_lo, self.bid_lo))


def on_pools(
    market: Market,
    run: Callable[[Market, Mapping[str, Any]], Outcome],
    params: Mapping[str, Any],
    *,
    budget: np.ndarray | None = None,
) -> Outcome:
    """``run`` (a mechanism) on the pooled market where ``pools`` gives one, its awards spread
    over the bids (``x``, and ``arc_value`` per arc of the bids); else on ``market`` itself.
    What a mechanism sets from the bids' own limits (maxmin's prices) it sets again on
    ``market``."""
    pooled = pools(market, budget=budget)
    if pooled is None:
        return run(market, params)
    out = run(pooled.market, params)
    a = market.arrays
    return replace(out, x=pooled.spread(out.x), arc_value=out.values[a.arc_tenant, a.arc_tier])


def pools(market: Market, *, budget: np.ndarray | None = None) -> Pools | None:
    """The market with each tenant's divisible bids on the same tiers as one bid; None where
    reserved quotas are set or pooling would not bring the bids to POOL_BELOW of them.
    ``budget`` (N,): the tenants' budgets to give the pooled market, where they come from the
    bids' own limits (fisher's), which a pool's best limit would change."""
    if market.reserved_quotas_set:
        return None
    a = market.arrays
    B, T = a.n_bids, a.n_tiers
    if B == 0:
        return None
    mask = np.bincount(a.arc_bid, weights=(1 << a.arc_tier).astype(float), minlength=B)
    # A gang is a pool of its own: its key is past every tier set.
    key = np.where(
        market.is_gang,
        (1 << T) * (a.n_tenants + 1) + np.arange(B),
        a.bid_tenant * (1 << T) + mask.astype(np.int64),
    )
    _, first, pool_of = np.unique(key, return_index=True, return_inverse=True)
    if first.size > POOL_BELOW * B:
        return None
    # Pools numbered by their first bid, so that they are in id order as bids are.
    rank = np.empty(first.size, dtype=np.int64)
    rank[np.argsort(first, kind="stable")] = np.arange(first.size)
    pool_of = rank[pool_of.ravel()]
    first = np.sort(first)
    P = first.size
    quantity = np.bincount(pool_of, weights=a.quantity, minlength=P)
    arc_key = pool_of[a.arc_bid] * T + a.arc_tier
    keys, pool_arc = np.unique(arc_key, return_inverse=True)
    pool_arc = pool_arc.ravel()
    price = np.full(keys.size, -np.inf)
    np.maximum.at(price, pool_arc, a.arc_price)
    pooled = replace(
        a,
        bid_ids=tuple(a.bid_ids[b] for b in first.tolist()),
        bid_tenant=a.bid_tenant[first],
        quantity=quantity,
        min_quantity=np.where(market.is_gang[first], a.min_quantity[first], 0.0),
        mixed_tiers=a.mixed_tiers[first],
        arc_bid=keys // T,
        arc_tier=keys % T,
        arc_price=price,
        budget=a.budget if budget is None else budget,
    )
    # Each bid's GPUs counted within its pool, the pool's bids by their best limit, highest
    # first, then in id order.
    best = np.zeros(B)
    np.maximum.at(best, a.arc_bid, a.arc_price)
    order = np.lexsort((np.arange(B), -best, pool_of))
    ends = np.cumsum(a.quantity[order])
    starts = ends - a.quantity[order]
    pool_start = np.searchsorted(pool_of[order], pool_of[order])
    lo = np.empty(B)
    lo[order] = starts - starts[pool_start]
    return Pools(
        market=build_market(pooled, divisible=market.divisible),
        pool_arc=pool_arc,
        bid_lo=lo[a.arc_bid],
        bid_hi=(lo + a.quantity)[a.arc_bid],
    )
