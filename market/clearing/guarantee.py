"""The guarantee (sharing incentive) of every tenant: its value and the bundle that gives it.

A tenant with weight w_i > 0 is entitled to w_i / W of every tier (W: the weights of the
tenants bidding this round), within its share caps. Its guarantee is the value, in the given
per-arc values, of its best bundle within those shares and its non-gang demand.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from . import lp
from .rules import Market, fill_in_order, whole
from .transport import Paths

CHUNK_ARCS = 2000  # arcs per transport LP (the fallback)
# A tenant with more bids than this goes straight to the LP: the paths push one path per
# tenant per round and each round costs its whole block, so one tenant of 25k bids kept a
# part busy for 19 s before the round limit handed it to the LP anyway (docs/clearing.md).
BIG_TENANT_BIDS = 2_000


def guarantee_and_fair(
    market: Market, arc_value: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(g, y, fair): ``guarantee_bundles``'s guarantee and bundle, and the fractional-share
    normaliser (``guarantee_bundles(fractional=True)``'s value, begun from that bundle; g
    itself in divisible mode). When both problems have the same arcs (every share of a tier
    a tenant bids on is at least one GPU), the path search is built once for both."""
    g, y, search = _bundles(market, arc_value, fractional=False, start=None, search=None)
    if market.divisible:
        return g, y, g
    fair, _, _ = _bundles(market, arc_value, fractional=True, start=y, search=search)
    return g, y, fair


def guarantee_bundles(
    market: Market,
    arc_value: np.ndarray,
    *,
    fractional: bool = False,
    start: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """(g (N,), y (E,)): the value, in ``arc_value`` units, each tenant is guaranteed, and the
    bundle that achieves it (GPUs per arc, whole in whole-GPU mode); shares are
    floored to whole GPUs in whole-GPU mode unless ``fractional`` (a normaliser, not a
    constraint).

    With reserved quotas, the value of the tenant's quota. Otherwise the best bundle within
    the tenant's entitled shares and its non-gang demand: a transport problem per tenant,
    solved greedily for tenants with one such bid and, for the others, all at once by
    longest augmenting paths (transport.py; exact for any data, whole bundles from whole
    shares), with an LP per chunk of tenants for a tenant that path search left unsolved
    and for a tenant of more than BIG_TENANT_BIDS bids. ``start`` (E,): bundles of the same
    values for shares no larger (the whole-share bundles, for the fractional normaliser),
    from which the path search begins instead of from nothing.
    """
    g, y, _ = _bundles(market, arc_value, fractional=fractional, start=start, search=None)
    return g, y


@dataclass(frozen=True)
class _Search:
    """A path search (transport.Paths) and the arcs it was built on."""

    arcs: np.ndarray
    paths: Paths


def _bundles(
    market: Market,
    arc_value: np.ndarray,
    *,
    fractional: bool,
    start: np.ndarray | None,
    search: _Search | None,
) -> tuple[np.ndarray, np.ndarray, _Search | None]:
    """``guarantee_bundles``, and the path search it used (None if none); ``search``: one
    built by an earlier call on the same values, used again when this call's arcs are the
    same."""
    a = market.arrays
    N = a.n_tenants
    if market.quotas_set:
        held = np.bincount(a.arc_tenant, weights=arc_value * market.floor_x, minlength=N)
        return held, market.floor_x.copy(), None
    share = whole(market.group_share, market.divisible or fractional)
    ok = ~market.is_gang[a.arc_bid] & (arc_value > 0) & (share[market.arc_group] > 0)
    eligible = np.flatnonzero(ok)
    bids_of = np.zeros(a.n_bids)
    bids_of[a.arc_bid[eligible]] = 1.0
    per_tenant = np.bincount(a.bid_tenant, weights=bids_of, minlength=N)
    single = per_tenant[a.arc_tenant[eligible]] == 1
    g = np.zeros(N)
    y = np.zeros(a.arc_bid.size)

    one = eligible[single]
    one = one[np.lexsort((-arc_value[one], a.arc_bid[one]))]
    take = fill_in_order(a.arc_bid[one], a.quantity[a.arc_bid[one]], share[market.arc_group[one]])
    np.add.at(g, a.arc_tenant[one], arc_value[one] * take)
    y[one] = take

    many = eligible[~single]
    if many.size:
        big = per_tenant[a.arc_tenant[many]] > BIG_TENANT_BIDS
        paths = many[~big]
        if search is None or not np.array_equal(search.arcs, paths):
            built = Paths(
                a.arc_bid[paths],
                a.arc_tenant[paths],
                a.arc_tier[paths],
                arc_value[paths],
                a.quantity[a.arc_bid[paths]],
                a.n_tiers,
            )
            search = _Search(arcs=paths, paths=built)
        y[paths], solved = search.paths.solve(
            share[market.arc_group[paths]], start=None if start is None else start[paths]
        )
        left = np.sort(np.r_[paths[~solved], many[big]])
        if left.size:
            for part in _chunks(left, a.arc_tenant[left]):
                y[part] = _transport(market, part, arc_value, share)
        if not (market.divisible or fractional):
            y[many] = np.rint(y[many])  # each problem is a network: its vertex is whole
        np.add.at(g, a.arc_tenant[many], arc_value[many] * y[many])
    return g, y, search


def _chunks(arcs: np.ndarray, tenant_of: np.ndarray) -> list[np.ndarray]:
    """``arcs`` (sorted by bid, so tenants interleave) in groups of whole tenants of about
    CHUNK_ARCS arcs each."""
    order = np.argsort(tenant_of, kind="stable")
    arcs, tenant_of = arcs[order], tenant_of[order]
    starts = np.flatnonzero(np.r_[True, tenant_of[1:] != tenant_of[:-1]])
    # Each boundary moves up to the next tenant's first arc; one past the last tenant's start
    # means the rest is a single tenant, which stays in the last chunk.
    at = np.searchsorted(starts, np.arange(CHUNK_ARCS, arcs.size, CHUNK_ARCS))
    bounds = starts[at[at < starts.size]]
    return [np.sort(part) for part in np.split(arcs, np.unique(bounds)) if part.size]


def _transport(market: Market, arcs: np.ndarray, arc_value: np.ndarray, share: np.ndarray):
    """Best bundle (GPUs per arc of ``arcs``) of each tenant within its shares and bids."""
    a = market.arrays
    bids, b_row = np.unique(a.arc_bid[arcs], return_inverse=True)
    groups, g_row = np.unique(market.arc_group[arcs], return_inverse=True)
    p = lp.Program("guarantee problem")
    y = p.variables("y", arcs.size)
    p.constrain("bid", [(y, lp.incidence(b_row, bids.size))], hi=a.quantity[bids])
    p.constrain("share", [(y, lp.incidence(g_row, groups.size))], hi=share[groups])
    return np.clip(p.maximise([(y, arc_value[arcs])])["y"], 0.0, None)
