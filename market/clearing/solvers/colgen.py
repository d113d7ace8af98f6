"""Welfare LP on the open market, solved by column generation.

max  sum_e p_e x_e
s.t. sum_{e in bid b} x_e <= room_b          (u_b >= 0)
     sum_{e in capped group g} x_e <= room_g (gamma_g >= 0)
     sum_{e on tier t} x_e <= room_t         (pi_t >= 0)
     x >= 0

A direct LP of a 100k-bid instance takes minutes (dual degeneracy), yet at the optimum
almost every bid sits on one tier. So the master problem holds few arcs, and bids with a
single arc in it are merged into one column per (tier, capped group, limit): a few hundred
columns instead of 100k rows. First, a few damped price-discovery rounds put each bid on its
single best arc at the current prices (masters of merged columns only, milliseconds each).
Then exact rounds: arcs with a positive reduced cost p_e - pi_t - gamma_g - u_b join the
master until none is left, which proves optimality for the full LP. A merged column is
shared out among its bids in bid-id order: that is the tie-break between equal limits.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp

from market.clearing.mechanisms.rules import EPS, OpenMarket, segment_starts
from market.clearing.solvers import highs

MAX_ROUNDS = 40
WARM_ROUNDS = 4  # single-arc price-discovery rounds before the exact ones
PRUNE_ROUNDS = 10  # rounds that may also drop columns; later rounds only add


@dataclass(frozen=True)
class WelfareSolution:
    x: np.ndarray  # (E,) GPUs per arc
    seconds: float  # time inside the solver
    rounds: int  # master problems solved


def _master(m: OpenMarket, arcs: np.ndarray) -> tuple[highs.LpSolution, dict]:
    T, B = m.tier_room.size, m.bid_room.size
    bid = m.arc_bid[arcs]
    single = np.bincount(bid, minlength=B)[bid] == 1
    s_arcs, i_arcs = arcs[single], arcs[~single]

    s_arcs = s_arcs[
        np.lexsort(
            (m.arc_bid[s_arcs], m.arc_price[s_arcs], m.arc_capped[s_arcs], m.arc_tier[s_arcs])
        )
    ]
    change = np.ones(s_arcs.size, dtype=bool)
    if s_arcs.size:
        for key in (m.arc_tier, m.arc_capped, m.arc_price):
            change[1:] &= key[s_arcs][1:] == key[s_arcs][:-1]
        change = ~change
        change[0] = True
    s_col = np.cumsum(change) - 1
    n_agg = int(s_col[-1]) + 1 if s_arcs.size else 0
    head = s_arcs[change]

    multi_bids, i_row = np.unique(m.arc_bid[i_arcs], return_inverse=True)
    capped_groups, capped_row = np.unique(
        np.concatenate([m.arc_capped[head], m.arc_capped[i_arcs]]), return_inverse=True
    )
    has_group = capped_groups >= 0
    group_row_of = np.full(capped_groups.size, -1)
    group_row_of[has_group] = T + np.arange(int(has_group.sum()))
    g_rows = group_row_of[capped_row]
    n_groups = int(has_group.sum())

    cols = np.concatenate([np.arange(n_agg), n_agg + np.arange(i_arcs.size)])
    tiers = np.concatenate([m.arc_tier[head], m.arc_tier[i_arcs]])
    rows = [tiers, g_rows[g_rows >= 0], T + n_groups + i_row]
    colidx = [cols, cols[g_rows >= 0], n_agg + np.arange(i_arcs.size)]
    n_rows = T + n_groups + multi_bids.size
    A = sp.csc_matrix(
        (np.ones(sum(r.size for r in rows)), (np.concatenate(rows), np.concatenate(colidx))),
        shape=(n_rows, n_agg + i_arcs.size),
    )
    agg_upper = np.bincount(s_col, weights=m.bid_room[m.arc_bid[s_arcs]], minlength=n_agg)
    row_hi = np.concatenate(
        [m.tier_room, m.group_room[capped_groups[has_group]], m.bid_room[multi_bids]]
    )
    sol = highs.solve(
        cost=np.concatenate([m.arc_price[head], m.arc_price[i_arcs]]),
        matrix=A,
        row_lo=np.full(n_rows, -np.inf),
        row_hi=row_hi,
        col_lo=np.zeros(A.shape[1]),
        col_hi=np.concatenate([agg_upper, np.full(i_arcs.size, np.inf)]),
        what="welfare problem",
    )
    layout = dict(
        s_arcs=s_arcs,
        s_col=s_col,
        i_arcs=i_arcs,
        n_agg=n_agg,
        multi_bids=multi_bids,
        groups=capped_groups[has_group],
        n_groups=n_groups,
    )
    return sol, layout


def solve_welfare(m: OpenMarket) -> WelfareSolution:
    E, B, T = m.arc_bid.size, m.bid_room.size, m.tier_room.size
    live = m.bid_room[m.arc_bid] > EPS
    x = np.zeros(E)
    if not live.any():
        return WelfareSolution(x, 0.0, 0)
    idx = np.flatnonzero(live)
    seconds, rounds = 0.0, 0
    pi = np.zeros(T)
    gam = np.zeros(E)
    # Cheap price discovery first: each bid on its single best arc at the current prices
    # gives a master of a few hundred merged columns; a few such rounds bring the prices
    # close, so the exact rounds below start with few bids torn between tiers.
    for _ in range(WARM_ROUNDS):
        in_master = np.zeros(E, dtype=bool)
        in_master[_first_best(m, idx, m.arc_price[idx] - pi[m.arc_tier[idx]] - gam[idx])] = True
        sol, lay = _master(m, np.flatnonzero(in_master))
        seconds += sol.seconds
        rounds += 1
        new_pi = np.maximum(sol.row_dual[:T], 0.0)
        pi = 0.5 * (pi + new_pi)  # damped: a full step makes the bids swing between tiers
        gamma = np.zeros(m.group_room.size)
        gamma[lay["groups"]] = np.maximum(sol.row_dual[T : T + lay["n_groups"]], 0.0)
        gam = np.where(m.arc_capped >= 0, gamma[np.maximum(m.arc_capped, 0)], 0.0)
    reduced0 = m.arc_price - pi[m.arc_tier] - gam
    in_master = np.zeros(E, dtype=bool)
    in_master[_first_best(m, idx, reduced0[idx])] = True
    tol0 = 1e-7 * (1.0 + np.abs(m.arc_price))
    best0 = np.zeros(B)
    np.maximum.at(best0, m.arc_bid[idx], reduced0[idx])
    in_master |= live & (reduced0 >= best0[m.arc_bid] - tol0) & (reduced0 > -tol0)

    gamma = np.zeros(m.group_room.size)
    while True:
        rounds += 1
        arcs = np.flatnonzero(in_master)
        sol, lay = _master(m, arcs)
        seconds += sol.seconds
        pi = np.maximum(sol.row_dual[:T], 0.0)
        gamma[:] = 0.0
        gamma[lay["groups"]] = np.maximum(sol.row_dual[T : T + lay["n_groups"]], 0.0)
        u = np.zeros(B)
        u[lay["multi_bids"]] = np.maximum(sol.row_dual[T + lay["n_groups"] :], 0.0)
        gam = np.where(m.arc_capped >= 0, gamma[np.maximum(m.arc_capped, 0)], 0.0)
        s = lay["s_arcs"]
        u[m.arc_bid[s]] = np.maximum(m.arc_price[s] - pi[m.arc_tier[s]] - gam[s], 0.0)
        reduced = m.arc_price - pi[m.arc_tier] - gam - u[m.arc_bid]
        tol = 1e-7 * (1.0 + np.abs(m.arc_price))
        enter = live & ~in_master & (reduced > tol)
        x = _arc_flow(m, sol.x, lay)
        if not enter.any():
            return WelfareSolution(x, seconds, rounds)
        if rounds >= MAX_ROUNDS:
            in_master = live.copy()  # last resort: the full LP, still exact
        elif rounds <= PRUNE_ROUNDS:
            # Early duals are rough: keep only arcs that carry flow (so the objective cannot
            # fall) or that are tied or better at the new prices, which keeps the master small.
            in_master = live & ((x > EPS) | (reduced > -tol))
        else:
            in_master |= enter


def _first_best(m: OpenMarket, idx: np.ndarray, score: np.ndarray) -> np.ndarray:
    """Arc indices: per bid among ``idx`` (sorted by bid), the first arc with the top score."""
    bid = m.arc_bid[idx]
    starts = segment_starts(bid)
    runs = np.diff(np.append(starts, idx.size))
    top = np.repeat(np.maximum.reduceat(score, starts), runs)
    is_best = score >= top
    count = np.cumsum(is_best)
    rank = count - np.repeat(count[starts] - is_best[starts], runs)
    return idx[is_best & (rank == 1)]


def _arc_flow(m: OpenMarket, flow: np.ndarray, lay: dict) -> np.ndarray:
    """GPUs per arc (E,) from the master's columns; merged columns fill bids in id order."""
    x = np.zeros(m.arc_bid.size)
    x[lay["i_arcs"]] = flow[lay["n_agg"] :]
    s, col = lay["s_arcs"], lay["s_col"]
    if s.size:
        room = m.bid_room[m.arc_bid[s]]
        before = np.cumsum(room) - room
        starts = segment_starts(col)
        before -= np.repeat(before[starts], np.diff(np.append(starts, s.size)))
        x[s] = np.clip(flow[col] - before, 0.0, room)
    return x
