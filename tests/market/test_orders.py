"""Standing orders on the database: the round opener bids for them in bulk, settlement keeps
their progress, incumbents keep their GPUs, and every way an order ends says why."""

from __future__ import annotations

import re
from datetime import timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from audit.models import AuditEvent
from market.errors import MarketError
from market.models import Allocation, Bid, BidLimit, Order, Round
from market.services.bids import bid_cancel, bid_place
from market.services.orders.lifecycle import (
    order_cancel,
    order_create,
    order_edit,
    order_pause,
    order_resume,
)
from market.services.orders.opening import orders_bid
from market.services.tick import rounds_tick
from market.services.void import round_void
from tenants.budgets import budget_set
from tenants.ledger import balance_get, ledger_verify
from tenants.models import Notification, Transfer
from tests import factories
from tests.market.marketkit import T0

pytestmark = pytest.mark.django_db

HOUR = 3600


def _order(team, **terms):
    tenant, user = team
    fields = {
        "name": "resnet sweep",
        "values": {"a100": 3000},
        "gpus": 2,
        "ceiling": 100_000,
        "now": T0,
    }
    fields.update(terms)
    return order_create(user=user, tenant=tenant, **fields)


def _next_round(market, now):
    """Close, clear and settle the open round; the next opens and the orders bid in it."""
    report = rounds_tick(now=now)
    market.round = Round.objects.get(pk=report.open_round)
    return report


def _windows(market, count):
    """Run ``count`` rounds from the market's open one; return the tick times."""
    times = []
    for _ in range(count):
        now = market.round.closes_at + timedelta(seconds=1)
        _next_round(market, now)
        times.append(now)
    return times


def test_order_create_bids_in_the_open_round_with_escrow(market, team):
    tenant, _ = team
    order = _order(team)
    bid = Bid.objects.get(order=order)
    assert bid.round_id == market.round.pk
    assert (bid.quantity, bid.min_quantity, bid.escrow) == (2, 2, 6000)
    assert balance_get(tenant=tenant).escrow == 6000
    assert AuditEvent.objects.filter(action="order.create", object_id=str(order.pk)).exists()
    assert AuditEvent.objects.filter(action="bid.place", object_id=str(bid.pk)).exists()
    assert ledger_verify() == []


def test_an_order_wins_rounds_in_a_row_keeps_its_gpus_and_is_never_preempted(market, team):
    order = _order(team, gpu_seconds_wanted=None)
    _windows(market, 3)
    order.refresh_from_db()
    assert (order.rounds_won, order.rounds_lost, order.preemptions) == (3, 0, 0)
    assert order.gpu_seconds == 3 * 2 * HOUR
    allocations = list(Allocation.objects.filter(bid__order=order).order_by("starts_at"))
    assert len(allocations) == 3
    # Each window's allocation starts as the one before ends: the work never stops.
    for before, after in zip(allocations, allocations[1:], strict=False):
        assert after.starts_at == before.ends_at
    # The charges are the order's spend, and its fourth round's bid is open.
    assert order.spent == sum(a.charge for a in allocations)
    assert Bid.objects.filter(order=order, round=market.round, status="open").exists()
    assert ledger_verify() == []


def test_an_incumbent_bids_its_restart_value_on_its_tier_but_pays_at_most_its_value(market, team):
    order = _order(team, restart_seconds=600)  # 10 of 60 minutes lost on a move
    _windows(market, 1)
    bid = Bid.objects.get(order=order, round=market.round)
    limit = BidLimit.objects.get(bid=bid)
    assert limit.price == 3000 + 3000 * 600 // 3600  # 3500: its value plus the restart
    assert limit.charge_limit == 3000
    assert bid.escrow == 6000  # held at what it pays, not what the clearing sees


def test_incumbency_keeps_gpus_against_a_newcomer_bidding_less_than_the_restart(
    market, team, rival
):
    """Four a100 GPUs: the incumbent holds all four; a newcomer offers a little more than
    the incumbent's value but less than its value plus the restart. The incumbent keeps them
    and pays no more than its value."""
    order = _order(team, gpus=4, values={"a100": 3000}, restart_seconds=900)
    _windows(market, 1)
    tenant, user = rival
    bid_place(
        user=user,
        tenant=tenant,
        round=market.round,
        quantity=4,
        min_quantity=4,
        limits={"a100": 3300},
        now=market.round.opens_at,
    )
    _windows(market, 1)
    order.refresh_from_db()
    assert (order.rounds_won, order.preemptions) == (2, 0)
    last = Allocation.objects.filter(bid__order=order).order_by("-starts_at").first()
    assert last.gpus == 4 and last.price <= 3000


