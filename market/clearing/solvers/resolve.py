"""The open-market welfare flow solved again once its rooms were lowered: only the bids the
change can move are solved, and the prices they end at prove the rest did not have to.

Welfare's bundle passes (welfare.py) solve one market after another, each with the same arcs
and profits as the one before and rooms no larger (a few tenants' bundles taken out). The
tier prices barely move between passes (at 100k bids of the benchmark, by one credit on some
tiers after the first pass and not at all after the third), so most bids stay where they
were: a bid that got its whole room on a tier among its best at the last prices, with a
surplus, and a bid that preferred nothing. Those bids are held (the winners' GPUs leave their
tiers' rooms) and the rest is solved as a min-cost flow, a few percent of the bids. A bid
with two equally good tiers is held on the one it had: solved again, it could fall on the
other, and the tenants it then displaces could fall below their guarantee and cost a pass
more (at 100k bids of the benchmark, 2-3 passes instead of 5-8, each of them optimal).

The held bids' choices are then checked at the least prices of the part solved: a winner's
tier must still be among its best and pay, and a loser must still want nothing. Those
prices, with each bid's best surplus as its own dual, then meet every dual constraint of the
whole market and complementary slackness with the allocation put together, so that
allocation is optimal for the whole market, as a flow of all of it would be (ties may fall
otherwise; equal limits still go to the earlier bid, ``fill_by_id``). A held bid that fails
the check joins the part solved, and so does a winner on a tier its held GPUs would
overfill; after NEAR_ROUNDS such checks, or once the part reaches NEAR_SHARE of the bids, the
whole market is solved instead.

Prices here are the solver's floats in the caller's unit (the platform sends whole
milli-credits), used only to choose the bids held and to check them; nobody is charged at
them. What a round charges is welfare's least prices of the last pass (``minimal_prices`` of
the whole market left), which ``round_clearing.tier_price`` turns into whole milli-credits.
"""

from __future__ import annotations

import numpy as np

from market.clearing.mechanisms.rules import EPS, OpenMarket
from market.clearing.outcome.prices import minimal_prices
from market.clearing.solvers.flow import WelfareNetwork, fill_by_id, welfare_flow

NEAR_ROUNDS = 4  # checks of the held bids before the whole market is solved instead
NEAR_SHARE = 0.5  # of the bids with room: a part this large is solved whole instead


def welfare_flow_near(
    network: WelfareNetwork,
    m: OpenMarket,
    before: OpenMarket,
    x_before: np.ndarray,
    prices_before: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray] | None:
    """(x, prices): GPUs per arc (E,) of a maximum-profit allocation of ``m``, a market
    left from ``before`` (the same arcs and profits, no room larger), and the least tier
    prices (T,) at which x is an equilibrium of ``m`` (the least of the part solved: they
    meet the held bids' constraints, checked, so no price of ``m`` is lower), given
    ``x_before``, a whole optimal allocation of ``before``, and prices at which it is an
    equilibrium (``prices_before``; the least ones when None);
    ``network``: the flow network of the market both are left from (``network.solve(m)``
    gives the same profit). None when rooms it has to solve are not whole (the caller
    solves its LP); a held bid's room need not be whole, it is not solved."""
    if prices_before is None:
        prices_before = minimal_prices(before, x_before)
    B = m.bid_room.size
    tol = 1e-7 * (1.0 + float(np.abs(m.arc_price).max(initial=0.0)))
    surplus = before.arc_price - prices_before[before.arc_tier]
    first = np.flatnonzero(np.r_[True, m.arc_bid[1:] != m.arc_bid[:-1]])  # of each bid's arcs
    best = _per_bid_max(surplus, m.arc_bid, first, B)
    used = x_before > EPS
    live, win_arc, held_win, held_lose, solve = _held_bids(
        m, before, x_before, surplus, best, used, tol
    )
    for _ in range(NEAR_ROUNDS):
        if np.count_nonzero(solve) > NEAR_SHARE * np.count_nonzero(live):
            break
        won = win_arc[held_win[m.arc_bid[win_arc]]]
        tier_room = m.tier_room - np.bincount(
            m.arc_tier[won], weights=x_before[won], minlength=m.tier_room.size
        )
        if tier_room.min(initial=0.0) < -EPS:
            released = _overfilling_winners(
                m, won, x_before, surplus, used, best, first, B, tier_room
            )
            held_win[released] = False
            solve[released] = True
            continue
        part = solve[m.arc_bid]
        sub = _unheld_market(m, part, solve, tier_room)
        x_sub = welfare_flow(sub, in_id_order=False)  # the whole pass is put in order below
        if x_sub is None:
            break
        prices = minimal_prices(sub, x_sub)
        wrong = _broken_holds(m, prices, won, held_win, held_lose, first, B, tol)
        if not wrong.any():
            x = np.zeros(m.arc_bid.size)
            x[won] = x_before[won]
            x[part] = x_sub
            return fill_by_id(m, x, network.same_arcs), prices
        held_win &= ~wrong
        held_lose &= ~wrong
        solve |= wrong
    x = network.solve(m)
    return None if x is None else (x, minimal_prices(m, x))


