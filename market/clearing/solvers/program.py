"""The market's constraints as an LP/MILP skeleton that welfare and maxmin share.

Over the arcs ``cols`` (GPUs x_e of bid b on tier t):
    capacity    sum_{e on t} x_e <= room_t
    cap         sum_{e in capped group g} x_e <= room_g
    quantity    sum_{e of b} x_e <= room_b
    gang rows   a gang on one tier:  m_b z_e <= x_e <= q_b z_e, sum_{e of b} z_e <= 1, z binary
                a mixed-tier gang:   m_b z_b <= sum_{e of b} x_e <= q_b z_b
Whole GPUs make x integer. ``utility_rows`` gives each tenant's value of x (N, K).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp

from market.clearing.mechanisms.rules import EPS, Market, OpenMarket, unique_inverse
from market.clearing.solvers import lp


@dataclass(frozen=True)
class Skeleton:
    program: lp.Program
    x: lp.Block
    cols: np.ndarray  # (K,) arc index of each x column
    has_gangs: bool


def market_program(
    market: Market, om: OpenMarket, *, what: str, gangs: bool = True, cols: np.ndarray | None = None
) -> Skeleton:
    """Every live arc of ``om`` (or ``cols``); gang bids as all-or-nothing when ``gangs``,
    otherwise left out."""
    live = om.bid_room[om.arc_bid] > EPS
    if not gangs:
        live &= ~market.is_gang[om.arc_bid]
    if cols is None:
        cols = np.flatnonzero(live)
    bid = om.arc_bid[cols]
    gang_arc = market.is_gang[bid]
    has_gangs = bool(gang_arc.any())
    p = lp.Program(what)
    x = p.variables("x", cols.size, integer=not market.divisible)
    T = om.tier_room.size
    p.constrain("capacity", [(x, lp.incidence(om.arc_tier[cols], T))], hi=om.tier_room)
    c = om.arc_capped[cols]
    if (c >= 0).any():
        groups, g_row = np.unique(c[c >= 0], return_inverse=True)
        rows = np.full(cols.size, -1)
        rows[c >= 0] = g_row
        p.constrain("cap", [(x, lp.incidence(rows, groups.size))], hi=om.group_room[groups])
    bids, b_row = unique_inverse(bid)
    p.constrain("quantity", [(x, lp.incidence(b_row, bids.size))], hi=om.bid_room[bids])
    if has_gangs:
        _gang_rows(market, p, x, bid, gang_arc)
    return Skeleton(program=p, x=x, cols=cols, has_gangs=has_gangs)


def _gang_rows(
    market: Market, p: lp.Program, x: lp.Block, bid: np.ndarray, gang_arc: np.ndarray
) -> None:
    a = market.arrays
    one = gang_arc & market.one_tier[bid]
    mixed = gang_arc & ~market.one_tier[bid]
    if one.any():
        # One binary per (gang bid, tier): the gang takes m..q GPUs of that tier or none.
        arcs = np.flatnonzero(one)
        z = p.variables("z_tier", arcs.size, hi=1.0, integer=True)
        sel = lp.incidence(arcs, bid.size).T.tocsr()  # row k picks x column arcs[k]
        q, m = a.quantity[bid[arcs]], a.min_quantity[bid[arcs]]
        p.constrain("gang_most", [(x, sel), (z, sp.diags(-q).tocsr())], hi=0.0)
        p.constrain("gang_least", [(x, sel), (z, sp.diags(-m).tocsr())], lo=0.0)
        gb, g_row = np.unique(bid[arcs], return_inverse=True)
        p.constrain("gang_one_tier", [(z, lp.incidence(g_row, gb.size))], hi=1.0)
    if mixed.any():
        gb = np.unique(bid[mixed])
        z = p.variables("z_bid", gb.size, hi=1.0, integer=True)
        per_bid = lp.incidence(np.where(mixed, np.searchsorted(gb, bid), -1), gb.size)
        q, m = a.quantity[gb], a.min_quantity[gb]
        p.constrain("mixed_most", [(x, per_bid), (z, sp.diags(-q).tocsr())], hi=0.0)
        p.constrain("mixed_least", [(x, per_bid), (z, sp.diags(-m).tocsr())], lo=0.0)


def utility_rows(market: Market, cols: np.ndarray, arc_value: np.ndarray):
    """(N, K): tenant i's value of the GPUs on the arcs ``cols``."""
    a = market.arrays
    return lp.incidence(a.arc_tenant[cols], a.n_tenants, arc_value[cols])


def guarantee_rows(sk: Skeleton, market: Market, arc_value: np.ndarray, target: np.ndarray) -> None:
    """u_i >= target_i for every tenant with something left to guarantee."""
    need = np.flatnonzero(target > EPS)
    rows = utility_rows(market, sk.cols, arc_value)[need]
    sk.program.constrain("guarantee", [(sk.x, rows)], lo=target[need])


def residual(om: OpenMarket, x: np.ndarray) -> OpenMarket:
    """The room ``x`` leaves on every tier, capped group and bid."""
    c = om.arc_capped >= 0
    return OpenMarket(
        arc_bid=om.arc_bid,
        arc_tier=om.arc_tier,
        arc_capped=om.arc_capped,
        arc_price=om.arc_price,
        bid_room=om.bid_room - np.bincount(om.arc_bid, weights=x, minlength=om.bid_room.size),
        group_room=om.group_room
        - np.bincount(om.arc_capped[c], weights=x[c], minlength=om.group_room.size),
        tier_room=om.tier_room - np.bincount(om.arc_tier, weights=x, minlength=om.tier_room.size),
    )
