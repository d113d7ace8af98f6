"""Whole-GPU rounding (rounding.round_whole): hand-checked passes, and the vectorised passes
against a one-tenant-at-a-time reference over random fractional allocations (hypothesis)."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from market.clearing.rounding import round_whole
from market.clearing.rules import EPS, OpenMarket


def reference(m: OpenMarket, *, x, arc_tenant, arc_value, guarantee, priority, gang_min):
    """The rule as documented, one GPU at a time: in each pass the tenants in order
    (furthest below guarantee, priority, index) take one GPU each on their first arc, by
    largest fractional part (then bid, tier), that still has room."""
    T, B, G, N = m.tier_room.size, m.bid_room.size, m.group_room.size, guarantee.size
    xi = np.floor(x + EPS)
    frac = x - xi
    bid_left = m.bid_room - np.bincount(m.arc_bid, weights=xi, minlength=B)
    tier_left = m.tier_room - np.bincount(m.arc_tier, weights=xi, minlength=T)
    capped = m.arc_capped >= 0
    group_left = m.group_room - np.bincount(m.arc_capped[capped], weights=xi[capped], minlength=G)
    utility = np.bincount(arc_tenant, weights=arc_value * xi, minlength=N)
    arcs = {i: [] for i in range(N)}
    for e in sorted(
        np.flatnonzero(frac > EPS).tolist(),
        key=lambda e: (-frac[e], m.arc_bid[e], m.arc_tier[e]),
    ):
        arcs[int(arc_tenant[e])].append(e)
    while tier_left.max(initial=0.0) >= 1.0 - EPS:
        below = np.where(guarantee > EPS, utility / np.maximum(guarantee, EPS), np.inf)
        score = priority(utility)
        order = sorted(range(N), key=lambda i: (min(below[i], 1.0), -score[i], i))
        given = False
        for i in order:
            for e in arcs[i]:
                g = m.arc_capped[e]
                if (
                    bid_left[m.arc_bid[e]] >= 1.0 - EPS
                    and tier_left[m.arc_tier[e]] >= 1.0 - EPS
                    and (g < 0 or group_left[g] >= 1.0 - EPS)
                ):
                    xi[e] += 1.0
                    bid_left[m.arc_bid[e]] -= 1.0
                    tier_left[m.arc_tier[e]] -= 1.0
                    if g >= 0:
                        group_left[g] -= 1.0
                    utility[i] += arc_value[e]
                    arcs[i].remove(e)
                    given = True
                    break
        if not given:
            break
    total = np.bincount(m.arc_bid, weights=xi, minlength=B)
    xi[((gang_min > 0) & (total < gang_min - EPS))[m.arc_bid]] = 0.0
    return xi


def market(arc_bid, arc_tier, *, bid_room, tier_room, arc_capped=None, group_room=()):
    arc_bid = np.asarray(arc_bid)
    return OpenMarket(
        arc_bid=arc_bid,
        arc_tier=np.asarray(arc_tier),
        arc_capped=np.full(arc_bid.size, -1) if arc_capped is None else np.asarray(arc_capped),
        arc_price=np.ones(arc_bid.size),
        bid_room=np.asarray(bid_room, dtype=float),
        group_room=np.asarray(group_room, dtype=float),
        tier_room=np.asarray(tier_room, dtype=float),
    )


def test_a_tier_filled_within_a_pass_sends_the_next_tenant_to_its_other_tier():
    # Three tenants, one bid each on tiers a and b with half a GPU on each; one GPU of each
    # tier is free. Tenant 0 goes first (highest priority) and takes a; tenant 1 finds a
    # full and takes b; tenant 2 gets nothing.
    m = market([0, 0, 1, 1, 2, 2], [0, 1] * 3, bid_room=[1, 1, 1], tier_room=[1, 1])
    x = np.array([0.5, 0.3, 0.5, 0.2, 0.5, 0.2])
    whole = round_whole(
        m,
        x=x,
        arc_tenant=np.array([0, 0, 1, 1, 2, 2]),
        arc_value=np.ones(6),
        guarantee=np.zeros(3),
        priority=lambda u: np.array([3.0, 2.0, 1.0]) - u,
        gang_min=np.zeros(3),
    )
    assert whole.tolist() == [1, 0, 0, 1, 0, 0]


def test_a_tenant_below_its_guarantee_goes_first_and_a_short_gang_is_dropped():
    # One free GPU: tenant 1 is below its guarantee and takes it despite a lower priority;
    # tenant 0's gang bid (minimum 2) stays at 1 GPU and is dropped.
    m = market([0, 1], [0, 0], bid_room=[2, 1], tier_room=[2])
    whole = round_whole(
        m,
        x=np.array([1.5, 0.5]),
        arc_tenant=np.array([0, 1]),
        arc_value=np.ones(2),
        guarantee=np.array([0.0, 1.0]),
        priority=lambda u: np.array([5.0, 1.0]),
        gang_min=np.array([2.0, 0.0]),
    )
    assert whole.tolist() == [0, 1]


@st.composite
def fractional(draw):
    """A random market and a fractional allocation that fits it."""
    T = draw(st.integers(1, 4))
    N = draw(st.integers(1, 6))
    B = draw(st.integers(1, 12))
    bid_tenant = np.array([draw(st.integers(0, N - 1)) for _ in range(B)])
    arcs = [
        (b, t)
        for b in range(B)
        for t in sorted(draw(st.sets(st.integers(0, T - 1), min_size=1, max_size=T)))
    ]
    arc_bid = np.array([b for b, _ in arcs])
    arc_tier = np.array([t for _, t in arcs])
    E = arc_bid.size
    x = np.array([draw(st.sampled_from([0.0, 0.25, 0.5, 1.0, 1.5, 2.75, 3.0])) for _ in range(E)])
    # Some (tenant, tier) groups capped: group id = tenant * T + tier where chosen.
    capped_pairs = draw(st.sets(st.integers(0, N * T - 1), max_size=3))
    pair = bid_tenant[arc_bid] * T + arc_tier
    groups = sorted(capped_pairs)
    arc_capped = np.array([groups.index(k) if k in capped_pairs else -1 for k in pair])
    slack = st.sampled_from([0, 0, 1, 2])

    def room(keys, n):
        used = np.bincount(keys, weights=x, minlength=n)
        return np.ceil(used - EPS) + np.array([draw(slack) for _ in range(n)])

    c = arc_capped >= 0
    group_room = np.ceil(np.bincount(arc_capped[c], weights=x[c], minlength=len(groups)) - EPS)
    m = market(
        arc_bid,
        arc_tier,
        bid_room=room(arc_bid, B),
        tier_room=room(arc_tier, T),
        arc_capped=arc_capped,
        group_room=group_room + np.array([draw(slack) for _ in groups]),
    )
    values = np.array([draw(st.integers(1, 9)) for _ in range(E)], dtype=float)
    guarantee = np.array([draw(st.sampled_from([0.0, 0.0, 2.0, 6.0])) for _ in range(N)])
    weight = np.array([draw(st.integers(1, 3)) for _ in range(N)], dtype=float)
    gang_min = np.array([draw(st.sampled_from([0.0, 0.0, 2.0])) for _ in range(B)])
    return dict(
        m=m,
        x=x,
        arc_tenant=bid_tenant[arc_bid],
        arc_value=values,
        guarantee=guarantee,
        priority=lambda u: weight / np.maximum(u, EPS),
        gang_min=gang_min,
    )


@settings(max_examples=300, deadline=None)
@given(fractional())
def test_round_whole_matches_the_one_gpu_at_a_time_rule(case):
    m = case.pop("m")
    whole = round_whole(m, **case)
    assert whole.tolist() == reference(m, **case).tolist()
    assert (np.bincount(m.arc_tier, weights=whole, minlength=m.tier_room.size) <= m.tier_room).all()
    assert (np.bincount(m.arc_bid, weights=whole, minlength=m.bid_room.size) <= m.bid_room).all()
