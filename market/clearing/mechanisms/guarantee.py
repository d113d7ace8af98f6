"""The guarantee (sharing incentive) of every tenant: its value and the bundle that gives it.

A tenant with weight w_i > 0 is entitled to w_i / W of every tier (W: the weights of the
tenants bidding this round), within its share caps. Its guarantee is the value, in the given
per-arc values, of its best bundle within those shares and its non-gang demand.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from market.clearing.mechanisms.rules import Market, fill_in_order, whole
from market.clearing.solvers import lp
from market.clearing.solvers.transport import Paths

CHUNK_ARCS = 2000  # arcs per transport LP (the fallback)
# A tenant with more bids than this goes straight to the LP: the paths push one path per
# tenant per round and each round costs its whole block, so one tenant of 25k bids kept a
# part busy for 19 s before the round limit handed it to the LP anyway (docs/clearing.md).
BIG_TENANT_BIDS = 2_000
# guarantee_values works on every subset of tiers: up to this many tiers, and this many
# (tenant, subset) numbers at once (8 MB an array; 4,096 tenants a block at 8 tiers).
SUBSET_TIERS = 12
SUBSET_CELLS = 1 << 20


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


def guarantee_values(market: Market, values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(g, fair): ``guarantee_and_fair``'s guarantee and normaliser, without the bundles, for
    values that are the tenant's own per tier (``values`` (N, T): every arc of tenant i on
    tier t is worth values[i, t], as maxmin's and fisher's are).

    Then each tenant's problem is the most value within its shares that its bids can fill,
    and the tiers it can be given form a polymatroid: with r(S) the most GPUs its bids can
    put on the tiers S within their shares, giving the tiers in order of value, each
    r(S_k) - r(S_k-1) for the first k of them, is optimal (the greedy rule on a
    polymatroid). r is a minimum cut: r(S) = min over U within S of share(S - U) + the
    demand of the bids with a tier in U. ``_prefix_ranks`` has it for all 2^T sets S at once,
    two transforms over the subsets per block of tenants: 0.05 s for 10k tenants and 8
    tiers, where the path search took 0.4 s for both problems. With reserved quotas, more than
    SUBSET_TIERS tiers, it is ``guarantee_and_fair``."""
    a = market.arrays
    if market.reserved_quotas_set or a.n_tiers > SUBSET_TIERS:
        g, _, fair = guarantee_and_fair(market, values[a.arc_tenant, a.arc_tier])
        return g, fair
    g = _greedy_values(market, values, fractional=False)
    return g, g if market.divisible else _greedy_values(market, values, fractional=True)


def _greedy_values(market: Market, values: np.ndarray, *, fractional: bool) -> np.ndarray:
    """Each tenant's guarantee value (see ``guarantee_values``), shares whole unless
    ``fractional`` or the market is divisible."""
    a = market.arrays
    N, T = a.n_tenants, a.n_tiers
    share = whole(market.group_share, market.divisible or fractional)
    arc_value = values[a.arc_tenant, a.arc_tier]
    ok = ~market.is_gang[a.arc_bid] & (arc_value > 0) & (share[market.arc_group] > 0)
    arcs = np.flatnonzero(ok)
    cap = np.zeros(N * T)
    cap[a.arc_tenant[arcs] * T + a.arc_tier[arcs]] = share[market.arc_group[arcs]]
    # Each bid's tiers as bits (its arcs are on distinct tiers: a sum is an or).
    mask = np.bincount(
        a.arc_bid[arcs], weights=(1 << a.arc_tier[arcs]).astype(float), minlength=a.n_bids
    ).astype(np.int64)
    bids = np.flatnonzero(mask)
    # The tiers in order of value, each tenant's own; the rank of each prefix of them.
    worth = np.where(cap.reshape(N, T) > 0, values, 0.0)
    order = np.argsort(-worth, axis=1, kind="stable")
    r = _prefix_ranks(
        a.bid_tenant[bids],
        mask[bids],
        a.quantity[bids].astype(float),
        cap.reshape(N, T),
        np.cumsum(1 << order, axis=1),
    )
    gained = np.diff(r, axis=1, prepend=0.0)
    return (gained * np.take_along_axis(worth, order, axis=1)).sum(axis=1)


def _prefix_ranks(
    tenant: np.ndarray,
    mask: np.ndarray,
    quantity: np.ndarray,
    cap: np.ndarray,
    sets: np.ndarray,
) -> np.ndarray:
    """(N, k) r_i(S) for each of tenant i's sets ``sets`` (N, k, tiers as bits): the most
    GPUs its bids (``tenant``, their tiers as bits ``mask``, ``quantity``) can put on the
    tiers of S within ``cap`` (N, T). Tables are (2^T, tenants), a subset a row, so that a
    pass over the subsets works on whole rows."""
    N, T = cap.shape
    full = 1 << T
    bits = (np.arange(full)[:, None] >> np.arange(T)) & 1  # (2^T, T): S's tiers
    out = np.zeros(sets.shape)
    block = max(1, SUBSET_CELLS // full)
    for lo in range(0, N, block):
        hi = min(N, lo + block)
        n = hi - lo
        mine = (tenant >= lo) & (tenant < hi)
        # within[m, i]: the GPUs of i's bids whose tiers are m; summed over the subsets of
        # each set (a zeta transform), then the demand of the bids with a tier in U is the
        # total less what lies within the complement of U.
        within = np.bincount(
            mask[mine] * n + (tenant[mine] - lo), weights=quantity[mine], minlength=full * n
        ).reshape(full, n)
        _over_subsets(within, np.add)
        touching = within[-1:] - within[::-1]
        shares = bits @ cap[lo:hi].T  # share(S), (2^T, B)
        # r(S) = share(S) + min over U within S of (touching(U) - share(U)).
        least = touching - shares
        _over_subsets(least, np.minimum)
        least += shares
        out[lo:hi] = least[sets[lo:hi], np.arange(n)[:, None]]
    return out


def _over_subsets(table: np.ndarray, op: np.ufunc) -> None:
    """table[S] = op over the subsets U of S of table[U], in place (one pass a bit; rows are
    the subsets)."""
    full, n = table.shape
    for t in range(full.bit_length() - 1):
        view = table.reshape(full >> (t + 1), 2, (1 << t) * n)
        op(view[:, 1], view[:, 0], out=view[:, 1])


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
    if market.reserved_quotas_set:
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
