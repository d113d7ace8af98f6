"""The market's network problems solved as min-cost flows (OR-Tools' cost-scaling solver).

The open-market welfare problem (colgen.py states it) is a network LP with whole capacities
in whole-GPU mode: bid -> [capped group] -> tier -> sink, a profit of p_e per GPU on a bid's
arc. (The guarantee's transport problems, one per tenant, are solved together by
transport.py.)

Every bid's GPUs enter the network, and what finds no profitable arc leaves at no profit (a
bypass arc). A min-cost flow solver takes these networks as they are, with no LP around them:
more than ten times faster than column generation on HiGHS at 10k bids (docs/clearing.md).
It needs whole capacities and whole costs, so profits are counted in milli-credits (the
ledger's unit: every limit and reserve the platform sends is a whole number of them) and
divided by their greatest common divisor (fewer scaling phases). When an instance has
fractional capacities (divisible mode), finer prices, or costs too large for the solver's
64-bit arithmetic, ``None`` is returned and the caller solves its LP instead.

Ties. A flow of zero profit is not placed (as the LP's vertex leaves it). Among arcs of equal
profit on the same tier and capped group the solver's choice is arbitrary, so ``fill_by_id``
hands each such class to its bids in id order: among equal limits the earlier bid wins.
Which of its equally good tiers a bid gets is the solver's (deterministic) choice.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np
from ortools.graph.python import min_cost_flow

from market.clearing.mechanisms.rules import EPS, OpenMarket

MILLI = 1000
# Cost scaling multiplies costs by the node count, which must stay inside int64 with room to
# spare (the solver checks too, and answers BAD_COST_RANGE rather than overflow).
COST_LIMIT = 2**61
MERGE_CELLS = 50_000_000  # most bids x 2 x tiers key cells compared to merge alike bids


def whole_numbers(values: np.ndarray, scale: float = 1.0) -> np.ndarray | None:
    """``values * scale`` as int64 when every one is a whole number (to 1e-6), else None."""
    scaled = np.asarray(values, dtype=float) * scale
    rounded = np.rint(scaled)
    if not np.all(np.abs(scaled - rounded) <= 1e-6 * np.maximum(1.0, np.abs(scaled))):
        return None
    if np.abs(rounded).max(initial=0.0) >= 2**53:
        return None
    return rounded.astype(np.int64)


def min_cost_flow_solve(
    tails: np.ndarray,
    heads: np.ndarray,
    caps: np.ndarray,
    costs: np.ndarray,
    supplies: np.ndarray,
) -> np.ndarray | None:
    """Flow per arc of a min-cost flow meeting every node's supply (int64 arrays), or None
    when the costs are out of the solver's range."""
    nonzero = np.abs(costs[costs != 0])
    if nonzero.size:
        costs = costs // int(np.gcd.reduce(nonzero))
    if int(np.abs(costs).max(initial=0)) * (supplies.size + 1) >= COST_LIMIT:
        return None
    solver = min_cost_flow.SimpleMinCostFlow()
    arcs = solver.add_arcs_with_capacity_and_unit_cost(
        tails.astype(np.int32), heads.astype(np.int32), caps.astype(np.int64), costs
    )
    solver.set_nodes_supplies(np.arange(supplies.size, dtype=np.int32), supplies)
    if solver.solve() != solver.OPTIMAL:
        return None
    return np.asarray(solver.flows(arcs))


def welfare_flow(m: OpenMarket, *, in_id_order: bool = True) -> np.ndarray | None:
    """GPUs per arc (E,) of a maximum-profit allocation of the open market, or None when it
    is not a whole-number network (see the module's docstring). ``in_id_order=False``: equal
    limits are not yet handed out in bid id order (``fill_by_id``), for a caller that puts
    this allocation into a larger one and orders that."""
    network = WelfareNetwork.of(m, in_id_order=in_id_order)
    return None if network is None else network.solve(m)


