"""Bids: escrow held, edited and released exactly; every refusal writes nothing."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.http import Http404

from audit.models import AuditEvent
from audit.selectors import chain_verify
from market.errors import MarketError
from market.models import Bid, BidLimit
from market.services.bids import bid_cancel, bid_edit, bid_escrow, bid_place, tenant_bids_cancel
from market.services.tiers import tier_update
from tenants.budgets import budget_set
from tenants.ledger import balance_get, ledger_verify
from tenants.models import Entry, Transfer
from tests import factories
from tests.market.marketkit import T0


def _counts() -> tuple[int, int, int, int, int]:
    return (
        Bid.objects.count(),
        BidLimit.objects.count(),
        Transfer.objects.count(),
        Entry.objects.count(),
        AuditEvent.objects.count(),
    )


def test_bid_place_moves_exactly_the_escrow_from_available_to_escrow(market, team):
    tenant, user = team
    bid = bid_place(
        user=user,
        tenant=tenant,
        round=market.round,
        quantity=2,
        min_quantity=1,
        limits={"a100": 3000, "h100": 5000},
        now=T0,
    )
    # 2 GPUs x highest limit 5.000 x 1 hour
    assert bid.escrow == 10_000
    balance = balance_get(tenant=tenant)
    assert (balance.available, balance.escrow) == (90_000, 10_000)
    hold = Transfer.objects.get(kind="hold", reference=f"bid:{bid.pk}")
    assert hold.amount == 10_000
    assert dict(bid.limits.values_list("tier__slug", "price")) == {"a100": 3000, "h100": 5000}
    event = AuditEvent.objects.get(action="bid.place", object_id=str(bid.pk))
    assert event.after["escrow"] == 10_000 and event.tenant_id == tenant.pk
    assert ledger_verify() == []


def test_bid_place_takes_a_pinned_number_of_statements(market, team, django_assert_max_num_queries):
    tenant, user = team
    # As the API authenticates it: the user with its membership and tenant.
    user = type(user).objects.select_related("membership__tenant").get(pk=user.pk)
    # Tiers, the round share-locked, both accounts locked before the budgets are read,
    # budgets, the bid, its limits, both accounts found and locked again by the hold, the
    # transfer, its entries, both balances, then one append to the audit chain (its lock and
    # head in one call, both events); and the test transaction's savepoint pair around it.
    with django_assert_max_num_queries(14):
        bid = bid_place(
            user=user, tenant=tenant, round=market.round, quantity=1, limits={"a100": 2000}, now=T0
        )
    hold = Transfer.objects.get(kind="hold", reference=f"bid:{bid.pk}")
    events = list(AuditEvent.objects.order_by("-seq")[:2])[::-1]
    assert [(e.action, e.object_id) for e in events] == [
        ("ledger.hold", str(hold.pk)),
        ("bid.place", str(bid.pk)),
    ]
    assert events[1].seq == events[0].seq + 1 and events[1].prev_hash == events[0].hash
    assert chain_verify().ok
    assert ledger_verify() == []


def test_bid_edit_that_moves_escrow_appends_its_two_events_at_once(
    market, team, django_assert_max_num_queries
):
    tenant, user = team
    user = type(user).objects.select_related("membership__tenant").get(pk=user.pk)
    bid = bid_place(
        user=user, tenant=tenant, round=market.round, quantity=1, limits={"a100": 2000}, now=T0
    )
    # The bid found, the round share-locked and the bid locked, its limits, tiers, the
    # accounts locked before the budgets are read, budgets, the accounts locked again by the
    # hold, transfer, entries, balances, the bid saved, one append to the chain (its lock
    # and head in one call, both events); and the test transaction's savepoint pair.
    with django_assert_max_num_queries(16):
        bid_edit(user=user, tenant=tenant, bid_id=bid.pk, quantity=2, now=T0)
    events = list(AuditEvent.objects.order_by("-seq")[:2])[::-1]
    assert [e.action for e in events] == ["ledger.hold", "bid.edit"]
    assert balance_get(tenant=tenant).escrow == 4_000
    assert chain_verify().ok
    assert ledger_verify() == []


@pytest.mark.parametrize(
    ("quantity", "price", "seconds", "expected"),
    [(1, 1000, 3600, 1000), (1, 1000, 1200, 334), (3, 7, 600, 4), (2, 1, 1, 1)],
)
def test_escrow_rounds_up_to_a_whole_milli_credit(quantity, price, seconds, expected):
    assert bid_escrow(quantity=quantity, limits={"a100": price}, seconds=seconds) == expected


def test_safe_budget_refuses_with_the_reason_and_writes_nothing(market, team):
    tenant, user = team
    budget_set(tenant=tenant, window="day", mode="safe", cap=5_000, actor=None)
    before = _counts()
    with pytest.raises(MarketError, match="budget would be exceeded: cap 5.000"):
        bid_place(
            user=user, tenant=tenant, round=market.round, quantity=2, limits={"a100": 3000}, now=T0
        )
    assert _counts() == before
    assert balance_get(tenant=tenant).escrow == 0


def test_insufficient_credits_refuses_and_writes_nothing(market, team):
    tenant, user = team
    before = _counts()
    with pytest.raises(MarketError, match="insufficient credits"):
        bid_place(
            user=user,
            tenant=tenant,
            round=market.round,
            quantity=200,
            limits={"a100": 1000},
            now=T0,
        )
    assert _counts() == before


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"limits": {"v100": 1000}}, "unknown tier v100; tiers on offer: a100, h100"),
        ({"limits": {"a100": 0}}, "limit price for a100 .* must be at least 1, got 0"),
        ({"limits": {"a100": -5}}, "must be at least 1, got -5"),
        ({"limits": {"a100": 1.5}}, "must be a whole number, got 1.5"),
        ({"limits": {"a100": "100"}}, "must be a whole number, got '100'"),
        ({"limits": {}}, "needs a limit price for at least one tier"),
        ({"quantity": 0}, r"quantity \(GPUs\) must be at least 1, got 0"),
        ({"quantity": 2, "min_quantity": 3}, "minimum quantity 3 is more than the quantity 2"),
        ({"quantity": True}, "must be a whole number, got True"),
    ],
)
def test_invalid_bids_are_refused_with_a_clear_message_and_nothing_written(
    market, team, kwargs, message
):
    tenant, user = team
    terms = {"quantity": 1, "min_quantity": 0, "limits": {"a100": 1000}} | kwargs
    before = _counts()
    with pytest.raises(MarketError, match=message):
        bid_place(user=user, tenant=tenant, round=market.round, now=T0, **terms)
    assert _counts() == before


def test_a_tier_taken_off_offer_is_refused(market, team):
    tenant, user = team
    tier_update(tier=market.h100, actor=market.admin, active=False)
    with pytest.raises(MarketError, match="tier h100 is not on offer now"):
        bid_place(
            user=user, tenant=tenant, round=market.round, quantity=1, limits={"h100": 3000}, now=T0
        )


def test_bidding_after_the_round_closed_is_refused(market, team):
    tenant, user = team
    before = _counts()
    with pytest.raises(MarketError, match=f"bidding for round {market.round.pk} closed at"):
        bid_place(
            user=user,
            tenant=tenant,
            round=market.round,
            quantity=1,
            limits={"a100": 1000},
            now=market.round.closes_at,
        )
    assert _counts() == before


def test_a_user_cannot_bid_for_a_tenant_it_does_not_belong_to(market, team, rival):
    tenant, _ = team
    _, outsider = rival
    with pytest.raises(MarketError, match="is not a member of vision-lab"):
        bid_place(
            user=outsider,
            tenant=tenant,
            round=market.round,
            quantity=1,
            limits={"a100": 1000},
            now=T0,
        )


def test_another_tenants_bid_is_a_404_for_edit_and_cancel_and_nothing_changes(market, team, rival):
    tenant, user = team
    other, other_user = rival
    bid = bid_place(
        user=user, tenant=tenant, round=market.round, quantity=1, limits={"a100": 2000}, now=T0
    )
    before = _counts()
    with pytest.raises(Http404):
        bid_cancel(user=other_user, tenant=other, bid_id=bid.pk, now=T0)
    with pytest.raises(Http404):
        bid_edit(user=other_user, tenant=other, bid_id=bid.pk, quantity=3, now=T0)
    with pytest.raises(Http404):
        bid_cancel(user=other_user, tenant=other, bid_id="not-a-number", now=T0)
    assert _counts() == before
    bid.refresh_from_db()
    assert (bid.status, bid.quantity, bid.escrow) == ("open", 1, 2000)


def test_edit_holds_the_extra_and_releases_the_difference(market, team):
    tenant, user = team
    bid = bid_place(
        user=user, tenant=tenant, round=market.round, quantity=1, limits={"a100": 2000}, now=T0
    )
    bid = bid_edit(
        user=user,
        tenant=tenant,
        bid_id=bid.pk,
        quantity=3,
        limits={"a100": 2500, "h100": 4000},
        now=T0,
    )
    assert bid.escrow == 12_000
    assert balance_get(tenant=tenant).escrow == 12_000
    assert dict(bid.limits.values_list("tier__slug", "price")) == {"a100": 2500, "h100": 4000}
    bid = bid_edit(user=user, tenant=tenant, bid_id=bid.pk, limits={"a100": 1500}, now=T0)
    assert bid.escrow == 4_500
    balance = balance_get(tenant=tenant)
    assert (balance.available, balance.escrow) == (95_500, 4_500)
    kinds = list(
        Transfer.objects.filter(reference=f"bid:{bid.pk}")
        .order_by("pk")
        .values_list("kind", "amount")
    )
    assert kinds == [("hold", 2000), ("hold", 10_000), ("release", 7_500)]
    assert AuditEvent.objects.filter(action="bid.edit", object_id=str(bid.pk)).count() == 2
    assert ledger_verify() == []


def test_edit_over_budget_is_refused_and_the_bid_stays_as_it_was(market, team):
    tenant, user = team
    budget_set(tenant=tenant, window="week", mode="safe", cap=5_000, actor=None)
    bid = bid_place(
        user=user, tenant=tenant, round=market.round, quantity=2, limits={"a100": 2000}, now=T0
    )
    before = _counts()
    with pytest.raises(MarketError, match="weekly budget would be exceeded"):
        bid_edit(user=user, tenant=tenant, bid_id=bid.pk, quantity=3, now=T0)
    assert _counts() == before
    bid.refresh_from_db()
    assert (bid.quantity, bid.escrow) == (2, 4_000)


def test_cancel_releases_the_whole_escrow_and_cannot_happen_twice(market, team):
    tenant, user = team
    bid = bid_place(
        user=user, tenant=tenant, round=market.round, quantity=2, limits={"a100": 2000}, now=T0
    )
    bid = bid_cancel(user=user, tenant=tenant, bid_id=bid.pk, now=T0)
    assert (bid.status, bid.escrow) == ("cancelled", 0)
    balance = balance_get(tenant=tenant)
    assert (balance.available, balance.escrow) == (100_000, 0)
    with pytest.raises(MarketError, match="is cancelled; only an open bid can be changed"):
        bid_cancel(user=user, tenant=tenant, bid_id=bid.pk, now=T0)
    assert ledger_verify() == []


def test_cancel_after_close_is_refused(market, team):
    tenant, user = team
    bid = bid_place(
        user=user, tenant=tenant, round=market.round, quantity=1, limits={"a100": 2000}, now=T0
    )
    with pytest.raises(MarketError, match="can no longer be changed"):
        bid_cancel(user=user, tenant=tenant, bid_id=bid.pk, now=market.after_close())
    assert balance_get(tenant=tenant).escrow == 2000


def test_an_idempotency_key_makes_a_retry_return_the_first_bid(market, team):
    tenant, user = team
    terms = {"quantity": 2, "limits": {"a100": 2000}, "idempotency_key": "req-1", "now": T0}
    first = bid_place(user=user, tenant=tenant, round=market.round, **terms)
    again = bid_place(user=user, tenant=tenant, round=market.round, **terms)
    assert again.pk == first.pk
    assert balance_get(tenant=tenant).escrow == 4_000
    with pytest.raises(MarketError, match="was already used for bid .* with other terms"):
        bid_place(user=user, tenant=tenant, round=market.round, **(terms | {"quantity": 3}))
    # Keys are per tenant: another tenant may use the same one.
    other = factories.tenant(credits=10_000)
    other_bid = bid_place(
        user=factories.member(tenant=other), tenant=other, round=market.round, **terms
    )
    assert other_bid.pk != first.pk


def test_tenant_bids_cancel_releases_every_open_bid_of_that_tenant_only(market, team, rival):
    tenant, user = team
    other, other_user = rival
    mine = [
        bid_place(
            user=user,
            tenant=tenant,
            round=market.round,
            quantity=1,
            limits={"a100": 1000 + i},
            now=T0,
        )
        for i in range(2)
    ]
    theirs = bid_place(
        user=other_user, tenant=other, round=market.round, quantity=1, limits={"a100": 1000}, now=T0
    )
    cancelled = tenant_bids_cancel(
        tenant=tenant, reason="hard cap reached", now=T0 + timedelta(minutes=1)
    )
    assert sorted(b.pk for b in cancelled) == sorted(b.pk for b in mine)
    assert balance_get(tenant=tenant).escrow == 0
    theirs.refresh_from_db()
    assert theirs.status == "open" and balance_get(tenant=other).escrow == 1000
    assert ledger_verify() == []


@pytest.mark.django_db
def test_an_escrow_beyond_what_the_ledger_moves_is_a_refusal_in_credits_not_a_crash():
    from market.errors import MarketError
    from tests.market.marketkit import market_make

    market = market_make(round_minutes=720)  # 12-hour windows
    team = factories.tenant(credits=1_000)
    user = factories.member(tenant=team)
    with pytest.raises(MarketError, match="larger than the limit of 1,000,000,000,000.000 credits"):
        bid_place(
            user=user,
            tenant=team,
            round=market.round,
            quantity=100_000,
            limits={"a100": 10**9},
            now=T0,
        )
    assert not Bid.objects.filter(tenant=team).exists()
