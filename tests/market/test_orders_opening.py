"""What a round's opening writes for its standing orders, row by row: the bids and limits,
each hold's transfer, entries and audit event, each bid's event, the balances and the orders'
reasons. Enough orders that every batch goes the bulk way (COPY on PostgreSQL)."""

from __future__ import annotations

from datetime import timedelta

import pytest

from audit.models import AuditEvent
from audit.selectors import chain_verify
from market.models import Bid, BidLimit, Order, Round
from market.services.orders.lifecycle import order_create
from market.services.orders.opening import orders_bid
from tenants.budgets import budget_set, campaign_create
from tenants.ledger import balance_get, ledger_verify
from tenants.models import Entry, Transfer
from tests import factories
from tests.market.marketkit import T0

pytestmark = pytest.mark.django_db

ORDERS = 90  # above the size at which rows go by COPY


@pytest.fixture
def opening(market):
    """Three teams' orders, created with no round open: most bid, one team's budget holds
    some out, one order's deadline has passed, one wants a tier no longer on offer."""
    teams = [factories.tenant(name=f"Team {i}", credits=500_000) for i in range(3)]
    users = [factories.member(tenant=t) for t in teams]
    campaign = campaign_create(
        tenant=teams[1],
        name="push",
        starts_at=T0 - timedelta(days=1),
        ends_at=T0 + timedelta(days=9),
        actor=None,
    )
    budget_set(actor=market.admin, tenant=teams[2], window="day", cap=20_000, mode="safe")
    rnd = market.round
    Round.objects.filter(pk=rnd.pk).update(status="closed")
    orders = []
    for i in range(ORDERS):
        team = i % 3
        orders.append(
            order_create(
                user=users[team],
                tenant=teams[team],
                name=f"job {i}",
                values={"a100": 1000 + 10 * i, "h100": 2500 + i},
                gpus=1 + i % 3,
                min_gpus=1,
                ceiling=10**7,
                campaign=campaign if team == 1 and i % 2 else None,
                deadline=T0 + timedelta(hours=2) if i == 4 else None,
                now=T0,
            )
        )
    Order.objects.filter(pk=orders[4].pk).update(deadline=T0 - timedelta(minutes=1))
    Round.objects.filter(pk=rnd.pk).update(status="open")
    return rnd, teams, orders


def _rows(rnd):
    """Everything the opening wrote, without ids and times: what must not change."""
    bids = {
        b.pk: b
        for b in Bid.objects.filter(round=rnd).select_related("order").prefetch_related("limits")
    }
    transfers = {t.reference: t for t in Transfer.objects.filter(kind="hold")}
    events = {(e.object_type, e.object_id): e for e in AuditEvent.objects.all()}
    placed = []
    for bid in sorted(bids.values(), key=lambda b: b.order_id):
        transfer = transfers[f"bid:{bid.pk}"]
        entries = sorted(Entry.objects.filter(transfer=transfer).values_list("amount", flat=True))
        hold_event = events[("tenants.transfer", str(transfer.pk))]
        bid_event = events[("market.bid", str(bid.pk))]
        after = dict(bid_event.after)
        assert after.pop("order") == bid.order_id
        assert after.pop("round") == rnd.pk
        assert bid.note == f"order {bid.order_id}: {bid.order.name}"
        assert (
            transfer.reason == f"escrow for bid {bid.pk} (order {bid.order_id}) in round {rnd.pk}"
        )
        assert hold_event.after["reason"] == transfer.reason
        assert hold_event.after["reference"] == transfer.reference
        placed.append(
            (
                bid.order.name,
                bid.tenant_id,
                bid.author_id,
                bid.campaign_id,
                bid.quantity,
                bid.min_quantity,
                bid.escrow,
                bid.status,
                sorted(
                    (limit.tier.slug, limit.price, limit.charge_limit) for limit in bid.limits.all()
                ),
                (transfer.tenant_id, transfer.amount, transfer.campaign_id, transfer.actor_id),
                entries,
                (hold_event.action, hold_event.actor_label, hold_event.tenant_id),
                {k: v for k, v in hold_event.after.items() if k not in ("reference", "reason")},
                (bid_event.action, bid_event.actor_label, bid_event.tenant_id),
                after,
            )
        )
    orders = sorted(
        Order.objects.values_list("name", "status", "status_reason", "hold_reason", "spent")
    )
    return placed, orders


def test_an_opening_writes_a_bid_a_hold_and_two_events_for_each_placed_order(opening):
    rnd, teams, orders = opening
    events_before = AuditEvent.objects.count()
    report = orders_bid(round_id=rnd.pk, now=T0)
    placed, order_rows = _rows(rnd)
    # Team 2's budget of 20 credits a day lets its first orders in and holds the rest out.
    held = {oid for oid, why in report.held.items() if "day budget" in why}
    assert held and all(orders[i].pk in held for i in range(2, ORDERS, 3)[3:])
    assert report.ended == {orders[4].pk: Order.Status.EXPIRED}
    assert len(report.bids) == len(placed) == ORDERS - 1 - len(held)
    assert Transfer.objects.filter(kind="hold").count() == len(placed)
    assert AuditEvent.objects.count() - events_before == 2 * len(placed) + 1  # + order.end
    first = placed[0]
    assert first[0] == "job 0"
    assert first[4:8] == (1, 0, 2500, "open")
    assert first[8] == [("a100", 1000, None), ("h100", 2500, None)]
    assert first[9] == (teams[0].pk, 2500, None, None)
    assert first[10] == [-2500, 2500]
    assert first[11] == ("ledger.hold", "system", teams[0].pk)
    assert first[12] == {
        "amount": 2500,
        "from": "team-0:available",
        "to": "team-0:escrow",
        "campaign": None,
    }
    assert first[13] == ("bid.place", "orders", teams[0].pk)
    assert first[14] == {
        "quantity": 1,
        "min_quantity": 0,
        "limits": {"a100": 1000, "h100": 2500},
        "charge_limits": {"a100": 1000, "h100": 2500},
        "escrow": 2500,
        "status": "open",
        "campaign": None,
    }
    with_campaign = [row for row in placed if row[3] is not None]
    assert with_campaign and all(row[9][2] == row[3] for row in with_campaign)
    for team in teams:
        escrow = sum(row[6] for row in placed if row[1] == team.pk)
        assert balance_get(tenant=team).escrow == escrow
        assert balance_get(tenant=team).available == 500_000 - escrow
    assert ("job 4", "expired") == order_rows[[r[0] for r in order_rows].index("job 4")][:2]
    assert ledger_verify() == []
    assert chain_verify().ok


def test_a_second_opening_places_and_holds_nothing_more(opening):
    rnd, teams, _ = opening
    orders_bid(round_id=rnd.pk, now=T0)
    first = _rows(rnd)
    counts = [m.objects.count() for m in (Bid, BidLimit, Transfer, Entry, AuditEvent)]
    balances = [balance_get(tenant=t) for t in teams]
    assert orders_bid(round_id=rnd.pk, now=T0).bids == []
    assert [m.objects.count() for m in (Bid, BidLimit, Transfer, Entry, AuditEvent)] == counts
    assert [balance_get(tenant=t) for t in teams] == balances
    assert _rows(rnd) == first
    assert ledger_verify() == []
