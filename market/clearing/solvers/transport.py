"""Many small transport problems at once: each tenant's best bundle within its shares.

For every tenant i, independently:

    max  sum_e v_e y_e
    s.t. sum_{e of bid b} y_e <= q_b        (the bid's GPUs)
         sum_{e on tier t} y_e <= s_it      (the tenant's share of the tier)
         y >= 0

Each problem is tiny (a tenant's bids on a few tiers), but there are as many as tenants, and
handing them to a general solver one chunk at a time costs more than the market's own flow.
Each is solved by successive longest augmenting paths, in a loop compiled by numba that
goes through the tenants one after the other: a tenant's path costs a pass over its own few
arcs. (Done in numpy rounds over all tenants at once, one path per tenant a round, every round
paid for the arrays of all tenants still improving: 0.44 s against 0.05 s for the guarantee
and the normaliser at 100k bids, docs/clearing.md.) A path only ever crosses tiers, so it is
found on a graph of the T tiers:

- entering tier t: a bid with GPUs left takes one there, gaining v_bt;
- t -> t': a bid holding GPUs on t moves one to t', gaining v_bt' - v_bt;
- leaving tier t: the tenant's share of t has room.

The longest entry-to-exit path is found by Bellman-Ford over the tiers (a path has at most
T - 1 moves), and as much flow as the path allows is pushed along it. Pushing along a longest
path keeps the flow optimal for its size, and a tenant is done when no path gains, so the
result is each problem's optimum.

A start (``start``: a flow that is optimal for smaller shares, such as the bundles of the
shares floored to whole GPUs) saves most of the paths of a second, larger problem. It is
feasible for the larger shares but may no longer be optimal for its size: a GPU can now be
better on a tier whose share grew. So a path may also begin by freeing a GPU of a tier the
tenant uses (gaining nothing), then move bids as above: the longest path from either
beginning to a tier with room is the longest path from the sink back to it in the residual
network, and pushing along it keeps the flow optimal for its size, as from nothing (successive
longest paths with the sink as their source). Without a start no path begins that way.

Among several optima the one reached is fixed by the data:
ties between bids go to the lower bid id, between tiers to the lower tier index. Every
amount pushed is a difference of the data, so whole quantities and shares give whole
bundles.
"""

from __future__ import annotations

import numpy as np
from numba import njit

NONE = -1
FREED = -2  # a path that begins by freeing a GPU of its first tier (from a start)
PATH_LIMIT = 10_000  # paths of one tenant before it is handed back unsolved