@dataclass(frozen=True)
class WelfareNetwork:
    """The open market's flow network, built once (the classes of alike bids, nodes, arcs,
    costs) and solved for the market or for any market left from it: the same arcs and
    profits with rooms no larger, as the bundle passes of welfare.py are."""

    n_arcs: int
    use: np.ndarray  # (U,) arcs with room and profit, sorted by bid then tier
    classes: Classes | None  # None when no arc has room and profit
    rep: np.ndarray  # (R,) index in use of each class's own arcs
    groups: np.ndarray  # (G',) capped groups the arcs reach
    tails: np.ndarray  # the flow's arcs: the classes' own arcs, groups, tiers, source arcs
    heads: np.ndarray
    costs: np.ndarray
    # interchangeable(m), for fill_by_id; None: solve leaves equal limits in the solver's order
    same_arcs: tuple[np.ndarray, np.ndarray] | None

    @classmethod
    def of(cls, m: OpenMarket, *, in_id_order: bool = True) -> WelfareNetwork | None:
        T = m.tier_room.size
        bid_room = whole_numbers(m.bid_room)
        profit = whole_numbers(m.arc_price, MILLI)
        if bid_room is None or profit is None:
            return None
        use = np.flatnonzero((bid_room[m.arc_bid] > 0) & (profit > 0))
        use = use[np.lexsort((m.arc_tier[use], m.arc_bid[use]))]
        if use.size == 0:
            return cls(m.arc_bid.size, use, None, use, use, use, use, use, (use, use))
        bids = Classes.of(m, use, profit)
        rep = np.flatnonzero(bids.rep_arc == np.arange(use.size))  # the class's own arcs
        C = bids.room.size
        capped = m.arc_capped[use[rep]]
        groups, group_row = np.unique(capped[capped >= 0], return_inverse=True)
        # Nodes: classes of bids, capped groups, tiers, the sink and the source; the source
        # sends every bid's GPUs, and what finds no profitable arc goes straight to the sink.
        first_group = C
        first_tier = first_group + groups.size
        sink = first_tier + T
        source = sink + 1
        group_node = np.full(m.group_room.size, -1, dtype=np.int64)
        group_node[groups] = first_group + np.arange(groups.size)
        group_tier = np.zeros(groups.size, dtype=np.int64)
        group_tier[group_row] = m.arc_tier[use[rep]][capped >= 0]
        arc_head = np.where(
            capped >= 0, group_node[np.maximum(capped, 0)], first_tier + m.arc_tier[use[rep]]
        )
        tails = np.concatenate(
            [
                bids.arc_class[rep],
                first_group + np.arange(groups.size),
                first_tier + np.arange(T),
                np.full(C + 1, source),
            ]
        )
        heads = np.concatenate(
            [arc_head, first_tier + group_tier, np.full(T, sink), np.arange(C), [sink]]
        )
        costs = np.concatenate(
            [-profit[use[rep]], np.zeros(groups.size + T + C + 1, dtype=np.int64)]
        )
        same = interchangeable(m) if in_id_order else None
        return cls(m.arc_bid.size, use, bids, rep, groups, tails, heads, costs, same)

    def solve(self, m: OpenMarket) -> np.ndarray | None:
        """GPUs per arc (E,) of a maximum-profit allocation of ``m`` (the market the network
        was built from, or one left from it), or None when its rooms are not whole."""
        bid_room = whole_numbers(m.bid_room)
        tier_room = whole_numbers(m.tier_room)
        group_room = whole_numbers(m.group_room)
        if bid_room is None or tier_room is None or group_room is None:
            return None
        x = np.zeros(self.n_arcs)
        if self.classes is None:
            return x
        bids = self.classes.with_room(np.maximum(bid_room, 0))
        supply = bids.room.sum()
        caps = np.concatenate(
            [
                bids.room[bids.arc_class[self.rep]],
                group_room[self.groups],
                tier_room,
                bids.room,
                [supply],
            ]
        )
        supplies = np.zeros(int(self.tails.max()) + 1, dtype=np.int64)
        supplies[-2], supplies[-1] = -supply, supply  # the sink, the source
        flows = min_cost_flow_solve(self.tails, self.heads, caps, self.costs, supplies)
        if flows is None:
            return None
        class_flow = np.zeros(self.use.size)
        class_flow[self.rep] = flows[: self.rep.size]
        x[self.use] = bids.share_out(class_flow)
        return x if self.same_arcs is None else fill_by_id(m, x, self.same_arcs)