def _held_bids(
    m: OpenMarket,
    before: OpenMarket,
    x_before: np.ndarray,
    surplus: np.ndarray,
    best: np.ndarray,
    used: np.ndarray,
    tol: float,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(live, win_arc, held_win, held_lose, solve): the bids with room (B,); the arcs (E)
    that take a winner's whole room; the bids held as winners and as losers, and the rest,
    to solve (B,)."""
    B = m.bid_room.size
    flow = np.bincount(m.arc_bid, weights=x_before, minlength=B)
    capped = np.bincount(m.arc_bid, weights=m.arc_capped >= 0, minlength=B) > 0
    live = m.bid_room > EPS
    unchanged = live & ~capped & (m.bid_room == before.bid_room)
    # Winners: the whole room on one arc, among their best (a tie stays where it is), with a
    # surplus; losers: nothing wanted.
    win_arc = np.flatnonzero(used & (surplus >= best[m.arc_bid] - tol) & (surplus > tol))
    win_arc = win_arc[np.abs(x_before[win_arc] - m.bid_room[m.arc_bid[win_arc]]) <= EPS]
    held_win = np.zeros(B, dtype=bool)
    held_win[m.arc_bid[win_arc]] = True
    held_win &= unchanged
    held_lose = live & ~capped & (flow <= EPS) & (best < -tol)
    solve = live & ~held_win & ~held_lose
    return live, win_arc, held_win, held_lose, solve


def _overfilling_winners(
    m: OpenMarket,
    won: np.ndarray,
    x_before: np.ndarray,
    surplus: np.ndarray,
    used: np.ndarray,
    best: np.ndarray,
    first: np.ndarray,
    B: int,
    tier_room: np.ndarray,
) -> np.ndarray:
    """The held winners to release so that no tier is over-filled, least margin first."""
    # A winner's margin: its surplus over the best of its other arcs (a tie: 0).
    second = _per_bid_max(np.where(used, -np.inf, surplus), m.arc_bid, first, B)
    margin = best - np.maximum(second, 0.0)
    return _overfill(m, won, x_before, margin, tier_room)


def _unheld_market(
    m: OpenMarket, part: np.ndarray, solve: np.ndarray, tier_room: np.ndarray
) -> OpenMarket:
    """The market of the bids to solve (arcs ``part``), in the rooms the held winners leave."""
    return OpenMarket(
        arc_bid=m.arc_bid[part],
        arc_tier=m.arc_tier[part],
        arc_capped=m.arc_capped[part],
        arc_price=m.arc_price[part],
        bid_room=np.where(solve, m.bid_room, 0.0),
        group_room=m.group_room,
        tier_room=tier_room,
    )


def _broken_holds(
    m: OpenMarket,
    prices: np.ndarray,
    won: np.ndarray,
    held_win: np.ndarray,
    held_lose: np.ndarray,
    first: np.ndarray,
    B: int,
    tol: float,
) -> np.ndarray:
    """The held bids (B,) that the new prices make wrong: a winner no longer on a best arc
    with a surplus, or a loser that now has one."""
    now = m.arc_price - prices[m.arc_tier]
    now_best = _per_bid_max(now, m.arc_bid, first, B)
    kept = np.zeros(B, dtype=bool)
    kept[m.arc_bid[won]] = (now[won] >= now_best[m.arc_bid[won]] - tol) & (now[won] >= -tol)
    return (held_win & ~kept) | (held_lose & (now_best > tol))


def _per_bid_max(
    values: np.ndarray, arc_bid: np.ndarray, first: np.ndarray, n_bids: int
) -> np.ndarray:
    """The largest of ``values`` (E,) over each bid's arcs (``arc_bid`` sorted, ``first``:
    where each bid's arcs start); -inf for a bid without arcs."""
    out = np.full(n_bids, -np.inf)
    if arc_bid.size:
        out[arc_bid[first]] = np.maximum.reduceat(values, first)
    return out


def _overfill(
    m: OpenMarket, won: np.ndarray, x: np.ndarray, margin: np.ndarray, tier_room: np.ndarray
) -> np.ndarray:
    """Bids (indices) of the held winners ``won`` (arcs) to solve again on each tier their
    GPUs overfill (``tier_room`` < 0): those of least margin first, until what is left fits."""
    over = np.maximum(-tier_room, 0.0)
    arcs = won[over[m.arc_tier[won]] > EPS]
    arcs = arcs[np.lexsort((margin[m.arc_bid[arcs]], m.arc_tier[arcs]))]
    tier = m.arc_tier[arcs]
    before = np.cumsum(x[arcs]) - x[arcs]
    before -= before[np.searchsorted(tier, tier)]  # GPUs released before, on the same tier
    return m.arc_bid[arcs[before < over[tier] - EPS]]
