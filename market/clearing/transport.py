"""Many small transport problems at once: each tenant's best bundle within its shares.

For every tenant i, independently:

    max  sum_e v_e y_e
    s.t. sum_{e of bid b} y_e <= q_b        (the bid's GPUs)
         sum_{e on tier t} y_e <= s_it      (the tenant's share of the tier)
         y >= 0

Each problem is tiny (a tenant's bids on a few tiers), but there are as many as tenants, and
handing them to a general solver one chunk at a time costs more than the market's own flow.
Here they are solved together by successive longest augmenting paths, one path per tenant
per round, every round vectorised over all tenants. A path only ever crosses tiers, so it is
found on a graph of T tier nodes per tenant:

- entering tier t: a bid with GPUs left takes one there, gaining v_bt;
- t -> t': a bid holding GPUs on t moves one to t', gaining v_bt' - v_bt;
- leaving tier t: the tenant's share of t has room.

The longest entry-to-exit path is found by Bellman-Ford over the tiers (a path has at most
T - 1 moves), and as much flow as the path allows is pushed along it. Pushing along a longest
path keeps the flow optimal for its size, and a tenant is done when no path gains, so the
result is each problem's optimum.

A start (``start``: a flow that is optimal for smaller shares, such as the bundles of the
shares floored to whole GPUs) saves most of the rounds of a second, larger problem. It is
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

from dataclasses import dataclass

import numpy as np

NONE = -1
FREED = -2  # a path that begins by freeing a GPU of its first tier (from a start)
ROUND_LIMIT = 10_000  # augmenting rounds before the tenants left are handed back unsolved
CELLS = 4_000_000  # most (tenant, tier, tier) cells held at once; more tenants go in blocks


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
    problem was solved (False only for a tenant still improving after ROUND_LIMIT rounds).

    Arrays per arc, sorted by bid (a bid's arcs are adjacent, one per tier): ``arc_bid``,
    ``arc_tenant``, ``arc_tier``, ``value`` (v_e > 0); per arc too, ``quantity`` (q of the
    arc's bid) and ``share`` (s of the arc's tenant and tier). ``start`` (per arc): a flow
    each tenant's problem begins from, optimal for shares no larger than ``share``."""
    paths = Paths(arc_bid, arc_tenant, arc_tier, value, quantity, n_tiers)
    return paths.solve(share, start=start)


