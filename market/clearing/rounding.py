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

Last, a tenant the passes left below its guarantee takes GPUs the fractions did not point
to (``meet_guarantees``): its bid's GPU moved to the bid's tier of more value, a free GPU on
an arc the fractions left at zero, or a GPU from a tenant that stays at or above its own
guarantee without it. fisher's rounding left 1-2 guarantees unmet on 4 of 6 benchmark
instances and none after (docs/clearing.md).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

import numpy as np

from .rules import EPS, OpenMarket


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
    """``xi`` (whole GPUs per arc, within every room) with GPUs moved, one at a time, to the
    tenants it leaves below their guarantee. The passes hand out only what the fractions
    leave: a tenant can end short because a bid's last GPU went to its tier of less value,
    or because its fractions lay on tiers that filled first, while another tenant holds a
    GPU it could spare.

    The tenant furthest below its guarantee (then index) takes the step that gains it most:
    a GPU on one of its arcs whose bid has room, or a GPU of one of its bids moved to the
    bid's arc of more value; the GPU comes from the tier's free room if it has any, else
    from the tenant that stays at or above its own guarantee without it and that the
    mechanism would serve last (lowest ``priority``; then the one losing least value, then
    the later arc). A tenant with no such step is left as it is. A GPU a move frees goes,
    one at a time, to the arc of most value, with room, of the tenant that comes first
    (below its guarantee first, then ``priority``). Gang bids neither give nor take. Nobody
    at or above its guarantee falls below it, and every room is kept."""
    tol = 1e-9 * (1.0 + np.abs(guarantee))
    utility = np.bincount(arc_tenant, weights=arc_value * xi, minlength=guarantee.size)
    short = (guarantee > EPS) & (utility < guarantee - tol)
    if not short.any():
        return xi
    s = _Rooms.of(m, xi.copy(), gang_min, arc_tenant, arc_value, utility)
    order = np.lexsort((-arc_value, arc_tenant))  # each tenant's arcs, most value first
    starts = np.searchsorted(arc_tenant[order], np.arange(guarantee.size + 1))
    freed = np.zeros(m.tier_room.size)
    left_as_is = np.zeros(guarantee.size, dtype=bool)
    for _ in range(int(short.sum() + m.tier_room.sum()) + 1):
        waiting = np.flatnonzero(short & ~left_as_is)
        if waiting.size == 0:
            break
        i = waiting[np.argmin(s.utility[waiting] / guarantee[waiting])]
        step = _best_step(s, order[starts[i] : starts[i + 1]], guarantee, tol, priority)
        if step is None:
            left_as_is[i] = True
            continue
        to, off, source = step
        s.add(to, 1.0, bid=off < 0)
        if off >= 0:
            s.add(off, -1.0, bid=False)
            s.tier_left[m.arc_tier[off]] += 1.0
            freed[m.arc_tier[off]] += 1.0
        if source >= 0:
            s.add(source, -1.0, bid=True)
        else:
            s.tier_left[m.arc_tier[to]] -= 1.0
        short[i] = s.utility[i] < guarantee[i] - tol[i]
    for _ in range(int(freed.sum())):
        open_tier = (freed >= 1.0 - EPS) & (s.tier_left >= 1.0 - EPS)
        can = np.flatnonzero(open_tier[m.arc_tier] & s.room_for_one() & (arc_value > 0))
        if can.size == 0:
            break
        who = arc_tenant[can]
        first, second = _keys(s.utility, guarantee, priority(s.utility))
        pick = can[np.lexsort((can, -arc_value[can], who, second[who], first[who]))[0]]
        s.add(pick, 1.0, bid=True)
        s.tier_left[m.arc_tier[pick]] -= 1.0
        freed[m.arc_tier[pick]] -= 1.0
    return s.xi


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
        capped = m.arc_capped >= 0
        return cls(
            m=m,
            xi=xi,
            bid_left=m.bid_room - np.bincount(m.arc_bid, weights=xi, minlength=m.bid_room.size),
            tier_left=m.tier_room - np.bincount(m.arc_tier, weights=xi, minlength=m.tier_room.size),
            group_left=m.group_room
            - np.bincount(m.arc_capped[capped], weights=xi[capped], minlength=m.group_room.size),
            loose=gang_min[m.arc_bid] <= 0,
            arc_tenant=arc_tenant,
            arc_value=arc_value,
            utility=utility,
        )

    def add(self, arc: int, gpus: float, *, bid: bool) -> None:
        """``gpus`` more on ``arc``, its group's and tenant's sums with it, its bid's when
        ``bid`` (a move within a bid leaves the bid's total); not the tier's."""
        self.xi[arc] += gpus
        if bid:
            self.bid_left[self.m.arc_bid[arc]] -= gpus
        group = self.m.arc_capped[arc]
        if group >= 0:
            self.group_left[group] -= gpus
        self.utility[self.arc_tenant[arc]] += gpus * self.arc_value[arc]

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