def _won_then_outbid(market, team, rival) -> Order:
    """An order wins a window, then a rival bids far more for every GPU and wins the next."""
    order = _order(team, gpus=4, values={"a100": 1500}, restart_seconds=60)
    _windows(market, 1)
    tenant, user = rival
    bid_place(
        user=user,
        tenant=tenant,
        round=market.round,
        quantity=4,
        min_quantity=4,
        limits={"a100": 9000},
        now=market.round.opens_at,
    )
    _windows(market, 1)
    order.refresh_from_db()
    return order


def test_a_lost_round_counts_a_preemption_and_notifies(market, team, rival):
    order = _won_then_outbid(market, team, rival)
    assert (order.rounds_won, order.rounds_lost, order.preemptions) == (1, 1, 1)
    assert order.status == Order.Status.ACTIVE
    assert Notification.objects.filter(kind="order_preempted", tenant=order.tenant).exists()
    settled = Round.objects.filter(status="settled").order_by("-starts_at").first()
    assert settled.diagnostics["preemptions"] == 1


def test_an_order_finishes_and_stops_bidding(market, team):
    order = _order(team, gpus=2, gpu_seconds_wanted=4 * HOUR)
    _windows(market, 3)
    order.refresh_from_db()
    assert order.status == Order.Status.DONE
    assert order.gpu_seconds == 4 * HOUR and order.rounds_won == 2
    assert "4.00 of 4.00 GPU-hours" in order.status_reason
    assert not Bid.objects.filter(order=order, status="open").exists()
    assert Notification.objects.filter(kind="order_finished", tenant=order.tenant).count() == 1


def test_an_elastic_order_asks_only_for_the_work_it_still_wants(market, team):
    order = _order(team, gpus=4, min_gpus=1, gpu_seconds_wanted=5 * HOUR)
    assert Bid.objects.get(order=order).quantity == 4
    _windows(market, 1)
    assert Bid.objects.get(order=order, round=market.round).quantity == 1


def test_an_order_out_of_its_ceiling_stops_with_the_reason(market, team):
    tenant, _ = team
    # 2 GPUs at 3.000 for an hour: 6.000 held, 2.000 charged (the reserve) a window. Near
    # its ceiling it bids what is left (2.000, then 1.000 per GPU-hour), then stops.
    order = _order(team, ceiling=6_000)
    _windows(market, 2)
    last = Bid.objects.get(order=order, round=market.round)
    limit = BidLimit.objects.get(bid=last)
    assert (last.escrow, limit.charge_limit, limit.price) == (2000, 1000, 1000 + 84)
    _windows(market, 2)
    order.refresh_from_db()
    assert order.status == Order.Status.EXHAUSTED
    assert "spend ceiling leaves" in order.status_reason
    assert order.spent <= order.ceiling
    assert Notification.objects.filter(kind="order_budget_exhausted").exists()
    assert balance_get(tenant=tenant).escrow == 0
    assert ledger_verify() == []


def test_a_hard_capped_team_holds_its_orders_with_the_reason_until_the_cap_is_raised(market, team):
    tenant, user = team
    admin = factories.admin_user("capper")
    budget_set(actor=admin, tenant=tenant, window="day", cap=50_000, mode="hard")
    bid_place(
        user=user, tenant=tenant, round=market.round, quantity=4, limits={"a100": 1500}, now=T0
    )
    _windows(market, 1)  # 4 GPUs at the reserve: 4.000 spent
    # The charge happened at the round's (fixed) time, which the budget's day window reads.
    Transfer.objects.update(created_at=market.round.opens_at)
    budget_set(actor=admin, tenant=tenant, window="day", cap=3_000, mode="hard")
    order = _order(team, now=market.round.opens_at)
    order.refresh_from_db()
    assert not Bid.objects.filter(order=order).exists()
    assert "hard cap of 3.000 credits" in order.hold_reason
    assert balance_get(tenant=tenant).escrow == 0
    budget_set(actor=admin, tenant=tenant, window="day", cap=50_000, mode="hard")
    orders_bid(round_id=market.round.pk, now=market.round.opens_at)
    order.refresh_from_db()
    assert order.hold_reason == ""
    assert Bid.objects.get(order=order, round=market.round).status == "open"


def test_pause_withdraws_the_bid_and_resume_bids_again(market, team):
    tenant, user = team
    order = _order(team)
    order_pause(user=user, tenant=tenant, order_id=order.pk, now=T0)
    assert Bid.objects.get(order=order).status == "cancelled"
    assert balance_get(tenant=tenant).escrow == 0
    _windows(market, 1)
    assert not Bid.objects.filter(order=order, round=market.round).exists()
    order_resume(user=user, tenant=tenant, order_id=order.pk, now=market.round.opens_at)
    assert Bid.objects.get(order=order, round=market.round).status == "open"
    actions = set(
        AuditEvent.objects.filter(object_id=str(order.pk)).values_list("action", flat=True)
    )
    assert {"order.create", "order.paused", "order.resumed"} <= actions