class Paths:
    """The tenants' problems over given arcs and values, ready to be solved for any shares:
    their entries and moves, each put in order by a sort, are built once, so a second solve
    (the fractional shares after the whole ones) costs only its rounds. Arguments as
    ``best_bundles``'s."""

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
        self.blocks: list[tuple[np.ndarray, _Problem]] = []
        if arc_bid.size == 0:
            return
        tenants, tenant_row = np.unique(arc_tenant, return_inverse=True)
        per_block = max(1, CELLS // (n_tiers * n_tiers))
        for first in range(0, tenants.size, per_block):
            arcs = np.flatnonzero((tenant_row >= first) & (tenant_row < first + per_block))
            problem = _Problem(
                bid=arc_bid[arcs],
                tenant=tenant_row[arcs] - first,
                tier=arc_tier[arcs],
                value=value[arcs].astype(float),
                quantity=quantity[arcs].astype(float),
                n_tiers=n_tiers,
            )
            self.blocks.append((arcs, problem))

    def solve(
        self, share: np.ndarray, *, start: np.ndarray | None = None
    ) -> tuple[np.ndarray, np.ndarray]:
        """(y, solved) as ``best_bundles``'s, for ``share`` (per arc) and ``start``."""
        y = np.zeros(self.size)
        solved = np.ones(self.size, dtype=bool)
        for arcs, problem in self.blocks:
            y[arcs], solved[arcs] = problem.solve(
                share[arcs].astype(float), None if start is None else start[arcs]
            )
        return y, solved


class _Problem:
    """One block of tenants' problems; arcs in bid order, tenants numbered from 0."""

    def __init__(
        self,
        *,
        bid: np.ndarray,
        tenant: np.ndarray,
        tier: np.ndarray,
        value: np.ndarray,
        quantity: np.ndarray,
        n_tiers: int,
    ) -> None:
        T = n_tiers
        self.T = T
        self.n = int(tenant.max()) + 1
        new_bid = np.r_[True, bid[1:] != bid[:-1]]
        self.bid_row = np.cumsum(new_bid) - 1  # arcs are in bid order
        self.quantity = quantity[new_bid]
        self.tenant, self.tier, self.value = tenant, tier, value
        self.cell = tenant * T + tier
        self.tol = 1e-9 * (1.0 + float(np.abs(value).max()))
        # Entries: a cell's arcs, best value first, then bid id (arcs are in bid order).
        self.entry = _order(self.cell, value, np.arange(value.size))
        # Moves: every ordered pair of a bid's arcs, per (tenant, from, to) best gain first.
        first, second = [], []
        for d in range(1, T):
            same = np.flatnonzero(bid[d:] == bid[:-d])
            if same.size == 0:
                break  # a bid's arcs are adjacent: none has more than d arcs
            first += [same, same + d]
            second += [same + d, same]
        move_from = np.concatenate(first) if first else np.zeros(0, dtype=np.int64)
        move_to = np.concatenate(second) if second else np.zeros(0, dtype=np.int64)
        gain = value[move_to] - value[move_from]
        order = _order(self.cell[move_from] * T + tier[move_to], gain, move_from)
        self.move_from, self.move_to, self.move_gain = move_from[order], move_to[order], gain[order]

    def solve(
        self, arc_share: np.ndarray, start: np.ndarray | None = None
    ) -> tuple[np.ndarray, np.ndarray]:
        T = self.T
        share = np.zeros(self.n * T)
        share[self.cell] = arc_share
        room_tol = 1e-9 * (1.0 + float(max(self.quantity.max(), arc_share.max())))
        y = np.zeros(self.value.size) if start is None else start.astype(float)
        bid_room = self.quantity - np.bincount(self.bid_row, y, self.quantity.size)
        cell_room = share - np.bincount(self.cell, y, share.size)
        live = np.ones(self.n, dtype=bool)
        failed = np.zeros(self.n, dtype=bool)
        view = _View.of(self, live)
        for _ in range(ROUND_LIMIT):
            n = view.tenants.size
            enter_gain, enter_arc = view.entries.best(bid_room[view.entry_bid] > room_tol, n * T)
            moves, move_pick = view.moves.best(y[view.move_from] > room_tol, n * T * T)
            # Longest entry-to-tier paths by Bellman-Ford; came_from: the tier before, or NONE.
            label = enter_gain.reshape(n, T)
            moves = moves.reshape(n, T, T)
            came_from = np.full((n, T), NONE)
            if start is not None:
                # Freeing a GPU of a used tier gains nothing; an entry, where there is one, more.
                used = cell_room[view.tenants[:, None] * T + np.arange(T)] < (
                    share[view.tenants[:, None] * T + np.arange(T)] - room_tol
                )
                freed = used & (label < 0.0)
                label = np.where(freed, 0.0, label)
                came_from[freed] = FREED
            rows = np.flatnonzero(live[view.tenants])
            for _ in range(T - 1):
                reach = label[rows][:, :, None] + moves[rows]
                via = reach.argmax(axis=1)
                best = np.take_along_axis(reach, via[:, None, :], axis=1)[:, 0, :]
                better = best > label[rows] + self.tol
                changed = better.any(axis=1)
                if not changed.any():
                    break
                rows, better, best, via = (
                    rows[changed],
                    better[changed],
                    best[changed],
                    via[changed],
                )
                label[rows] = np.where(better, best, label[rows])
                came_from[rows] = np.where(better, via, came_from[rows])
            open_cell = cell_room[view.tenants[:, None] * T + np.arange(T)] > room_tol
            exit_label = np.where(open_cell & live[view.tenants][:, None], label, -np.inf)
            end = exit_label.argmax(axis=1)
            going = exit_label[np.arange(n), end] > self.tol
            live[view.tenants[~going]] = False
            rows = np.flatnonzero(going)
            if rows.size == 0:
                break
            self._push(
                y,
                share,
                rows,
                end[rows],
                view,
                came_from,
                enter_arc,
                move_pick,
                bid_room,
                cell_room,
                live,
                failed,
            )
            if np.count_nonzero(live[view.tenants]) < 0.5 * n:
                view = _View.of(self, live)
        return y, ~(live | failed)[self.tenant]

    def _push(
        self,
        y,
        share,
        rows,
        end,
        view,
        came_from,
        enter_arc,
        move_pick,
        bid_room,
        cell_room,
        live,
        failed,
    ) -> None:
        """Push as much as each row's path allows along it."""
        T = self.T
        tenants, move_from, move_to = view.tenants, view.move_from, view.move_to
        exit_cell = tenants[rows] * T + end
        amount = cell_room[exit_cell].copy()
        plus, minus, plus_at, minus_at = [], [], [], []
        entry_arc = np.full(rows.size, NONE)
        freed_cell = np.full(rows.size, NONE)
        at, row, tier = np.arange(rows.size), rows, end
        for _ in range(T):
            prev = came_from[row, tier]
            entered = prev == NONE
            arc = enter_arc[row[entered] * T + tier[entered]]
            entry_arc[at[entered]] = arc
            plus.append(arc)
            plus_at.append(at[entered])
            amount[at[entered]] = np.minimum(amount[at[entered]], bid_room[self.bid_row[arc]])
            freed = prev == FREED
            cell = tenants[row[freed]] * T + tier[freed]
            freed_cell[at[freed]] = cell
            amount[at[freed]] = np.minimum(amount[at[freed]], share[cell] - cell_room[cell])
            moving = ~(entered | freed)
            at, row, tier, prev = at[moving], row[moving], tier[moving], prev[moving]
            if at.size == 0:
                break
            pick = move_pick[(row * T + prev) * T + tier]
            plus.append(move_to[pick])
            minus.append(move_from[pick])
            plus_at.append(at)
            minus_at.append(at)
            amount[at] = np.minimum(amount[at], y[move_from[pick]])
            tier = prev
        if at.size:  # no entry within T steps: not a path (never expected); left unsolved
            live[tenants[row]] = False
            failed[tenants[row]] = True
            amount[at] = 0.0
        np.add.at(y, np.concatenate(plus), amount[np.concatenate(plus_at)])
        if minus:
            np.subtract.at(y, np.concatenate(minus), amount[np.concatenate(minus_at)])
        has_entry, has_freed = entry_arc != NONE, freed_cell != NONE
        np.subtract.at(bid_room, self.bid_row[entry_arc[has_entry]], amount[has_entry])
        cell_room[freed_cell[has_freed]] += amount[has_freed]  # one beginning per tenant
        cell_room[exit_cell] -= amount  # one exit per tenant


def _order(key: np.ndarray, gain: np.ndarray, tie: np.ndarray) -> np.ndarray:
    """Indices sorted by key, then gain from the highest, then tie (all >= 0): one sort of
    a combined integer key where it fits in 63 bits, else a lexsort."""
    levels, rank = np.unique(-gain, return_inverse=True)
    span = [int(key.max(initial=0)) + 1, levels.size, int(tie.max(initial=0)) + 1]
    if span[0] * span[1] * span[2] < 2**62:
        return np.argsort((key * span[1] + rank.ravel()) * span[2] + tie)
    return np.lexsort((tie, rank, key))


@dataclass(frozen=True)
class _Segments:
    """Items sorted by key, best first within a key: ``best`` picks each key's first usable
    item."""

    key: np.ndarray  # (I,) each item's key, ascending
    gain: np.ndarray  # (I,)
    item: np.ndarray  # (I,)

    def best(self, usable: np.ndarray, n_keys: int) -> tuple[np.ndarray, np.ndarray]:
        """(gain, item) per key 0..n_keys-1; -inf and NONE where no item is usable. Work in
        the usable items only, past one scan of the mask: once the first rounds have run,
        few bids hold GPUs, and so few moves are usable."""
        best = np.full(n_keys, -np.inf)
        pick = np.full(n_keys, NONE)
        at = np.flatnonzero(usable)
        if at.size:
            key = self.key[at]
            first = at[np.r_[True, key[1:] != key[:-1]]]  # in key order: each key's first
            best[self.key[first]] = self.gain[first]
            pick[self.key[first]] = self.item[first]
        return best, pick


@dataclass(frozen=True)
class _View:
    """The live tenants' arcs, the tenants renumbered 0..n-1 (``tenants``: their numbers in
    the block)."""

    tenants: np.ndarray
    entries: _Segments
    entry_bid: np.ndarray
    moves: _Segments
    move_from: np.ndarray
    move_to: np.ndarray

    @classmethod
    def of(cls, p: _Problem, live: np.ndarray) -> _View:
        T = p.T
        tenants = np.flatnonzero(live)
        row = np.full(p.n, NONE)
        row[tenants] = np.arange(tenants.size)
        entry = p.entry[live[p.tenant[p.entry]]]
        keep = live[p.tenant[p.move_from]]
        move_from, move_to = p.move_from[keep], p.move_to[keep]
        move_key = (row[p.tenant[move_from]] * T + p.tier[move_from]) * T + p.tier[move_to]
        return cls(
            tenants=tenants,
            entries=_Segments(
                key=row[p.tenant[entry]] * T + p.tier[entry], gain=p.value[entry], item=entry
            ),
            entry_bid=p.bid_row[entry],
            moves=_Segments(key=move_key, gain=p.move_gain[keep], item=np.arange(move_from.size)),
            move_from=move_from,
            move_to=move_to,
        )