def _best_step(
    s: _Rooms,
    mine: np.ndarray,
    guarantee: np.ndarray,
    tol: np.ndarray,
    priority: Callable[[np.ndarray], np.ndarray],
) -> tuple[int, int, int] | None:
    """(to, off, source) of ``meet_guarantees``'s best step for the tenant of the arcs
    ``mine`` (most value first): a GPU onto ``to``, moved off ``off`` of the same bid (-1:
    the bid's room), taken from ``source`` (-1: the tier's free room); None when none."""
    m, xi, v = s.m, s.xi, s.arc_value
    mine = mine[s.loose[mine] & (v[mine] > 0) & s.group_ok(mine)]
    if mine.size == 0:
        return None
    # What each arc gains: its value with bid room, else over the bid's GPU of least value.
    bid = m.arc_bid[mine]
    held = np.where(xi[mine] >= 1.0 - EPS, v[mine], np.inf)
    lowest = {}
    for e, b, h in zip(mine.tolist(), bid.tolist(), held.tolist(), strict=True):
        if h < lowest.get(b, (np.inf, -1))[0]:
            lowest[b] = (h, e)
    steps = []
    for e, b in zip(mine.tolist(), bid.tolist(), strict=True):
        if s.bid_left[b] >= 1.0 - EPS:
            steps.append((v[e], e, -1))
        elif b in lowest and lowest[b][0] < v[e]:
            steps.append((v[e] - lowest[b][0], e, lowest[b][1]))
    if not steps:
        return None
    owner = s.arc_tenant[mine[0]]
    spare = None
    for _, to, off in sorted(steps, key=lambda g: (-g[0], g[1])):
        tier = m.arc_tier[to]
        if s.tier_left[tier] >= 1.0 - EPS:
            return to, off, -1
        if spare is None:
            at = s.arc_tenant
            spare = np.flatnonzero(
                s.loose
                & (xi >= 1.0 - EPS)
                & (at != owner)
                & (s.utility[at] - v >= guarantee[at] - tol[at])
            )
        here = spare[m.arc_tier[spare] == tier]
        if here.size:
            score = priority(s.utility)[s.arc_tenant[here]]
            return to, off, int(here[np.lexsort((-here, v[here], score))[0]])
    return None


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
    T, B, G, N = m.tier_room.size, m.bid_room.size, m.group_room.size, guarantee.size
    xi = np.floor(x + EPS)
    frac = x - xi
    capped = m.arc_capped >= 0
    # Candidate arcs, grouped by tenant, each tenant's in the order it would take them (ties
    # in arc order: by bid, then tier, as the sorts are stable).
    arc = np.flatnonzero(frac > EPS)
    worth = frac[arc] * arc_value[arc] if by_value else frac[arc]
    arc = arc[np.lexsort((-worth, arc_tenant[arc]))]
    s = _State(
        xi=xi,
        bid_left=m.bid_room - np.bincount(m.arc_bid, weights=xi, minlength=B),
        tier_left=m.tier_room - np.bincount(m.arc_tier, weights=xi, minlength=T),
        group_left=m.group_room
        - np.bincount(m.arc_capped[capped], weights=xi[capped], minlength=G),
        utility=np.bincount(arc_tenant, weights=arc_value * xi, minlength=N),
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
    total = np.bincount(m.arc_bid, weights=xi, minlength=B)
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