def best_bundles(
    arc_bid: np.ndarray,
    arc_tenant: np.ndarray,
    arc_tier: np.ndarray,
    value: np.ndarray,
    quantity: np.ndarray,
    share: np.ndarray,
    n_tiers: int,
    *,
    start: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """(y, solved): GPUs per arc of each tenant's best bundle, and per arc whether its tenant's
    problem was solved (False only for a tenant still improving after PATH_LIMIT paths).

    Arrays per arc, sorted by bid (a bid's arcs are adjacent, one per tier): ``arc_bid``,
    ``arc_tenant``, ``arc_tier``, ``value`` (v_e > 0); per arc too, ``quantity`` (q of the
    arc's bid) and ``share`` (s of the arc's tenant and tier). ``start`` (per arc): a flow
    each tenant's problem begins from, optimal for shares no larger than ``share``."""
    paths = Paths(arc_bid, arc_tenant, arc_tier, value, quantity, n_tiers)
    return paths.solve(share, start=start)


class Paths:
    """The tenants' problems over given arcs and values, ready to be solved for any shares:
    the arcs are put in tenant order once, so a second solve (the fractional shares after the
    whole ones) costs only its paths. Arguments as ``best_bundles``'s."""

    def __init__(
        self,
        arc_bid: np.ndarray,
        arc_tenant: np.ndarray,
        arc_tier: np.ndarray,
        value: np.ndarray,
        quantity: np.ndarray,
        n_tiers: int,
    ) -> None:
        self.size = arc_bid.size
        self.n_tiers = n_tiers
        # A tenant's arcs together, still in bid order (so a bid's arcs stay adjacent).
        self.order = np.argsort(arc_tenant, kind="stable")
        tenant = arc_tenant[self.order]
        self.starts = np.flatnonzero(np.r_[True, tenant[1:] != tenant[:-1], True])
        self.bid = arc_bid[self.order].astype(np.int64)
        self.tier = arc_tier[self.order].astype(np.int64)
        self.value = value[self.order].astype(float)
        self.quantity = quantity[self.order].astype(float)
        self.tol = 1e-9 * (1.0 + float(np.abs(value).max(initial=0.0)))

    def solve(
        self, share: np.ndarray, *, start: np.ndarray | None = None
    ) -> tuple[np.ndarray, np.ndarray]:
        """(y, solved) as ``best_bundles``'s, for ``share`` (per arc) and ``start``."""
        y = np.zeros(self.size)
        solved = np.ones(self.size, dtype=bool)
        if self.size == 0:
            return y, solved
        share = share[self.order].astype(float)
        flow = np.zeros(self.size) if start is None else start[self.order].astype(float)
        done = np.ones(self.size, dtype=bool)
        room_tol = 1e-9 * (1.0 + float(max(self.quantity.max(), share.max())))
        _solve_tenants(
            self.starts,
            self.bid,
            self.tier,
            self.value,
            self.quantity,
            share,
            flow,
            done,
            self.n_tiers,
            self.tol,
            room_tol,
            start is not None,
            PATH_LIMIT,
        )
        y[self.order] = flow
        solved[self.order] = done
        return y, solved


@njit(cache=True)
def _solve_tenants(
    starts, bid, tier, value, quantity, share, y, solved, T, tol, room_tol, from_start, limit
):
    """Each tenant's problem (arcs starts[k]..starts[k+1]) in turn, from ``y``; ``solved`` set
    False for a tenant not done within ``limit`` paths."""
    enter_gain = np.empty(T)
    enter_arc = np.empty(T, np.int64)
    move_gain = np.empty((T, T))
    move_from = np.empty((T, T), np.int64)
    move_to = np.empty((T, T), np.int64)
    label = np.empty(T)
    came = np.empty(T, np.int64)
    best, via = np.empty(T), np.empty(T, np.int64)
    cap = np.empty(T)
    cell_room = np.empty(T)
    head = np.empty(y.size, np.int64)  # per arc, its bid's first arc: that holds the bid's room
    bid_room = np.empty(y.size)
    for k in range(starts.size - 1):
        lo, hi = starts[k], starts[k + 1]
        cap[:] = 0.0
        for e in range(lo, hi):
            cap[tier[e]] = share[e]
        cell_room[:] = cap
        for e in range(lo, hi):
            if e == lo or bid[e] != bid[e - 1]:
                head[e] = e
                bid_room[e] = quantity[e]
            else:
                head[e] = head[e - 1]
            bid_room[head[e]] -= y[e]
            cell_room[tier[e]] -= y[e]
        done = False
        for _ in range(limit):
            _steps(
                lo,
                hi,
                bid,
                tier,
                value,
                y,
                head,
                bid_room,
                room_tol,
                enter_gain,
                enter_arc,
                move_gain,
                move_from,
                move_to,
            )
            label[:] = enter_gain
            came[:] = NONE
            if from_start:
                # Freeing a GPU of a used tier gains nothing; an entry, where there is one, more.
                for t in range(T):
                    if cell_room[t] < cap[t] - room_tol and label[t] < 0.0:
                        label[t] = 0.0
                        came[t] = FREED
            _longest(label, came, move_gain, tol, best, via)
            end = NONE
            for t in range(T):
                if cell_room[t] > room_tol and (end == NONE or label[t] > label[end]):
                    end = t
            if end == NONE or label[end] <= tol:
                done = True
                break
            if not _push(
                end, came, enter_arc, move_from, move_to, y, head, bid_room, cap, cell_room
            ):
                break  # no entry within T steps: not a path (never expected); left unsolved
        if not done:
            solved[lo:hi] = False


@njit(cache=True, inline="always")
def _steps(
    lo,
    hi,
    bid,
    tier,
    value,
    y,
    head,
    bid_room,
    room_tol,
    enter_gain,
    enter_arc,
    move_gain,
    move_from,
    move_to,
):
    """The tenant's best entry per tier (a bid with room) and best move per pair of tiers (a
    GPU its bid holds on the first); ties to the earlier arc, that is the lower bid id."""
    enter_gain[:] = -np.inf
    enter_arc[:] = NONE
    move_gain[:, :] = -np.inf
    move_from[:, :] = NONE
    first = lo
    while first < hi:
        last = first + 1
        while last < hi and bid[last] == bid[first]:
            last += 1
        room = bid_room[first] > room_tol
        for f in range(first, last):
            t = tier[f]
            if room and value[f] > enter_gain[t]:
                enter_gain[t], enter_arc[t] = value[f], f
            if y[f] > room_tol:
                for g in range(first, last):
                    gain = value[g] - value[f]
                    if g != f and gain > move_gain[t, tier[g]]:
                        move_gain[t, tier[g]] = gain
                        move_from[t, tier[g]], move_to[t, tier[g]] = f, g
        first = last


@njit(cache=True, inline="always")
def _longest(label, came, move_gain, tol, best, via):
    """Bellman-Ford over the tiers from ``label`` (the gain of beginning on each), in rounds
    that each extend every label by one move; ``came``: the tier before each, kept as found;
    ``best`` and ``via``: room for a round's labels."""
    T = label.size
    for _ in range(T - 1):
        for u in range(T):
            best[u], via[u] = -np.inf, 0
            for t in range(T):
                if label[t] + move_gain[t, u] > best[u]:
                    best[u], via[u] = label[t] + move_gain[t, u], t
        changed = False
        for u in range(T):
            if best[u] > label[u] + tol:
                label[u], came[u] = best[u], via[u]
                changed = True
        if not changed:
            return


@njit(cache=True, inline="always")
def _push(end, came, enter_arc, move_from, move_to, y, head, bid_room, cap, cell_room):
    """Push as much as the path ending on tier ``end`` allows along it; False if it is not a
    path (no beginning within T steps)."""
    T = came.size
    amount = cell_room[end]
    tier, steps = end, 0
    while came[tier] >= 0:
        if steps == T - 1:
            return False
        amount = min(amount, y[move_from[came[tier], tier]])
        tier, steps = came[tier], steps + 1
    if came[tier] == NONE:
        amount = min(amount, bid_room[head[enter_arc[tier]]])
    else:
        amount = min(amount, cap[tier] - cell_room[tier])
    tier = end
    while came[tier] >= 0:
        y[move_to[came[tier], tier]] += amount
        y[move_from[came[tier], tier]] -= amount
        tier = came[tier]
    if came[tier] == NONE:
        y[enter_arc[tier]] += amount
        bid_room[head[enter_arc[tier]]] -= amount
    else:
        cell_room[tier] += amount
    cell_room[end] -= amount
    return True