def test_edit_replaces_the_open_bid_on_the_new_price(market, team):
    tenant, user = team
    order = _order(team)
    order_edit(user=user, tenant=tenant, order_id=order.pk, values={"a100": 5000}, now=T0)
    bids = Bid.objects.filter(order=order)
    assert sorted(bids.values_list("status", flat=True)) == ["cancelled", "open"]
    assert bids.get(status="open").escrow == 10_000
    assert balance_get(tenant=tenant).escrow == 10_000


def test_cancel_ends_the_order_and_releases_its_escrow(market, team):
    tenant, user = team
    order = _order(team)
    order_cancel(user=user, tenant=tenant, order_id=order.pk, now=T0)
    order.refresh_from_db()
    assert order.status == Order.Status.CANCELLED
    assert balance_get(tenant=tenant).escrow == 0
    with pytest.raises(MarketError, match="cancelled"):
        order_resume(user=user, tenant=tenant, order_id=order.pk, now=T0)


def test_an_orders_bid_cannot_be_changed_as_a_hand_placed_bid(market, team):
    tenant, user = team
    order = _order(team)
    bid = Bid.objects.get(order=order)
    with pytest.raises(MarketError, match="standing order"):
        bid_cancel(user=user, tenant=tenant, bid_id=bid.pk, now=T0)


def test_another_tenants_order_is_a_404(market, team, rival):
    from django.http import Http404

    order = _order(team)
    tenant, user = rival
    with pytest.raises(Http404):
        order_pause(user=user, tenant=tenant, order_id=order.pk, now=T0)


def test_the_deadline_ends_an_order_that_cannot_start_before_it(market, team):
    order = _order(team, deadline=market.round.starts_at + timedelta(minutes=30))
    _windows(market, 1)
    order.refresh_from_db()
    assert order.status == Order.Status.EXPIRED
    assert "deadline" in order.status_reason


@pytest.mark.parametrize(
    ("terms", "field"),
    [
        ({"ceiling": 500}, "ceiling"),  # below one window at the reserve
        ({"ceiling": 5000}, "ceiling"),  # below one window at its value
        ({"gpus": 8, "min_gpus": 8}, "min_gpus"),  # a gang larger than the tier
        ({"deadline": T0 - timedelta(hours=1)}, "deadline"),
        ({"values": {"a100": 10**9 + 1}}, "values"),
        ({"values": {"v100": 3000}}, "values"),
        ({"values": {"a100": 500}}, "values"),  # below the reserve everywhere
        ({"min_gpus": 3}, "min_gpus"),
        ({"name": " "}, "name"),
    ],
)
def test_bad_input_names_the_field_and_writes_nothing(market, team, terms, field):
    with pytest.raises(MarketError, match=rf"^{field}"):
        _order(team, **terms)
    assert not Order.objects.exists()
    assert not Bid.objects.exists()


def test_a_thousand_orders_bid_in_one_opening_in_bulk(market):
    tenants = [factories.tenant(name=f"Team {i}", credits=50_000) for i in range(50)]
    users = [factories.member(tenant=t) for t in tenants]
    orders_of = []
    rnd = market.round
    # Create the orders with no round open, so none bids before the opener.
    Round.objects.filter(pk=rnd.pk).update(status="closed")
    for i in range(1000):
        tenant, user = tenants[i % 50], users[i % 50]
        orders_of.append(
            order_create(
                user=user,
                tenant=tenant,
                name=f"job {i}",
                values={"a100": 1000 + i, "h100": 2500},
                gpus=1,
                ceiling=20_000,
                now=T0,
            )
        )
    Round.objects.filter(pk=rnd.pk).update(status="open")
    with CaptureQueriesContext(connection) as queries:
        report = orders_bid(round_id=rnd.pk, now=T0)
    assert len(report.bids) == 1000
    assert Bid.objects.filter(round=rnd, order__isnull=False).count() == 1000
    # Set-based: the statements do not grow with the orders (a bid each would be thousands).
    assert len(queries) < 60
    assert orders_bid(round_id=rnd.pk, now=T0).bids == []  # a second pass adds nothing
    assert ledger_verify() == []


