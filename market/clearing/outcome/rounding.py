"""Whole-GPU rounding of a fractional allocation, in the mechanism's own priority.

Flooring every arc keeps every upper bound (bid quantity, share cap, tier capacity), since
those are whole numbers. The GPUs that flooring frees are handed out again one at a time,
in passes: in each pass every tenant may get at most one GPU, tenants taken in order of

1. the furthest below its guarantee (utility / guarantee, lowest first),
2. the mechanism's priority at the current utilities (highest first),
3. tenant index (names sorted), for a deterministic tie-break;

and while a tenant below its guarantee can take a GPU, a pass is only for such tenants. A
tenant's GPU goes to its arc with the largest fractional part that still has room (ties:
bid id, then tier). Priorities are recomputed between passes, so a tenant that got a GPU
falls back behind the others, as the mechanism would have it. A gang bid that ends below
its minimum is dropped to 0, which no hard constraint forbids.

Lowest first (``lowest_first``, max-min fairness): a pass is open only to the tenants that
come no later, in the order above, than the earliest place any tenant reaches with the GPU
it would take next. So no tenant gets a GPU while another, even after its own next GPU,
would still come before it: a tenant left furthest behind with two GPUs to come gets both
before a tenant ahead of it gets one. It is done twice, once with each tenant's GPU going to
its arc of most value by the fractions (fractional part times the tenant's value of the
arc) and once by largest fractional part, and the better is kept: the one whose tenant
furthest behind comes later in the order above, then the one of more value.

Last, the tenants the passes left below their guarantee take GPUs the fractions did not
point to (``meet_guarantees``, in rounds of one GPU a tenant): a bid's GPU moved to the
bid's tier of more value, a free GPU on an arc the fractions left at zero, or a GPU from a
tenant that stays at or above its own guarantee without it. fisher's rounding left 1-2
guarantees unmet on 4 of 6 benchmark instances, maxmin's about 930 of 2,941 tenants on each
part of the platform's million-bid round; none after (docs/clearing.md).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

import numpy as np

from market.clearing.mechanisms.rules import EPS, OpenMarket


def round_whole(
    m: OpenMarket,
    *,
    x: np.ndarray,
    arc_tenant: np.ndarray,
    arc_value: np.ndarray,
    guarantee: np.ndarray,
    priority: Callable[[np.ndarray], np.ndarray],
    gang_min: np.ndarray,
    lowest_first: bool = False,
) -> np.ndarray:
    """Whole GPUs per arc (E,). ``priority(utility (N,)) -> (N,)``, higher goes first;
    gang_min (B,): GPUs a kept gang bid needs, 0 otherwise; ``lowest_first``: the rule of
    max-min fairness (module docstring)."""
    rule = dict(
        x=x,
        arc_tenant=arc_tenant,
        arc_value=arc_value,
        guarantee=guarantee,
        priority=priority,
        gang_min=gang_min,
    )
    if not lowest_first:
        xi = _rounded(m, **rule, by_value=False, lowest_first=False)
    else:
        # Each GPU where its tenant's fractions give it most value serves the tenant best
        # but can crowd a tier that the fractions spread over several tenants; the largest
        # fractions keep to that spread. Both are made and the better one is kept: the one
        # whose tenant furthest behind is further on, then the one of more value.
        made = [
            _rounded(m, **rule, by_value=by_value, lowest_first=True) for by_value in (True, False)
        ]
        xi = max(made, key=lambda xi: _standing(xi, **rule))
    del rule["x"]
    return meet_guarantees(m, xi, **rule)


def meet_guarantees(
    m: OpenMarket,
    xi: np.ndarray,
    *,
    arc_tenant: np.ndarray,
    arc_value: np.ndarray,
    guarantee: np.ndarray,
    priority: Callable[[np.ndarray], np.ndarray],
    gang_min: np.ndarray,
) -> np.ndarray:
    """``xi`` (whole GPUs per arc, within every room) with GPUs moved to the tenants it leaves
    below their guarantee. The passes hand out only what the fractions leave: a tenant can
    end short because a bid's last GPU went to its tier of less value, or because its
    fractions lay on tiers that filled first, while another tenant holds a GPU it could spare.

    In rounds. In each, every tenant below its guarantee asks for the step that gains it
    most and can be served: a GPU on one of its arcs whose bid has room, or a GPU of one of
    its bids moved to the bid's arc of more value, on a tier with a free GPU or with a GPU
    to spare. Tier by tier, the tenants furthest below their guarantee (then index) are
    served first: from the tier's free room while it lasts, then from the tenants that stay
    at or above their own guarantee without the GPU, those the mechanism would serve last
    first (lowest ``priority``; then the arc of least value, then the later arc), each giving
    as many as keep it at its guarantee. A tenant with no step is left as it is. Then the
    GPUs the moves freed go, in rounds of one GPU a tenant, to the arc of most value, with
    room, of the tenants that come first (below their guarantee first, then ``priority``).
    Gang bids neither give nor take. Nobody at or above its guarantee falls below it, and
    every room is kept."""
    tol = 1e-9 * (1.0 + np.abs(guarantee))
    utility = np.bincount(arc_tenant, weights=arc_value * xi, minlength=guarantee.size)
    if not ((guarantee > EPS) & (utility < guarantee - tol)).any():
        return xi
    s = _Rooms.of(m, xi.copy(), gang_min, arc_tenant, arc_value, utility)
    freed = _serve_short_tenants(m, s, arc_tenant, guarantee, tol, priority)
    _hand_out_freed(m, s, freed, arc_tenant, arc_value, guarantee, priority)
    return s.xi


def _serve_short_tenants(
    m: OpenMarket,
    s: _Rooms,
    arc_tenant: np.ndarray,
    guarantee: np.ndarray,
    tol: np.ndarray,
    priority: Callable[[np.ndarray], np.ndarray],
) -> np.ndarray:
    """The rounds of ``meet_guarantees`` that serve each short tenant's best step, in
    ``s``; returns the GPUs per tier (T,) that the moves freed."""
    freed = np.zeros(m.tier_room.size)
    stuck = np.zeros(guarantee.size, dtype=bool)
    for _ in range(int(m.tier_room.sum()) + 1):
        short = (guarantee > EPS) & (s.utility < guarantee - tol) & ~stuck
        if not short.any():
            break
        spare = _spare(s, guarantee, tol)
        to, off, asking = _asked(s, short, spare)
        stuck |= short & ~asking
        if to.size == 0:
            break
        to, off, tier = _asks_in_order(m, s, to, off, arc_tenant, guarantee)
        to, off, tier, free, source = _served_asks(
            m, s, spare, to, off, tier, guarantee, tol, priority
        )
        if to.size == 0:
            break
        _move(m, s, freed, to, off, tier, free, source)
    return freed


def _asks_in_order(
    m: OpenMarket,
    s: _Rooms,
    to: np.ndarray,
    off: np.ndarray,
    arc_tenant: np.ndarray,
    guarantee: np.ndarray,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(to, off, tier) of the asks: furthest below the guarantee first, then index; then
    tier by tier."""
    who = arc_tenant[to]
    order = np.lexsort((who, s.utility[who] / guarantee[who]))
    to, off = to[order], off[order]
    tier = m.arc_tier[to]
    order = np.argsort(tier, kind="stable")
    return to[order], off[order], tier[order]


