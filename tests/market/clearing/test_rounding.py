"""Whole-GPU rounding (rounding.round_whole): hand-checked passes, and the vectorised passes
against a one-tenant-at-a-time reference over random fractional allocations (hypothesis)."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from market.clearing.mechanisms import maxmin
from market.clearing.mechanisms.rules import EPS, OpenMarket
from market.clearing.outcome.rounding import meet_guarantees, round_whole


def reference(m: OpenMarket, *, lowest_first=False, **case):
    """The rule as documented; lowest first, the better of its two orders of arcs: the
    one whose tenant furthest behind comes later, then the one of more value."""
    if not lowest_first:
        return one_rule(m, **case, by_value=False, lowest_first=False)

    def standing(xi):
        u = np.bincount(case["arc_tenant"], weights=case["arc_value"] * xi, minlength=N)
        below = np.where(case["guarantee"] > EPS, u / np.maximum(case["guarantee"], EPS), np.inf)
        places = sorted(
            zip(np.minimum(below, 1.0).tolist(), (-case["priority"](u)).tolist(), strict=True)
        )
        return (*places[0], u.sum())

    N = case["guarantee"].size
    made = [one_rule(m, **case, by_value=b, lowest_first=True) for b in (True, False)]
    return max(made, key=standing)


def one_rule(
    m: OpenMarket,
    *,
    x,
    arc_tenant,
    arc_value,
    guarantee,
    priority,
    gang_min,
    by_value,
    lowest_first,
):
    """One GPU at a time: in each pass the tenants in order (furthest below guarantee,
    priority, index) take one GPU each on their first arc, by largest fractional part
    (``by_value``: fractional part times value; then bid, tier), that still has room; while
    a tenant below its guarantee can take one, only such tenants.
    ``lowest_first``: a pass is only for the tenants that come no later than the earliest
    place any tenant reaches with its next GPU."""
    T, B, G, N = m.tier_room.size, m.bid_room.size, m.group_room.size, guarantee.size
    xi = np.floor(x + EPS)
    frac = x - xi
    bid_left = m.bid_room - np.bincount(m.arc_bid, weights=xi, minlength=B)
    tier_left = m.tier_room - np.bincount(m.arc_tier, weights=xi, minlength=T)
    capped = m.arc_capped >= 0
    group_left = m.group_room - np.bincount(m.arc_capped[capped], weights=xi[capped], minlength=G)
    utility = np.bincount(arc_tenant, weights=arc_value * xi, minlength=N)
    worth = frac * arc_value if by_value else frac
    arcs = {i: [] for i in range(N)}
    for e in sorted(
        np.flatnonzero(frac > EPS).tolist(),
        key=lambda e: (-worth[e], m.arc_bid[e], m.arc_tier[e]),
    ):
        arcs[int(arc_tenant[e])].append(e)

    def place(u):
        below = np.where(guarantee > EPS, u / np.maximum(guarantee, EPS), np.inf)
        score = priority(u)
        return [(min(below[i], 1.0), -score[i]) for i in range(N)]

    def fits(e):
        g = m.arc_capped[e]
        return (
            bid_left[m.arc_bid[e]] >= 1.0 - EPS
            and tier_left[m.arc_tier[e]] >= 1.0 - EPS
            and (g < 0 or group_left[g] >= 1.0 - EPS)
        )

    while tier_left.max(initial=0.0) >= 1.0 - EPS:
        now = place(utility)
        order = sorted(range(N), key=lambda i: (now[i], i))
        if lowest_first:
            nexts = {i: next((e for e in arcs[i] if fits(e)), None) for i in range(N)}
            reached = []
            for i, e in nexts.items():
                if e is not None:
                    after = utility.copy()
                    after[i] += arc_value[e]
                    reached.append(place(after)[i])
            order = [
                i for i in order if nexts[i] is not None and reached and now[i] <= min(reached)
            ]
        else:
            short = [i for i in order if now[i][0] < 1.0 and any(fits(e) for e in arcs[i])]
            order = short or order
        given = False
        for i in order:
            for e in arcs[i]:
                g = m.arc_capped[e]
                if fits(e):
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


def test_a_tier_closed_within_a_pass_gives_no_tenant_a_second_gpu_in_that_pass():
    # Tier a has 2 free GPUs, tier b 1. Tenant 0 takes a, tenants 1 and 2 both want b:
    # tenant 2 chooses again after b closes and takes a. Nobody gets two GPUs in the pass;
    # each bid has room for one.
    m = market([0, 1, 2, 2], [0, 1, 1, 0], bid_room=[1, 1, 1], tier_room=[2, 1])
    whole = round_whole(
        m,
        x=np.array([0.5, 0.5, 0.5, 0.25]),
        arc_tenant=np.array([0, 1, 2, 2]),
        arc_value=np.ones(4),
        guarantee=np.zeros(3),
        priority=lambda u: np.array([3.0, 2.0, 1.0]) - u,
        gang_min=np.zeros(3),
    )
    assert whole.tolist() == [1, 1, 0, 1]


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


def test_tenants_below_their_guarantee_take_every_gpu_they_can_before_the_others_one():
    # Two free GPUs. Tenant 0 is owed 2 and holds nothing, with two bids of half a GPU;
    # tenant 1 is owed nothing and comes first by priority. Tenant 0 gets both: with one
    # each (a pass for everyone), tenant 0 ended below its guarantee.
    m = market([0, 1, 2], [0, 0, 0], bid_room=[1, 1, 1], tier_room=[2])
    whole = round_whole(
        m,
        x=np.array([0.5, 0.5, 0.5]),
        arc_tenant=np.array([0, 0, 1]),
        arc_value=np.ones(3),
        guarantee=np.array([2.0, 0.0]),
        priority=lambda u: np.array([1.0, 5.0]),
        gang_min=np.zeros(3),
    )
    assert whole.tolist() == [1, 1, 0]


def test_lowest_first_gives_the_tenant_furthest_behind_its_two_gpus_before_anyone_else_one():
    # Two free GPUs of one tier. Tenant 0 holds nothing and has two bids with half a GPU
    # each; tenant 1 holds 5 and has one with half a GPU. By passes tenant 0 and tenant 1
    # each get one (worst utility 1); lowest first tenant 0 gets both (worst 2), since after
    # its first it is still behind tenant 1.
    m = market([0, 1, 2, 3], [0, 0, 0, 1], bid_room=[1, 1, 1, 5], tier_room=[2, 5])
    case = dict(
        x=np.array([0.5, 0.5, 0.5, 5.0]),
        arc_tenant=np.array([0, 0, 1, 1]),
        arc_value=np.ones(4),
        guarantee=np.zeros(2),
        priority=lambda u: -u,
        gang_min=np.zeros(4),
    )
    assert round_whole(m, **case).tolist() == [1, 0, 1, 5]
    assert round_whole(m, **case, lowest_first=True).tolist() == [1, 1, 0, 5]


def test_lowest_first_puts_a_tenants_gpu_where_the_fractions_give_it_most_value():
    # One bid split 0.6 / 0.4 over tiers worth 1 and 3 to its tenant: the largest fraction
    # is the tier worth 1, the most value (0.6 against 1.2) the tier worth 3.
    m = market([0, 0], [0, 1], bid_room=[1], tier_room=[1, 1])
    case = dict(
        x=np.array([0.6, 0.4]),
        arc_tenant=np.array([0, 0]),
        arc_value=np.array([1.0, 3.0]),
        guarantee=np.zeros(1),
        priority=lambda u: -u,
        gang_min=np.zeros(1),
    )
    assert round_whole(m, **case).tolist() == [1, 0]
    assert round_whole(m, **case, lowest_first=True).tolist() == [0, 1]


def test_a_bids_gpu_moves_to_its_tier_of_more_value_when_rounding_left_its_tenant_short():
    # Tenant 0 is owed 3 and its one bid is worth 1 on tier a and 3 on tier b, split 0.6 /
    # 0.4; tenant 1 (owed nothing) has 0.4 / 0.6 on the same tiers, worth 2 on each. The
    # passes give tenant 0 tier a (its largest fraction) and tenant 1 tier b: tenant 0 ends
    # at 1. Its GPU moves to b, taken from tenant 1, which takes the GPU freed on a.
    m = market([0, 0, 1, 1], [0, 1, 0, 1], bid_room=[1, 1], tier_room=[1, 1])
    whole = round_whole(
        m,
        x=np.array([0.6, 0.4, 0.4, 0.6]),
        arc_tenant=np.array([0, 0, 1, 1]),
        arc_value=np.array([1.0, 3.0, 2.0, 2.0]),
        guarantee=np.array([3.0, 0.0]),
        priority=lambda u: -u,
        gang_min=np.zeros(2),
    )
    assert whole.tolist() == [0, 1, 1, 0]


def test_no_gpu_is_taken_from_a_tenant_that_would_fall_below_its_own_guarantee():
    # As above, but tenant 1 bids on tier b only and is owed its GPU there: tenant 0 stays
    # short rather than put tenant 1 below its guarantee.
    m = market([0, 0, 1], [0, 1, 1], bid_room=[1, 1], tier_room=[1, 1])
    case = dict(
        x=np.array([0.6, 0.4, 0.6]),
        arc_tenant=np.array([0, 0, 1]),
        arc_value=np.array([1.0, 3.0, 2.0]),
        guarantee=np.array([3.0, 2.0]),
        priority=lambda u: -u,
        gang_min=np.zeros(2),
    )
    assert round_whole(m, **case).tolist() == [1, 0, 1]
    # Owed nothing, tenant 1 gives its GPU up, and tier a's freed GPU finds nobody.
    case["guarantee"] = np.array([3.0, 0.0])
    assert round_whole(m, **case).tolist() == [0, 1, 0]


def test_a_free_gpu_goes_to_a_short_tenant_on_an_arc_the_fractions_left_at_zero():
    # Tenant 0's guarantee needs a second GPU, its bid has room and tier b a free GPU, but
    # the fractions put nothing on b: the passes never look there.
    m = market([0, 0], [0, 1], bid_room=[2], tier_room=[1, 1])
    whole = round_whole(
        m,
        x=np.array([1.0, 0.0]),
        arc_tenant=np.array([0, 0]),
        arc_value=np.array([1.0, 1.0]),
        guarantee=np.array([2.0]),
        priority=lambda u: -u,
        gang_min=np.zeros(1),
    )
    assert whole.tolist() == [1, 1]


def test_one_gpu_to_spare_goes_to_the_tenant_furthest_below_its_guarantee():
    # Tiers a and b, one GPU each, all held whole: nothing for the passes to round. Tenant 0
    # (owed 1, holds 0) and tenant 1 (owed 2, holds 1 on b) both ask for a, where tenant 2
    # (owed nothing) holds the only GPU: tenant 0, further behind, gets it.
    m = market([0, 1, 2, 3], [0, 0, 1, 0], bid_room=[1, 1, 1, 1], tier_room=[1, 1])
    whole = round_whole(
        m,
        x=np.array([0.0, 0.0, 1.0, 1.0]),
        arc_tenant=np.array([0, 1, 1, 2]),
        arc_value=np.ones(4),
        guarantee=np.array([1.0, 2.0, 0.0]),
        priority=lambda u: -u,
        gang_min=np.zeros(4),
    )
    assert whole.tolist() == [1, 0, 1, 0]


def test_a_tenant_gives_as_many_gpus_as_keep_it_at_its_guarantee():
    # One tier of 1,000 GPUs, all held by tenant 0, owed 995; 200 tenants owed one GPU each
    # hold none. Tenant 0 can spare 5: the first five short tenants (all equally far
    # behind: by index) get one each, and tenant 0 ends at its guarantee.
    n = 200
    m = market(np.arange(n + 1), np.zeros(n + 1, dtype=int), bid_room=[1000] + [1] * n,
               tier_room=[1000])  # fmt: skip
    whole = round_whole(
        m,
        x=np.r_[1000.0, np.zeros(n)],
        arc_tenant=np.arange(n + 1),
        arc_value=np.ones(n + 1),
        guarantee=np.r_[995.0, np.ones(n)],
        priority=lambda u: -u,
        gang_min=np.zeros(n + 1),
    )
    assert whole[0] == 995
    assert np.flatnonzero(whole[1:]).tolist() == [0, 1, 2, 3, 4]


@st.composite
def fractional(draw):
    """A random market and a fractional allocation that fits it."""
    T = draw(st.integers(1, 4))
    N = draw(st.integers(1, 8))
    B = draw(st.integers(1, 16))
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
@given(fractional(), st.booleans())
def test_round_whole_matches_the_one_gpu_at_a_time_rule(case, lowest_first):
    m = case.pop("m")
    whole = round_whole(m, **case, lowest_first=lowest_first)
    passes = reference(m, **case, lowest_first=lowest_first)
    mended = {k: v for k, v in case.items() if k != "x"}
    assert whole.tolist() == meet_guarantees(m, passes, **mended).tolist()
    assert (np.bincount(m.arc_tier, weights=whole, minlength=m.tier_room.size) <= m.tier_room).all()
    assert (np.bincount(m.arc_bid, weights=whole, minlength=m.bid_room.size) <= m.bid_room).all()


@settings(max_examples=300, deadline=None)
@given(fractional(), st.booleans())
def test_meeting_guarantees_keeps_every_room_and_every_guarantee_already_met(case, lowest_first):
    m = case.pop("m")
    passes = reference(m, **case, lowest_first=lowest_first)
    rest = {k: v for k, v in case.items() if k != "x"}
    whole = meet_guarantees(m, passes, **rest)
    T, B, G = m.tier_room.size, m.bid_room.size, m.group_room.size
    capped = m.arc_capped >= 0
    assert (whole >= 0).all() and (whole == np.rint(whole)).all()
    assert (np.bincount(m.arc_tier, weights=whole, minlength=T) <= m.tier_room + EPS).all()
    assert (np.bincount(m.arc_bid, weights=whole, minlength=B) <= m.bid_room + EPS).all()
    in_groups = np.bincount(m.arc_capped[capped], weights=whole[capped], minlength=G)
    assert (in_groups <= m.group_room + EPS).all()
    gang = case["gang_min"][m.arc_bid] > 0
    assert whole[gang].tolist() == passes[gang].tolist()
    g, v, owner = case["guarantee"], case["arc_value"], case["arc_tenant"]
    before = np.bincount(owner, weights=v * passes, minlength=g.size)
    after = np.bincount(owner, weights=v * whole, minlength=g.size)
    met = before >= g - 1e-9
    assert (after[met] >= g[met] - 1e-9).all()
    assert (after[~met] >= before[~met]).all()
    # A tenant still short has no GPU it could simply take: no arc of its own, worth
    # something, with room in its bid, its group and its tier.
    tier_left = m.tier_room - np.bincount(m.arc_tier, weights=whole, minlength=T)
    bid_left = m.bid_room - np.bincount(m.arc_bid, weights=whole, minlength=B)
    group_left = np.r_[m.group_room - in_groups, np.inf][np.where(capped, m.arc_capped, G)]
    open_arc = (
        ~gang
        & (v > 0)
        & (tier_left[m.arc_tier] >= 1)
        & (bid_left[m.arc_bid] >= 1)
        & (group_left >= 1)
    )
    short = after < g - 1e-9
    assert not (open_arc & short[owner]).any()


def test_maxmin_rounds_a_tenant_without_a_share_after_every_tenant_with_one():
    # One free GPU. Tenant 0 has no share (maxmin does not count it: e infinite as a
    # denominator), tenant 1 holds 9 of a share worth 10: the GPU is tenant 1's. A share
    # ratio of 0 for tenant 0 put it first.
    m = market([0, 1], [0, 0], bid_room=[1, 10], tier_room=[10])
    held, denom = np.zeros(2), np.array([np.inf, 10.0])
    whole = round_whole(
        m,
        x=np.array([0.5, 9.5]),
        arc_tenant=np.array([0, 1]),
        arc_value=np.ones(2),
        guarantee=np.zeros(2),
        priority=maxmin.share_priority(held, denom),
        gang_min=np.zeros(2),
        lowest_first=True,
    )
    assert whole.tolist() == [0, 10]