def test_voiding_a_round_takes_back_what_it_gave_the_order(market, team):
    order = _order(team, gpus=2, gpu_seconds_wanted=2 * HOUR)
    _windows(market, 1)
    order.refresh_from_db()
    assert order.status == Order.Status.DONE
    settled = Round.objects.get(status="settled")
    round_void(round=settled, actor=market.admin, reason="the a100 nodes were down")
    order.refresh_from_db()
    assert (order.gpu_seconds, order.spent, order.rounds_won) == (0, 0, 0)
    assert order.status == Order.Status.ACTIVE
    assert "voided" in order.status_reason
    # It bids again from the next opening.
    orders_bid(round_id=market.round.pk, now=market.round.opens_at)
    assert Bid.objects.filter(order=order, round=market.round, status="open").exists()
    assert ledger_verify() == []


def test_an_order_that_cannot_meet_its_deadline_is_told_so_once(market, team):
    # Ten GPU-hours on two GPUs is five windows; the deadline leaves four.
    order = _order(
        team,
        gpu_seconds_wanted=10 * HOUR,
        deadline=market.round.starts_at + timedelta(hours=3, minutes=30),
    )
    notice = Notification.objects.get(kind="order_deadline_at_risk")
    assert f"Order {order.pk}" in notice.message
    assert "needs 5 more window(s) and only 4 remain" in notice.message
    orders_bid(round_id=market.round.pk, order_ids=[order.pk], now=T0)
    assert Notification.objects.filter(kind="order_deadline_at_risk").count() == 1


def test_an_order_on_course_for_its_deadline_gets_no_warning(market, team):
    _order(team, gpu_seconds_wanted=4 * HOUR, deadline=market.round.starts_at + timedelta(days=2))
    assert not Notification.objects.filter(kind="order_deadline_at_risk").exists()


def test_an_order_whose_campaign_is_over_sits_the_round_out_with_the_reason(market, team):
    from tenants.budgets import campaign_create

    tenant, _ = team
    campaign = campaign_create(
        tenant=tenant,
        name="ICLR push",
        starts_at=T0 - timedelta(days=3),
        ends_at=T0 + timedelta(minutes=5),
        actor=None,
    )
    order = _order(team, campaign=campaign)
    assert Bid.objects.get(order=order).campaign_id == campaign.pk  # it runs now
    _windows(market, 1)  # the next round opens after the campaign's end
    order.refresh_from_db()
    assert not Bid.objects.filter(order=order, round=market.round).exists()
    assert order.hold_reason == "its campaign 'ICLR push' is not running now"


def test_the_staff_rounds_page_shows_each_rounds_preemptions(client, market, team, rival):
    _won_then_outbid(market, team, rival)
    client.force_login(market.admin)
    page = client.get("/market/admin/rounds/").content.decode()
    cells = re.findall(r'<td class="preemptions">([^<]*)</td>', page)
    assert sorted(cells) == ["0", "1", "—"]  # the open round has none yet


def test_an_order_holds_no_escrow_its_teams_hard_cap_would_leave_out(market, team):
    tenant, _ = team
    admin = factories.admin_user("capper")
    budget_set(actor=admin, tenant=tenant, window="day", cap=4_000, mode="hard")
    big = _order(team, name="big", gpus=3, values={"a100": 3000})  # may cost 9.000
    small = _order(team, name="small", gpus=1, values={"a100": 3000})  # may cost 3.000
    big.refresh_from_db()
    assert not Bid.objects.filter(order=big).exists()
    assert big.hold_reason.startswith("the day hard cap of 4.000 credits has 4.000 left")
    assert Bid.objects.get(order=small).escrow == 3000
    assert balance_get(tenant=tenant).escrow == 3000


def test_an_order_made_mid_round_counts_the_rounds_bids_already_under_the_hard_cap(market, team):
    """The clearing admits a team's bids oldest first under its hard cap (hard_cap_admit):
    an order created after the opening must see the room its team's earlier bids in the
    round already take, or it holds escrow for a bid the clearing leaves out."""
    tenant, user = team
    admin = factories.admin_user("capper")
    budget_set(actor=admin, tenant=tenant, window="day", cap=4_000, mode="hard")
    bid_place(user=user, tenant=tenant, round=market.round, quantity=1,
              limits={"a100": 1000}, now=T0)  # fmt: skip  # may cost 1.000
    first = _order(team, name="first", gpus=1, values={"a100": 2500})  # may cost 2.500
    second = _order(team, name="second", gpus=1, values={"a100": 2000})  # 2.000 > 0.500 left
    assert Bid.objects.get(order=first).escrow == 2500
    second.refresh_from_db()
    assert not Bid.objects.filter(order=second).exists()
    assert second.hold_reason.startswith("the day hard cap of 4.000 credits has 0.500 left")
    assert balance_get(tenant=tenant).escrow == 3500
