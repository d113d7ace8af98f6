"""Standing orders under concurrency, on real connections: edits racing the round opener and
the round's close never leave two bids for an order, never hold escrow no bid accounts for,
and never take a team past its balance."""

from __future__ import annotations

import threading

import pytest
from django.db import connection
from django.db.models import Sum

from market.errors import MarketError
from market.models import Bid, Order
from market.services.bids import bid_place
from market.services.orders.lifecycle import order_create, order_edit
from market.services.orders.opening import orders_bid
from market.services.rounds import round_close
from tenants.ledger import balance_get, ledger_verify
from tests import factories
from tests.market.marketkit import T0

pytestmark = pytest.mark.django_db(transaction=True)


def _threads(works) -> list[BaseException]:
    failures: list[BaseException] = []
    start = threading.Barrier(len(works))

    def run(work) -> None:
        try:
            start.wait(timeout=30)
            work()
        except MarketError:
            pass  # a refusal (the round closed, credits short) is an answer, not a failure
        except BaseException as exc:  # reported by the test
            failures.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=run, args=(work,)) for work in works]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    return failures


def _held_equals_open_bids(tenant) -> None:
    open_escrow = Bid.objects.filter(tenant=tenant, status="open").aggregate(s=Sum("escrow"))["s"]
    assert balance_get(tenant=tenant).escrow == (open_escrow or 0)


def test_edits_racing_the_opener_and_a_hand_bid_never_overdraw_the_team(market):
    # 12 credits: an order at 9.000/GPU-h holds 9.000 and a hand bid 4.000; both cannot fit.
    tenant = factories.tenant(name="Vision", credits=12_000)
    user = factories.member(tenant=tenant)
    order = order_create(
        user=user,
        tenant=tenant,
        name="run",
        values={"a100": 3000},
        gpus=1,
        ceiling=50_000,
        now=T0,
    )

    def edit(value):
        return lambda: order_edit(
            user=user, tenant=tenant, order_id=order.pk, values={"a100": value}, now=T0
        )

    def hand_bid():
        bid_place(
            user=user, tenant=tenant, round=market.round, quantity=1, limits={"a100": 4000}, now=T0
        )

    works = [edit(v) for v in (9000, 5000, 7000, 9000, 6000)]
    works += [lambda: orders_bid(round_id=market.round.pk, now=T0)] * 3 + [hand_bid]
    assert _threads(works) == []
    assert Bid.objects.filter(order=order, round=market.round, status="open").count() <= 1
    balance = balance_get(tenant=tenant)
    assert balance.available >= 0 and balance.available + balance.escrow == 12_000
    _held_equals_open_bids(tenant)
    order.refresh_from_db()
    open_bid = Bid.objects.filter(order=order, status="open").first()
    assert open_bid is not None or "available balance" in order.hold_reason
    assert ledger_verify() == []


def test_an_edit_racing_the_close_leaves_the_order_bid_or_not_never_half(market):
    tenant = factories.tenant(name="Vision", credits=100_000)
    user = factories.member(tenant=tenant)
    orders = [
        order_create(
            user=user,
            tenant=tenant,
            name=f"run {i}",
            values={"a100": 3000},
            gpus=1,
            ceiling=50_000,
            now=T0,
        )
        for i in range(4)
    ]
    after = market.after_close()
    works = [
        (
            lambda o=o: order_edit(
                user=user, tenant=tenant, order_id=o.pk, values={"a100": 4000}, now=T0
            )
        )
        for o in orders
    ] + [lambda: round_close(round_id=market.round.pk, now=after)]
    assert _threads(works) == []
    market.round.refresh_from_db()
    assert market.round.status == "closed"
    for order in orders:
        bids = Bid.objects.filter(order=order, round=market.round)
        # Edited before the close (an open bid at 4.000) or refused after it (the bid of 3.000
        # placed at creation stays): one open bid either way.
        assert bids.filter(status="open").count() == 1
        assert Order.objects.get(pk=order.pk).status == "active"
    _held_equals_open_bids(tenant)
    assert ledger_verify() == []
