"""bid_place on PostgreSQL in one call of ``market_bid_place``: the same rows, events, errors
and chain as the reference path (the ORM one, which SQLite and every refusal take)."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from typing import Any

import pytest
from django.db import connection

import market.services.bids as bids
from audit.models import AuditEvent
from audit.selectors import chain_verify
from market.errors import MarketError, RoundMissing
from market.models import Bid, BidLimit
from market.services.bids import bid_place
from market.services.tiers import tier_update
from tenants.budgets import budget_set, campaign_create
from tenants.ledger import balance_get, ledger_verify
from tenants.models import Entry, Transfer
from tests import factories
from tests.market.marketkit import T0


@pytest.fixture(autouse=True)
def _postgresql():
    assert connection.vendor == "postgresql", "market_bid_place is a PostgreSQL function"


@pytest.fixture
def reference(monkeypatch):
    """A context in which bid_place takes the reference path."""

    class Reference:
        def __enter__(self):
            monkeypatch.setattr(bids, "_place_in_one_call", lambda **kwargs: None)

        def __exit__(self, *exc):
            monkeypatch.undo()

    return Reference()


def _teams(n: int = 2):
    teams = []
    for i in range(n):
        tenant = factories.tenant(name=f"Lab {i}", credits=100_000)
        user = factories.member(tenant=tenant)
        # As the API authenticates it: the user with its membership and tenant.
        user = type(user).objects.select_related("membership__tenant").get(pk=user.pk)
        teams.append((user.membership.tenant, user))
    return teams


def _written(bid: Bid) -> dict[str, Any]:
    """Everything a placed bid wrote, with its own ids replaced by names."""
    stored = Bid.objects.get(pk=bid.pk)
    hold = Transfer.objects.get(reference=f"bid:{bid.pk}")
    events = list(AuditEvent.objects.filter(tenant_id=bid.tenant_id).order_by("seq"))[-2:]
    tenant_slug = bid.tenant.slug

    def plain(value: Any) -> Any:
        text = repr(value)
        for old, new in (
            (f"bid {bid.pk} ", "bid B "),
            (f"bid:{bid.pk}", "bid:B"),
            (tenant_slug, "T"),
        ):
            text = text.replace(old, new)
        return text

    balance = balance_get(tenant=bid.tenant)
    return {
        "bid": {
            name: getattr(stored, name)
            for name in (
                "round_id",
                "campaign_id",
                "order_id",
                "backfill_id",
                "quantity",
                "min_quantity",
                "escrow",
                "status",
                "note",
                "outcome",
                "outcome_reason",
                "idempotency_key",
            )
        },
        "returned": (bid.escrow, bid.status, bid.quantity, bid.min_quantity, bid.note),
        "times": abs(stored.updated_at - stored.created_at) < timedelta(seconds=1)
        and abs(stored.created_at - hold.created_at) < timedelta(seconds=1),
        "limits": sorted(
            BidLimit.objects.filter(bid=bid).values_list("tier__slug", "price", "charge_limit")
        ),
        "hold": (
            hold.kind,
            hold.amount,
            hold.campaign_id,
            plain(hold.reason),
            hold.actor_id == bid.author_id,
            hold.source.kind,
            hold.destination.kind,
            hold.tenant_id == bid.tenant_id,
        ),
        "entries": sorted(
            Entry.objects.filter(transfer=hold).values_list("account__kind", "amount")
        ),
        "balance": (balance.available, balance.escrow),
        "events": [
            (
                e.action,
                e.object_type,
                e.object_id == str(hold.pk if i == 0 else bid.pk),
                e.actor_id == bid.author_id,
                e.actor_label == bid.author.get_username(),
                plain(e.before),
                plain(e.after),
            )
            for i, e in enumerate(events)
        ],
    }


CASES = [
    {"quantity": 1, "limits": {"a100": 2000}},
    {"quantity": 3, "min_quantity": 2, "limits": {"a100": 2500, "h100": 4001}, "note": "x" * 250},
    {"quantity": 2, "limits": {"h100": 1234}, "idempotency_key": "  retry-1 "},
]


@pytest.mark.parametrize("terms", CASES)
def test_one_call_writes_what_the_reference_path_writes(market, reference, terms):
    (tenant_a, user_a), (tenant_b, user_b) = _teams()
    with reference:
        slow = bid_place(user=user_a, tenant=tenant_a, round=market.round.pk, now=T0, **terms)
    fast = bid_place(user=user_b, tenant=tenant_b, round=market.round.pk, now=T0, **terms)
    assert _written(fast) == _written(slow)
    assert chain_verify().ok
    assert ledger_verify() == []


def test_one_call_with_a_running_campaign_writes_what_the_reference_path_writes(market, reference):
    (tenant_a, user_a), (tenant_b, user_b) = _teams()
    placed = []
    for tenant, user, slow in ((tenant_a, user_a, True), (tenant_b, user_b, False)):
        campaign = campaign_create(
            tenant=tenant, name="Paper", starts_at=T0 - timedelta(days=1),
            ends_at=T0 + timedelta(days=1), actor=None,
        )  # fmt: skip
        budget_set(tenant=tenant, window="day", mode="safe", cap=50_000, actor=None)
        kwargs = {"quantity": 2, "limits": {"a100": 3000}, "campaign": campaign}
        if slow:
            with reference:
                placed.append(
                    bid_place(user=user, tenant=tenant, round=market.round, now=T0, **kwargs)
                )
        else:
            placed.append(bid_place(user=user, tenant=tenant, round=market.round, now=T0, **kwargs))
    slow_written, fast_written = (_written(bid) for bid in placed)
    assert slow_written["bid"].pop("campaign_id") != fast_written["bid"].pop("campaign_id")
    slow_hold, fast_hold = list(slow_written.pop("hold")), list(fast_written.pop("hold"))
    assert slow_hold[2] == placed[0].campaign_id and fast_hold[2] == placed[1].campaign_id
    assert slow_hold[:2] + slow_hold[3:] == fast_hold[:2] + fast_hold[3:]
    named = [
        [
            e[6].replace(f"'campaign': {bid.campaign_id}", "'campaign': C")
            for e in written.pop("events")
        ]
        for bid, written in zip(placed, (slow_written, fast_written), strict=True)
    ]
    assert named[0] == named[1] and "'campaign': C" in named[0][0]
    assert slow_written == fast_written
    assert ledger_verify() == []


def test_one_call_takes_four_statements_and_a_budget_three_more(market, django_assert_num_queries):
    ((tenant, user),) = _teams(1)
    # The test's savepoint, market_bid_place, the two events' INSERT, the savepoint's release.
    with django_assert_num_queries(4):
        bid_place(user=user, tenant=tenant, round=market.round.pk, quantity=1,
                  limits={"a100": 2000}, now=T0)  # fmt: skip
    budget_set(tenant=tenant, window="day", mode="safe", cap=50_000, actor=None)
    # The call stops at the budgets; budget_check reads them (2) and it is called again.
    with django_assert_num_queries(7):
        bid_place(user=user, tenant=tenant, round=market.round.pk, quantity=1,
                  limits={"a100": 2000}, now=T0)  # fmt: skip
    assert chain_verify().ok
    assert ledger_verify() == []


def _counts() -> tuple[int, ...]:
    return (
        Bid.objects.count(),
        BidLimit.objects.count(),
        Transfer.objects.count(),
        Entry.objects.count(),
        AuditEvent.objects.count(),
    )


REFUSALS = [
    ("closed", {"quantity": 1, "limits": {"a100": 2000}}),
    ("missing round", {"quantity": 1, "limits": {"a100": 2000}}),
    ("unknown tier", {"quantity": 1, "limits": {"v100": 2000, "a100": 0}}),
    ("inactive tier", {"quantity": 1, "limits": {"h100": 2000}}),
    ("price", {"quantity": 1, "limits": {"a100": 0}}),
    ("float price", {"quantity": 1, "limits": {"a100": 2.5}}),
    ("quantity", {"quantity": 0, "limits": {"a100": 2000}}),
    ("minimum", {"quantity": 1, "min_quantity": 2, "limits": {"a100": 2000}}),
    ("no limits", {"quantity": 1, "limits": {}}),
    ("credits", {"quantity": 4, "limits": {"a100": 30_000}}),
    ("budget", {"quantity": 2, "limits": {"a100": 3000}}),
    ("long key", {"quantity": 1, "limits": {"a100": 2000}, "idempotency_key": "k" * 81}),
]


@pytest.mark.parametrize(("case", "terms"), REFUSALS, ids=[c for c, _ in REFUSALS])
def test_a_refusal_says_what_the_reference_path_says_and_writes_nothing(
    market, reference, case, terms
):
    ((tenant, user),) = _teams(1)
    round_id, now = market.round.pk, T0
    if case == "closed":
        now = market.after_close()
    if case == "missing round":
        round_id = 999_999
    if case == "inactive tier":
        tier_update(tier=market.h100, active=False, actor=None)
    if case == "budget":
        budget_set(tenant=tenant, window="day", mode="safe", cap=5_000, actor=None)
    before = _counts()
    messages = []
    for slow in (True, False):
        with pytest.raises((MarketError, RoundMissing)) as refused:
            if slow:
                with reference:
                    bid_place(user=user, tenant=tenant, round=round_id, now=now, **terms)
            else:
                bid_place(user=user, tenant=tenant, round=round_id, now=now, **terms)
        messages.append((type(refused.value), str(refused.value)))
    assert messages[0] == messages[1]
    assert _counts() == before
    assert balance_get(tenant=tenant).escrow == 0


def test_a_replayed_key_returns_the_first_bid_and_other_terms_are_refused(market):
    ((tenant, user),) = _teams(1)
    first = bid_place(user=user, tenant=tenant, round=market.round.pk, quantity=1,
                      limits={"a100": 2000}, idempotency_key="k1", now=T0)  # fmt: skip
    before = _counts()
    again = bid_place(user=user, tenant=tenant, round=market.round.pk, quantity=1,
                      limits={"a100": 2000}, idempotency_key="k1", now=T0)  # fmt: skip
    assert again.pk == first.pk and _counts() == before
    with pytest.raises(MarketError, match="already used for bid .* with other terms"):
        bid_place(user=user, tenant=tenant, round=market.round.pk, quantity=2,
                  limits={"a100": 2000}, idempotency_key="k1", now=T0)  # fmt: skip
    assert _counts() == before
    assert balance_get(tenant=tenant).escrow == 2000


def test_a_campaign_of_another_team_is_refused_as_the_reference_path_refuses(market, reference):
    (tenant, user), (other, _user) = _teams()
    campaign = campaign_create(
        tenant=other, name="Theirs", starts_at=T0 - timedelta(days=1),
        ends_at=T0 + timedelta(days=1), actor=None,
    )  # fmt: skip
    messages = []
    for slow in (True, False):
        with pytest.raises(MarketError) as refused:
            kwargs = {"quantity": 1, "limits": {"a100": 2000}, "campaign": campaign}
            if slow:
                with reference:
                    bid_place(user=user, tenant=tenant, round=market.round, now=T0, **kwargs)
            else:
                bid_place(user=user, tenant=tenant, round=market.round, now=T0, **kwargs)
        messages.append(str(refused.value))
    assert messages[0] == messages[1] and "does not belong to" in messages[0]


@pytest.mark.django_db(transaction=True)
def test_two_requests_with_one_key_at_once_place_one_bid(market, monkeypatch):
    # The first stops at its budget check, its accounts locked; the second waits on them,
    # then finds the key the first committed and answers with the first's bid.
    ((tenant, user),) = _teams(1)
    budget_set(tenant=tenant, window="day", mode="soft", cap=10**9, actor=None)
    inside, release = threading.Event(), threading.Event()
    check = bids.budget_check
    calls = []

    def paused_check(**kwargs):
        calls.append(1)
        if len(calls) == 1:
            inside.set()
            release.wait(timeout=30)
        return check(**kwargs)

    monkeypatch.setattr(bids, "budget_check", paused_check)

    def place():
        try:
            return bid_place(user=user, tenant=tenant, round=market.round.pk, quantity=1,
                             limits={"a100": 2000}, idempotency_key="once", now=T0)  # fmt: skip
        finally:
            connection.close()

    with ThreadPoolExecutor(2) as pool:
        first = pool.submit(place)
        assert inside.wait(timeout=30)
        second = pool.submit(place)
        with pytest.raises(TimeoutError):
            second.result(timeout=1)  # waiting on the accounts the first holds
        release.set()
        bids_placed = {first.result(timeout=30).pk, second.result(timeout=30).pk}
    assert len(bids_placed) == 1
    assert Bid.objects.filter(tenant=tenant).count() == 1
    assert Transfer.objects.filter(tenant=tenant, kind="hold").count() == 1
    assert balance_get(tenant=tenant).escrow == 2000
    assert ledger_verify() == [] and chain_verify().ok