def _served_asks(
    m: OpenMarket,
    s: _Rooms,
    spare: np.ndarray,
    to: np.ndarray,
    off: np.ndarray,
    tier: np.ndarray,
    guarantee: np.ndarray,
    tol: np.ndarray,
    priority: Callable[[np.ndarray], np.ndarray],
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(to, off, tier, free, source) of the asks served: from the tier's free room while it
    lasts (``free``), then from a donor arc (``source``, -1 for a free GPU)."""
    place = np.arange(tier.size) - np.searchsorted(tier, tier)  # k-th ask on its tier
    room = np.floor(s.tier_left + EPS)
    free = place < room[tier]
    source = np.full(to.size, -1)
    rest = np.flatnonzero(~free)
    if rest.size:
        asked = np.zeros(room.size, dtype=bool)
        asked[tier[rest]] = True
        donors = _donors(s, spare, asked, guarantee, tol, priority)
        d_tier = m.arc_tier[donors]
        first = np.searchsorted(d_tier, np.arange(room.size))
        count = np.searchsorted(d_tier, np.arange(room.size), side="right") - first
        k = place[rest] - room[tier[rest]].astype(np.int64)
        ok = k < count[tier[rest]]
        source[rest[ok]] = donors[first[tier[rest[ok]]] + k[ok]]
        keep = free | (source >= 0)
        to, off, tier, free, source = to[keep], off[keep], tier[keep], free[keep], source[keep]
    return to, off, tier, free, source


def _move(
    m: OpenMarket,
    s: _Rooms,
    freed: np.ndarray,
    to: np.ndarray,
    off: np.ndarray,
    tier: np.ndarray,
    free: np.ndarray,
    source: np.ndarray,
) -> None:
    """Give each served ask its GPU, in ``s``: taken from its other arc (counted in
    ``freed``), then from the tier's free room or its donor."""
    s.add(to, 1.0, bid=off < 0)
    moved = off >= 0
    s.add(off[moved], -1.0, bid=False)
    np.add.at(s.tier_left, m.arc_tier[off[moved]], 1.0)
    np.add.at(freed, m.arc_tier[off[moved]], 1.0)
    s.add(source[~free], -1.0, bid=True)
    np.subtract.at(s.tier_left, tier[free], 1.0)


def _hand_out_freed(
    m: OpenMarket,
    s: _Rooms,
    freed: np.ndarray,
    arc_tenant: np.ndarray,
    arc_value: np.ndarray,
    guarantee: np.ndarray,
    priority: Callable[[np.ndarray], np.ndarray],
) -> None:
    """Give the ``freed`` GPUs, in ``s``, in rounds of one GPU a tenant, to the arc of most
    value with room of the tenants that come first."""
    for _ in range(int(freed.sum())):
        open_tier = (freed >= 1.0 - EPS) & (s.tier_left >= 1.0 - EPS)
        can = np.flatnonzero(open_tier[m.arc_tier] & s.room_for_one() & (arc_value > 0))
        if can.size == 0:
            break
        who = arc_tenant[can]
        first, second = _keys(s.utility, guarantee, priority(s.utility))
        can = can[np.lexsort((can, -arc_value[can], who, second[who], first[who]))]
        can = can[np.r_[True, arc_tenant[can][1:] != arc_tenant[can][:-1]]]  # one a tenant
        tier = m.arc_tier[can]
        order = np.argsort(tier, kind="stable")
        can, tier = can[order], tier[order]
        place = np.arange(tier.size) - np.searchsorted(tier, tier)
        can = can[place < np.minimum(np.floor(freed + EPS), np.floor(s.tier_left + EPS))[tier]]
        s.add(can, 1.0, bid=True)
        np.subtract.at(s.tier_left, m.arc_tier[can], 1.0)
        np.subtract.at(freed, m.arc_tier[can], 1.0)


def _asked(
    s: _Rooms, short: np.ndarray, spare: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(to, off, asking): each short tenant's best step in ``meet_guarantees`` that can be
    served this round, a GPU onto arc ``to`` moved off ``off`` of the same bid (-1: the
    bid's room); ``asking`` (N,): the tenants that have one."""
    m, xi, v = s.m, s.xi, s.arc_value
    at = s.arc_tenant
    mine = np.flatnonzero(short[at] & s.loose & (v > 0))
    mine = mine[s.group_ok(mine)]
    # Each bid's held arc of least value (then the later arc), for a move within the bid.
    held = np.flatnonzero(short[at] & s.loose & (xi >= 1.0 - EPS))
    held = held[np.lexsort((-held, v[held], m.arc_bid[held]))]
    held = held[np.r_[True, m.arc_bid[held][1:] != m.arc_bid[held][:-1]]] if held.size else held
    lowest = np.full(m.bid_room.size, -1)
    lowest[m.arc_bid[held]] = held
    bid = m.arc_bid[mine]
    room = s.bid_left[bid] >= 1.0 - EPS
    off = np.where(room, -1, lowest[bid])
    gain = np.where(room, v[mine], v[mine] - v[np.maximum(off, 0)])
    valid = room | ((off >= 0) & (gain > 0))
    # Served only where the tier has a free GPU or a GPU to spare (``spare``).
    open_tier = np.floor(s.tier_left + EPS) >= 1.0
    open_tier[m.arc_tier[spare]] = True
    valid &= open_tier[m.arc_tier[mine]]
    mine, off, gain = mine[valid], off[valid], gain[valid]
    order = np.lexsort((mine, -gain, at[mine]))  # each tenant's best step first
    mine, off = mine[order], off[order]
    first = np.r_[True, at[mine][1:] != at[mine][:-1]] if mine.size else np.zeros(0, dtype=bool)
    asking = np.zeros(short.size, dtype=bool)
    asking[at[mine[first]]] = True
    return mine[first], off[first], asking


def _spare(s: _Rooms, guarantee: np.ndarray, tol: np.ndarray) -> np.ndarray:
    """Arcs holding a GPU whose tenant stays at or above its guarantee without it."""
    at, v = s.arc_tenant, s.arc_value
    ok = s.loose & (s.xi >= 1.0 - EPS)
    ok &= s.utility[at] - v >= guarantee[at] - tol[at]
    return np.flatnonzero(ok)


def _donors(
    s: _Rooms,
    spare: np.ndarray,
    tiers: np.ndarray,
    guarantee: np.ndarray,
    tol: np.ndarray,
    priority: Callable[[np.ndarray], np.ndarray],
) -> np.ndarray:
    """The GPUs the arcs ``spare`` on the ``tiers`` (bool, T) still asked for can give, an
    arc repeated once a GPU, by tier and, within a tier, in the order they give (the tenant
    the mechanism would serve last, then least value, then the later arc). A tenant gives
    no more than keeps it at its guarantee, counting its arcs before in that order as if
    they gave all they hold."""
    spare = spare[tiers[s.m.arc_tier[spare]]]
    score = priority(s.utility)[s.arc_tenant[spare]]
    spare = spare[np.lexsort((-spare, s.arc_value[spare], score))]
    by = np.argsort(s.arc_tenant[spare], kind="stable")  # each tenant's run, that order within
    arcs = spare[by]
    who, v, held = s.arc_tenant[arcs], s.arc_value[arcs], np.floor(s.xi[arcs] + EPS)
    before = np.cumsum(v * held) - v * held
    before -= before[np.searchsorted(who, who)]  # within the tenant's run
    slack = s.utility[who] - guarantee[who] + tol[who] - before
    gives = np.empty(spare.size, dtype=np.int64)
    gives[by] = np.clip(np.floor(slack / v + EPS), 0, held).astype(np.int64)
    units = np.repeat(spare, gives)
    return units[np.argsort(s.m.arc_tier[units], kind="stable")]


def _left(m: OpenMarket, xi: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The room the GPUs ``xi`` (per arc) leave each bid, tier and share-cap group."""
    capped = m.arc_capped >= 0
    return (
        m.bid_room - np.bincount(m.arc_bid, weights=xi, minlength=m.bid_room.size),
        m.tier_room - np.bincount(m.arc_tier, weights=xi, minlength=m.tier_room.size),
        m.group_room
        - np.bincount(m.arc_capped[capped], weights=xi[capped], minlength=m.group_room.size),
    )


@dataclass
class _Rooms:
    """An allocation and the room it leaves, changed in place by ``meet_guarantees``."""

    m: OpenMarket
    xi: np.ndarray
    bid_left: np.ndarray
    tier_left: np.ndarray
    group_left: np.ndarray
    loose: np.ndarray  # (E,) the arc's bid is not a gang
    arc_tenant: np.ndarray
    arc_value: np.ndarray
    utility: np.ndarray

    @classmethod
    def of(cls, m, xi, gang_min, arc_tenant, arc_value, utility) -> _Rooms:
        bid_left, tier_left, group_left = _left(m, xi)
        return cls(
            m=m,
            xi=xi,
            bid_left=bid_left,
            tier_left=tier_left,
            group_left=group_left,
            loose=gang_min[m.arc_bid] <= 0,
            arc_tenant=arc_tenant,
            arc_value=arc_value,
            utility=utility,
        )

    def add(self, arcs: np.ndarray, gpus: float, *, bid: bool | np.ndarray) -> None:
        """``gpus`` more on each of ``arcs`` (an arc repeated takes them again), with their
        groups' and tenants' sums, and their bids' where ``bid`` (a move within a bid leaves
        the bid's total); not the tiers'."""
        arcs = np.asarray(arcs, dtype=np.int64)
        np.add.at(self.xi, arcs, gpus)
        with_bid = arcs[np.broadcast_to(bid, arcs.shape)]
        np.subtract.at(self.bid_left, self.m.arc_bid[with_bid], gpus)
        group = self.m.arc_capped[arcs]
        np.subtract.at(self.group_left, group[group >= 0], gpus)
        np.add.at(self.utility, self.arc_tenant[arcs], gpus * self.arc_value[arcs])

    def group_ok(self, arcs: np.ndarray) -> np.ndarray:
        """(arcs,) bool: the arc is in no share-cap group, or its group has room for a GPU."""
        group = self.m.arc_capped[arcs]
        left = np.r_[self.group_left, np.inf]  # the last: no group
        return left[np.where(group < 0, self.group_left.size, group)] >= 1.0 - EPS

    def room_for_one(self) -> np.ndarray:
        """(E,) bool: the arc's bid and share-cap group have room for a GPU, not a gang."""
        return (
            self.loose
            & (self.bid_left[self.m.arc_bid] >= 1.0 - EPS)
            & self.group_ok(np.arange(self.xi.size))
        )


def _standing(
    xi: np.ndarray,
    *,
    arc_tenant: np.ndarray,
    arc_value: np.ndarray,
    guarantee: np.ndarray,
    priority: Callable[[np.ndarray], np.ndarray],
    **_: object,
) -> tuple[float, float, float]:
    """How good a rounding is, larger better: the place (``_keys``) of its tenant furthest
    behind, then its total value."""
    utility = np.bincount(arc_tenant, weights=arc_value * xi, minlength=guarantee.size)
    first, second = _keys(utility, guarantee, priority(utility))
    worst = np.lexsort((second, first))[0]
    return float(first[worst]), float(second[worst]), float(utility.sum())


def _rounded(
    m: OpenMarket,
    *,
    x: np.ndarray,
    arc_tenant: np.ndarray,
    arc_value: np.ndarray,
    guarantee: np.ndarray,
    priority: Callable[[np.ndarray], np.ndarray],
    gang_min: np.ndarray,
    by_value: bool,
    lowest_first: bool,
) -> np.ndarray:
    """``round_whole`` by one rule: each tenant's candidates by fractional part, or by
    fractional part times value (``by_value``); passes open to all, or ``lowest_first``."""
    xi = np.floor(x + EPS)
    frac = x - xi
    # Candidate arcs, grouped by tenant, each tenant's in the order it would take them (ties
    # in arc order: by bid, then tier, as the sorts are stable).
    arc = np.flatnonzero(frac > EPS)
    worth = frac[arc] * arc_value[arc] if by_value else frac[arc]
    arc = arc[np.lexsort((-worth, arc_tenant[arc]))]
    bid_left, tier_left, group_left = _left(m, xi)
    s = _State(
        xi=xi,
        bid_left=bid_left,
        tier_left=tier_left,
        group_left=group_left,
        utility=np.bincount(arc_tenant, weights=arc_value * xi, minlength=guarantee.size),
        arc=arc,
        owner=arc_tenant[arc],
        bid=m.arc_bid[arc],
        tier=m.arc_tier[arc],
        group=m.arc_capped[arc],
        taken=np.zeros(arc.size, dtype=bool),
    )
    while s.arc.size and s.tier_left.max(initial=0.0) >= 1.0 - EPS:
        # A candidate that no longer fits never will (room only shrinks): left out, so
        # that at the start of a pass every candidate fits.
        s = s.fitting()
        if s.arc.size == 0:
            break
        keys = _keys(s.utility, guarantee, priority(s.utility))
        shut = _shut(s, keys, arc_value, guarantee, priority, lowest_first=lowest_first)
        if not _one_pass(m, s, arc_value=arc_value, rank=_rank(keys), shut=shut):
            break
    total = np.bincount(m.arc_bid, weights=xi, minlength=m.bid_room.size)
    drop = (gang_min > 0) & (total < gang_min - EPS)
    xi[drop[m.arc_bid]] = 0.0
    return xi


@dataclass(frozen=True)
class _State:
    """What the passes change, in place; the candidates are left out as they stop fitting."""

    xi: np.ndarray  # (E,) whole GPUs per arc
    bid_left: np.ndarray  # (B,) room left
    tier_left: np.ndarray  # (T,)
    group_left: np.ndarray  # (G,)
    utility: np.ndarray  # (N,) value of xi to each tenant
    arc: np.ndarray  # (C,) candidate arcs, grouped by tenant, in the order it takes them
    owner: np.ndarray  # (C,) the tenant of each candidate
    bid: np.ndarray  # (C,) its bid
    tier: np.ndarray  # (C,) its tier
    group: np.ndarray  # (C,) its share-cap group, -1 if none
    taken: np.ndarray  # (C,) bool, the candidate already got its GPU

    def fitting(self) -> _State:
        """The candidates not yet taken whose bid, share-cap group and tier have a GPU left."""
        ok = ~self.taken & (self.bid_left[self.bid] >= 1.0 - EPS)
        ok &= self.tier_left[self.tier] >= 1.0 - EPS
        capped = np.flatnonzero(self.group >= 0)
        ok[capped] &= self.group_left[self.group[capped]] >= 1.0 - EPS
        keep = np.flatnonzero(ok)
        return replace(
            self,
            arc=self.arc[keep],
            owner=self.owner[keep],
            bid=self.bid[keep],
            tier=self.tier[keep],
            group=self.group[keep],
            taken=self.taken[keep],
        )

    def firsts(self, ok: np.ndarray | None = None) -> np.ndarray:
        """Indices of each tenant's first candidate (of those ``ok``)."""
        pick = np.flatnonzero(ok) if ok is not None else np.arange(self.arc.size)
        return (
            pick[np.r_[True, self.owner[pick][1:] != self.owner[pick][:-1]]] if pick.size else pick
        )


def _keys(
    utility: np.ndarray, guarantee: np.ndarray, score: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Each tenant's place in a pass as two keys, lowest first: how far it is below its
    guarantee (1 at or above it), then its priority ``score`` negated."""
    below = np.where(guarantee > EPS, utility / np.maximum(guarantee, EPS), np.inf)
    return np.minimum(below, 1.0), -score


def _rank(keys: tuple[np.ndarray, np.ndarray]) -> np.ndarray:
    """(N,) each tenant's place in a pass: by ``_keys``, then index."""
    first, second = keys
    order = np.lexsort((np.arange(first.size), second, first))
    rank = np.empty(first.size, dtype=np.int64)
    rank[order] = np.arange(first.size)
    return rank


def _shut(
    s: _State,
    keys: tuple[np.ndarray, np.ndarray],
    arc_value: np.ndarray,
    guarantee: np.ndarray,
    priority: Callable[[np.ndarray], np.ndarray],
    *,
    lowest_first: bool,
) -> np.ndarray | None:
    """(N,) bool: the tenants the next pass is shut to (None: none), every candidate of
    ``s`` fitting. While a tenant below its guarantee can take a GPU, every tenant that is
    not below it. Lowest first, also those that come after the earliest place (``_keys``)
    any tenant reaches with the GPU it would take next: every other tenant would get its
    next GPU before any tenant gets a second, so one pass gives each of them one."""
    N = keys[0].size
    pick = s.firsts()
    who = s.owner[pick]
    shut = np.ones(N, dtype=bool)
    if lowest_first:
        after = s.utility.copy()
        after[who] += arc_value[s.arc[pick]]
        first, second = _keys(after, guarantee, priority(after))
        j = who[np.lexsort((second[who], first[who]))[0]]
        now_first, now_second = keys[0][who], keys[1][who]
        shut[who] = (now_first > first[j]) | ((now_first == first[j]) & (now_second > second[j]))
        return shut
    short = who[keys[0][who] < 1.0]
    if short.size == 0:
        return None
    shut[short] = False
    return shut


def _one_pass(
    m: OpenMarket,
    s: _State,
    *,
    arc_value: np.ndarray,
    rank: np.ndarray,
    shut: np.ndarray | None = None,
) -> bool:
    """One GPU to each tenant that can take one, in ``rank`` order, tenants ``shut`` left
    out; True if any was given. Every candidate of ``s`` fits at the start.

    Bids and share-cap groups belong to one tenant, which takes at most one GPU a pass, so
    only tier room is contested within a pass. Each tenant's first arc with room is found
    for all tenants at once; the grants are accepted in rank order up to the first that
    would overfill a tier, that tier is closed, and the tenants from there on choose again
    (at most one round per tier).
    """
    room = np.floor(s.tier_left + EPS)
    # Tenants served or passed over in this pass.
    done = np.zeros(rank.size, dtype=bool) if shut is None else shut.copy()
    given = False
    while True:
        pick = s.firsts(~done[s.owner] & (room[s.tier] >= 1.0))
        if pick.size == 0:
            return given
        pick = pick[np.argsort(rank[s.owner[pick]], kind="stable")]
        tier = s.tier[pick]
        # k-th grant on its tier, in rank order (1-based).
        order = np.argsort(tier, kind="stable")
        count = np.empty(pick.size, dtype=np.int64)
        starts = np.r_[0, np.flatnonzero(np.diff(tier[order])) + 1]
        lengths = np.diff(np.r_[starts, order.size])
        count[order] = np.arange(order.size) - np.repeat(starts, lengths) + 1
        over = np.flatnonzero(count > room[tier])
        stop = over[0] if over.size else pick.size
        k = pick[:stop]
        e = s.arc[k]
        s.xi[e] += 1.0
        s.taken[k] = True
        done[s.owner[k]] = True
        # One GPU a tenant, and its bids and groups are its own: no index repeats.
        s.bid_left[s.bid[k]] -= 1.0
        c = s.group[k]
        s.group_left[c[c >= 0]] -= 1.0
        s.utility[s.owner[k]] += arc_value[e]
        taken = np.bincount(tier[:stop], minlength=room.size)
        np.subtract(s.tier_left, taken, out=s.tier_left)
        room -= taken
        given = given or stop > 0
        if stop == pick.size:
            return given
