"""What a round's read takes in: its open bids and their limits on active tiers, nothing of
another round's bids (whose ids may lie among its own), of a cancelled bid, of a retired tier
or of a bid left out, each row where its ids say."""

from __future__ import annotations

from datetime import timedelta

import numpy as np

from market.models import Bid, BidLimit, Round
from market.services.bids import bid_cancel, bid_place
from market.services.round_clearing import round_data
from market.services.tiers import tier_create, tier_update
from tests.market.marketkit import T0


def _other_round_bid(market, team, other: Round, quantity: int) -> Bid:
    """An open bid of another round, written as a row so that its id falls among this
    round's (one round is open at a time, so the services would not interleave them)."""
    tenant, user = team
    bid = Bid.objects.create(
        tenant=tenant, author=user, round=other, quantity=quantity, escrow=7_000
    )
    BidLimit.objects.create(bid=bid, tier=market.a100, price=9_999)
    BidLimit.objects.create(bid=bid, tier=market.h100, price=9_998)
    return bid


def test_a_rounds_read_takes_its_own_open_bids_and_their_limits_on_active_tiers(
    market, team, rival
):
    l4 = tier_create(actor=market.admin, slug="l4", name="L4", capacity=8)
    later = market.round.closes_at + timedelta(hours=6)
    other = Round.objects.create(
        policy=market.policy,
        opens_at=later,
        closes_at=later + timedelta(minutes=50),
        starts_at=later + timedelta(hours=1),
        ends_at=later + timedelta(hours=2),
        status=Round.Status.CLOSED,
    )
    mine, left_out = [], []
    for i in range(9):
        owner = team if i % 2 else rival
        tenant, user = owner
        limits = {"a100": 1_000 + i, "h100": 2_000 + i, "l4": 3_000 + i}
        if i % 3 == 2:
            del limits["h100"]
        bid = bid_place(
            user=user, tenant=tenant, round=market.round, quantity=1 + i, limits=limits, now=T0
        )
        _other_round_bid(market, owner, other, quantity=50 + i)
        if i == 4:
            bid_cancel(user=user, tenant=tenant, bid_id=bid.pk, now=T0)
        elif i == 6:
            left_out.append(bid.pk)
        else:
            mine.append((bid, limits))
    tier_update(tier=l4, actor=market.admin, active=False)

    data = round_data(market.round, left_out=frozenset(left_out))

    assert data.tier_slugs == ["a100", "h100"]
    assert data.bid_ids.tolist() == [bid.pk for bid, _ in mine]
    assert data.tenant_ids.tolist() == [bid.tenant_id for bid, _ in mine]
    assert data.quantity.tolist() == [bid.quantity for bid, _ in mine]
    assert data.escrow.tolist() == [Bid.objects.get(pk=bid.pk).escrow for bid, _ in mine]
    assert data.limits.tolist() == [[limits["a100"], limits.get("h100", 0)] for _, limits in mine]
    assert data.limits.dtype == np.int64
    assert set(data.tenant_weights) == {team[0].pk, rival[0].pk}