def row_mix(columns: int) -> np.ndarray:
    """The odd multipliers of the row hash, one per column (fixed: results are repeatable)."""
    return np.random.default_rng(0x5EED).integers(1, 2**62, size=columns, dtype=np.uint64) | 1


def equal_rows(key: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(first row of each class, class of each row) for the classes of equal rows, numbered
    in the order of their first rows: rows are grouped by a 64-bit hash (one sort of
    integers, where sorting whole rows is slow), then compared with their group's first
    row, so a hash collision only leaves a row in a class of its own."""
    mix = row_mix(key.shape[1])
    with np.errstate(over="ignore"):
        h = (key.astype(np.uint64) * mix).sum(axis=1, dtype=np.uint64)
    order = np.argsort(h, kind="stable")
    new = np.r_[True, h[order][1:] != h[order][:-1]]
    first = order[new][np.cumsum(new) - 1]
    same = np.all(key[order] == key[first], axis=1)
    label = np.empty(h.size, dtype=np.int64)
    label[order] = np.where(same, first, order)
    head, row_class = np.unique(label, return_inverse=True)
    return head, row_class.ravel()


@dataclass(frozen=True)
class Classes:
    """Bids whose arcs are the same (tier, capped group, profit) are interchangeable: the flow
    sees one node per class, with the rooms of its bids summed, and the arcs of its first
    bid. Arrays per arc of ``use`` (sorted by bid, then tier), per bid of ``use`` and per
    class."""

    arc_class: np.ndarray  # (U,) class of the arc's bid
    rep_arc: np.ndarray  # (U,) index in use of the same arc of the class's first bid
    arc_member: np.ndarray  # (U,) start, in the class's stream of GPUs, of the bid's part
    arc_room: np.ndarray  # (U,) the bid's room
    room: np.ndarray  # (C,) GPUs of the class's bids together
    bid: np.ndarray  # (K,) the bids of use
    bid_class: np.ndarray  # (K,) class of each
    arc_row: np.ndarray  # (U,) the arc's bid, as an index of ``bid``
    by_class: np.ndarray  # (K,) rows of ``bid`` by class, in id order within a class

    @classmethod
    def of(cls, m: OpenMarket, use: np.ndarray, profit: np.ndarray) -> Classes:
        T = m.tier_room.size
        bid, first, count = np.unique(m.arc_bid[use], return_index=True, return_counts=True)
        row = np.repeat(np.arange(bid.size), count)
        position = np.arange(use.size) - first[row]
        if bid.size * 2 * T <= MERGE_CELLS:
            key = np.full((bid.size, 2 * T), -2, dtype=np.int64)
            key[row, m.arc_tier[use]] = profit[use]
            key[row, T + m.arc_tier[use]] = m.arc_capped[use]
            head, bid_class = equal_rows(key)
        else:  # too many cells to compare: every bid is its own class
            head, bid_class = np.arange(bid.size), np.arange(bid.size)
        partition = cls(
            arc_class=bid_class[row],
            rep_arc=first[head][bid_class[row]] + position,
            arc_member=np.zeros(use.size),
            arc_room=np.zeros(use.size),
            room=np.zeros(head.size, dtype=np.int64),
            bid=bid,
            bid_class=bid_class,
            arc_row=row,
            # Within a class, bids take the class's GPUs in id order (rows are in id order).
            by_class=np.argsort(bid_class, kind="stable"),
        )
        return partition.with_room(m.bid_room)

    def with_room(self, bid_room: np.ndarray) -> Classes:
        """The same classes with every bid's room taken from ``bid_room`` (B,)."""
        order, bid_class = self.by_class, self.bid_class
        room = bid_room[self.bid]
        before = np.cumsum(room[order]) - room[order]
        class_start = np.searchsorted(bid_class[order], np.arange(self.room.size))
        member = np.empty(self.bid.size)
        member[order] = before - before[class_start][bid_class[order]]
        return replace(
            self,
            arc_member=member[self.arc_row],
            arc_room=room[self.arc_row].astype(float),
            room=np.bincount(bid_class, weights=room, minlength=self.room.size).astype(np.int64),
        )

    def share_out(self, class_flow: np.ndarray) -> np.ndarray:
        """GPUs per arc of ``use`` from the flow on the classes' own arcs: the class's GPUs
        are one stream, its arcs' flows laid end to end; each bid, in id order, takes the
        next part of the stream up to its room, on whichever arcs that part lies."""
        rep = np.flatnonzero(self.rep_arc == np.arange(self.rep_arc.size))
        cls_of_rep = self.arc_class[rep]
        total = np.bincount(cls_of_rep, weights=class_flow[rep], minlength=self.room.size)
        # Start of each own arc's flow in the stream (own arcs are in order within a class).
        starts = np.cumsum(class_flow[rep]) - class_flow[rep]
        first_of_class = np.searchsorted(cls_of_rep, np.arange(self.room.size))
        arc_start = np.zeros(self.rep_arc.size)
        arc_start[rep] = starts - starts[np.minimum(first_of_class, rep.size - 1)][cls_of_rep]
        lo_arc = arc_start[self.rep_arc]
        hi_arc = lo_arc + class_flow[self.rep_arc]
        take = np.clip(total[self.arc_class] - self.arc_member, 0.0, self.arc_room)
        lo_bid, hi_bid = self.arc_member, self.arc_member + take
        return np.clip(np.minimum(hi_arc, hi_bid) - np.maximum(lo_arc, lo_bid), 0.0, None)


def interchangeable(m: OpenMarket) -> tuple[np.ndarray, np.ndarray]:
    """(arcs, starts): every arc ordered by tier, capped group, profit and bid, and where each
    run of interchangeable arcs (same tier, capped group and profit) starts."""
    order = np.lexsort((m.arc_bid, m.arc_price, m.arc_capped, m.arc_tier))
    tier, capped, price = m.arc_tier[order], m.arc_capped[order], m.arc_price[order]
    same = (np.diff(tier) == 0) & (np.diff(capped) == 0) & (np.diff(price) == 0)
    return order, np.flatnonzero(np.r_[True, ~same])


def fill_by_id(
    m: OpenMarket, x: np.ndarray, same_arcs: tuple[np.ndarray, np.ndarray] | None = None
) -> np.ndarray:
    """The same allocation with every class of interchangeable arcs (same tier, same capped
    group, same profit) handed to its bids in id order: among equal limits the earlier bid
    wins. Only classes that are partly filled change; each keeps its total, so the profit,
    the tiers' and the groups' totals and every bid's room still hold. ``same_arcs``:
    ``interchangeable(m)``, when it is already known."""
    x = x.copy()
    free = m.bid_room - np.bincount(m.arc_bid, weights=x, minlength=m.bid_room.size)
    order, starts = interchangeable(m) if same_arcs is None else same_arcs
    ends = np.r_[starts[1:], order.size]
    # Only a class with flow and a bid left short can be out of order. Reordering one class
    # can free a bid of another class, checked again in the next sweep; each change moves
    # GPUs to earlier bids, so the sweeps end.
    changed = True
    while changed:
        changed = False
        flow_in = np.add.reduceat(x[order], starts)
        short_in = np.add.reduceat(free[m.arc_bid[order]] > EPS, starts)
        for k in np.flatnonzero((ends - starts > 1) & (flow_in > EPS) & (short_in > 0)).tolist():
            arcs = order[starts[k] : ends[k]]
            flow = x[arcs]
            room = flow + free[m.arc_bid[arcs]]
            before = np.cumsum(room) - room
            take = np.clip(flow.sum() - before, 0.0, room)
            if np.any(np.abs(take - flow) > EPS):
                changed = True
                free[m.arc_bid[arcs]] += flow - take
                x[arcs] = take
    return x
