"""Clearing and settlement on the database: the ledger ends right, exactly once; a solver
error refunds everything; a shadow policy is compared but never touches the ledger."""

from __future__ import annotations

from datetime import timedelta
from io import StringIO

import pytest
from django.conf import settings
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import connection
from django.db.models import Sum
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from audit.models import AuditEvent
from market import clearing
from market.models import Allocation, Bid, Round
from market.services.bids import bid_place, window_seconds
from market.services.policy import policy_shadow_set, policy_version_create
from market.services.round_clearing import round_clear, round_data, tier_price
from market.services.rounds import round_open_next
from market.services.settlement import round_settle
from market.services.tick import round_process, rounds_tick
from market.services.void import round_fail, round_void
from tenants.ledger import balance_get, ledger_verify, platform_account
from tenants.models import Account, Entry, Notification, Transfer
from tests import factories
from tests.market.marketkit import T0, market_make

pytestmark = pytest.mark.django_db


def _bid(team, market, **terms):
    tenant, user = team
    return bid_place(user=user, tenant=tenant, round=market.round, now=T0, **terms)


def _assert_settled_ledger(rnd: Round) -> None:
    """The settlement invariants every settled round must satisfy."""
    bids = Bid.objects.filter(round=rnd).exclude(status="cancelled")
    allocations = Allocation.objects.filter(round=rnd)
    charged = Transfer.objects.filter(kind="charge", reference__in=[f"bid:{b.pk}" for b in bids])
    assert (charged.aggregate(s=Sum("amount"))["s"] or 0) == (
        allocations.aggregate(s=Sum("charge"))["s"] or 0
    )
    assert rnd.revenue == (allocations.aggregate(s=Sum("charge"))["s"] or 0)
    assert not bids.filter(escrow__gt=0).exists()
    seconds = window_seconds(rnd)
    for allocation in allocations.select_related("bid", "tier"):
        limit = allocation.bid.limits.get(tier=allocation.tier).price
        assert allocation.price == min(rnd.prices[allocation.tier.slug], limit) <= limit
        assert allocation.charge == allocation.gpus * allocation.price * seconds // 3600
    for slug, capacity in rnd.capacities.items():
        assert (allocations.filter(tier__slug=slug).aggregate(s=Sum("gpus"))["s"] or 0) <= capacity
    for bid in bids:
        assert bid.status == ("won" if allocations.filter(bid=bid).exists() else "lost")
    assert ledger_verify() == []


def test_a_lone_bid_wins_at_the_reserve_and_the_rest_of_its_escrow_comes_back(market, team):
    tenant, _ = team
    bid = _bid(team, market, quantity=2, limits={"a100": 3000})
    rnd = round_process(round_id=market.round.pk, now=market.after_close())
    assert rnd.status == "settled"
    allocation = Allocation.objects.get(bid=bid)
    assert (allocation.tier.slug, allocation.gpus, allocation.price, allocation.charge) == (
        "a100",
        2,
        1000,
        2000,
    )
    assert (allocation.starts_at, allocation.ends_at, allocation.status) == (
        rnd.starts_at,
        rnd.ends_at,
        "active",
    )
    balance = balance_get(tenant=tenant)
    assert (balance.available, balance.escrow) == (100_000 - 2000, 0)
    assert Account.objects.get(tenant__isnull=True, kind="revenue").balance == 2000
    assert rnd.revenue == 2000 and rnd.capacities == {"a100": 4, "h100": 2}
    event = AuditEvent.objects.get(action="round.settle", object_id=str(rnd.pk))
    assert (event.after["revenue"], event.after["winners"], event.after["allocations"]) == (
        2000,
        1,
        1,
    )
    charge = Transfer.objects.get(kind="charge", reference=f"bid:{bid.pk}")
    assert charge.reason == f"round {rnd.pk}: bid {bid.pk} won 2 GPUs"  # on the Spend page
    _assert_settled_ledger(rnd)


def test_a_contested_round_settles_with_every_ledger_invariant(market, team, rival):
    third = factories.tenant(credits=100_000)
    third_team = (third, factories.member(tenant=third))
    _bid(team, market, quantity=3, limits={"a100": 3000, "h100": 5000})
    _bid(rival, market, quantity=3, limits={"a100": 2500})
    _bid(rival, market, quantity=2, min_quantity=2, limits={"h100": 4000})
    _bid(third_team, market, quantity=4, limits={"a100": 1200})
    _bid(third_team, market, quantity=1, limits={"a100": 500})  # below the reserve: cannot win
    rnd = round_process(round_id=market.round.pk, now=market.after_close())
    assert rnd.status == "settled"
    assert Allocation.objects.filter(round=rnd).aggregate(s=Sum("gpus"))["s"] > 0
    assert Bid.objects.get(round=rnd, limits__price=500).status == "lost"
    for tenant in (team[0], rival[0], third):
        assert balance_get(tenant=tenant).escrow == 0
    _assert_settled_ledger(rnd)


def test_settling_twice_or_clearing_a_settled_round_changes_nothing(market, team):
    _bid(team, market, quantity=2, limits={"a100": 3000})
    round_process(round_id=market.round.pk, now=market.after_close())
    counts = (Allocation.objects.count(), Transfer.objects.count(), AuditEvent.objects.count())
    assert round_process(round_id=market.round.pk, now=market.after_close(5)).status == "settled"
    assert round_settle(round_id=market.round.pk).status == "settled"
    assert round_clear(round_id=market.round.pk, now=market.after_close(9)).status == "settled"
    assert (
        Allocation.objects.count(),
        Transfer.objects.count(),
        AuditEvent.objects.count(),
    ) == counts
    assert AuditEvent.objects.filter(action="round.settle").count() == 1


def test_clearing_and_settling_are_separate_steps_and_resume_from_the_status(market, team):
    _bid(team, market, quantity=1, limits={"h100": 2500})
    entries = Entry.objects.count()
    rnd = round_clear(round_id=market.round.pk, now=market.after_close())
    assert rnd.status == "cleared" and rnd.awards and Entry.objects.count() == entries
    # A crash here leaves a cleared round; the next pass settles it without solving again.
    rnd = round_process(round_id=market.round.pk, now=market.after_close(30))
    assert rnd.status == "settled" and AuditEvent.objects.filter(action="round.clear").count() == 1
    _assert_settled_ledger(rnd)


def test_a_solver_error_fails_the_round_with_its_reason_and_refunds_every_bid(
    market, team, rival, monkeypatch
):
    def broken(*args, **kwargs):
        raise clearing.ClearingError("solver status infeasible")

    monkeypatch.setattr(clearing, "clear_arrays", broken)
    _bid(team, market, quantity=2, limits={"a100": 3000})
    _bid(rival, market, quantity=1, limits={"h100": 2500})
    rnd = round_process(round_id=market.round.pk, now=market.after_close())
    assert rnd.status == "failed"
    assert "solver status infeasible" in rnd.failure_reason
    assert set(Bid.objects.filter(round=rnd).values_list("status", "escrow")) == {("refunded", 0)}
    for tenant, _ in (team, rival):
        assert balance_get(tenant=tenant) == balance_get(tenant=tenant).__class__(
            available=100_000, escrow=0
        )
    assert not Allocation.objects.exists()
    assert Notification.objects.filter(kind="round_failed", tenant__isnull=True).count() == 1
    assert Notification.objects.filter(kind="round_failed", tenant=team[0]).exists()
    assert ledger_verify() == []
    # Failing again is a no-op, and a failed round is never cleared.
    assert round_fail(round=rnd, reason="again").failure_reason == rnd.failure_reason
    assert round_process(round_id=rnd.pk, now=market.after_close(60)).status == "failed"


def test_a_round_with_no_bids_clears_at_the_reserves_and_settles_empty(market):
    rnd = round_process(round_id=market.round.pk, now=market.after_close())
    assert (rnd.status, rnd.revenue, rnd.prices) == ("settled", 0, {"a100": 1000, "h100": 2000})
    assert rnd.diagnostics["status"] == "no bids"


def test_shadow_policy_is_cleared_side_by_side_and_never_touches_the_ledger(market, team, rival):
    shadow = policy_version_create(
        actor=None, based_on=market.policy, reserve_prices={"a100": 5000, "h100": 9000}
    )
    policy_shadow_set(version=shadow, actor=None)
    _bid(team, market, quantity=2, limits={"a100": 3000})
    _bid(rival, market, quantity=1, limits={"h100": 4000})
    entries, transfers = Entry.objects.count(), Transfer.objects.count()
    rnd = round_clear(round_id=market.round.pk, now=market.after_close())
    assert (Entry.objects.count(), Transfer.objects.count()) == (entries, transfers)
    result = rnd.shadow_result
    assert (result["number"], result["mechanism"]) == (shadow.number, "welfare")
    # Under the shadow's reserves no bid is high enough: a different outcome from the active one.
    assert (
        result["allocated"] == {"a100": 0, "h100": 0}
        and result["revenue"] == 0
        and result["winners"] == 0
    )
    assert result["prices"] == {"a100": 5000, "h100": 9000}
    assert rnd.shadow_policy_id == shadow.pk
    rnd = round_settle(round_id=rnd.pk)
    assert rnd.revenue > 0
    # Settlement wrote exactly the active outcome: one charge and one release or none per bid.
    assert Transfer.objects.filter(kind="charge").count() == 2
    assert Transfer.objects.filter(kind="charge").aggregate(s=Sum("amount"))["s"] == rnd.revenue
    _assert_settled_ledger(rnd)


def test_the_tick_opens_clears_settles_and_finishes(market, team, sent_tasks):
    _bid(team, market, quantity=1, limits={"a100": 2000})
    report = rounds_tick(now=market.after_close())
    assert report.processed == {market.round.pk: "settled"} and not report.errors
    # The round's results go out as one alerts digest, asked for once by the tick.
    assert sent_tasks.of("alerts.digest") == [[]]
    nxt = Round.objects.get(pk=report.open_round)
    assert nxt.status == "open" and nxt.starts_at == market.round.ends_at
    # Within the preemption grace the round stays settled: enforcement is still stopping work.
    grace = timedelta(seconds=settings.GPUMARKET_PREEMPT_GRACE_SECONDS)
    report = rounds_tick(now=market.round.ends_at + timedelta(seconds=1))
    assert market.round.pk not in report.finished
    settled_again = "settled" in report.processed.values()  # the next round, when due
    report = rounds_tick(now=market.round.ends_at + grace + timedelta(seconds=1))
    assert market.round.pk in report.finished
    # One digest per tick that settled a round, none for a tick that only finished one.
    settled_again += "settled" in report.processed.values()
    assert sent_tasks.of("alerts.digest") == [[]] * (1 + settled_again)
    assert set(Allocation.objects.filter(round=market.round).values_list("status", flat=True)) == {
        "finished"
    }
    market.round.refresh_from_db()
    assert market.round.status == "finished"


@pytest.mark.parametrize(
    ("raw", "reserve", "expected"),
    [(4999.9999999, 1000, 5000), (2999.7, 1000, 2999), (0.0, 1000, 1000), (1500.0, 0, 1500)],
)
def test_tier_prices_round_down_to_a_whole_milli_credit_and_never_below_the_reserve(
    raw, reserve, expected
):
    assert tier_price(raw, reserve=reserve) == expected


def test_the_solver_instance_is_read_with_a_fixed_number_of_queries(
    market, team, rival, django_assert_num_queries
):
    for i in range(12):
        _bid(
            team if i % 2 else rival,
            market,
            quantity=1 + i % 3,
            limits={"a100": 1500 + i, "h100": 2500 + i},
        )
    with django_assert_num_queries(4):  # tiers, bids, limits, tenant weights
        data = round_data(market.round)
    assert data.limits.shape == (12, 2) and data.tier_slugs == ["a100", "h100"]
    assert data.limits[0].tolist() == [1500, 2500] and data.quantity.tolist()[:3] == [1, 2, 3]


def test_clear_round_command_settles_a_due_round_and_refuses_an_open_one(team):
    # The command runs on the real clock: open the round two hours ago so it is due now.
    market = market_make(now=timezone.now() - timedelta(hours=2))
    tenant, user = team
    bid_place(
        user=user,
        tenant=tenant,
        round=market.round,
        quantity=2,
        limits={"a100": 3000},
        now=market.round.opens_at,
    )
    with pytest.raises(CommandError, match="there is no round 999999"):
        call_command("clear_round", 999999)
    out = StringIO()
    call_command("clear_round", market.round.pk, stdout=out)
    assert f"round {market.round.pk}: settled" in out.getvalue() and "a100: 1000" in out.getvalue()
    assert Allocation.objects.filter(round=market.round).count() == 1
    nxt = round_open_next()
    with pytest.raises(CommandError, match="still open for bids"):
        call_command("clear_round", nxt.pk)


@pytest.mark.parametrize("mechanism", ["welfare", "fisher", "maxmin"])
def test_every_mechanism_settles_with_the_ledger_right_and_shadows_the_others(
    mechanism, team, rival
):
    market = market_make(mechanism=mechanism)
    others = [m for m in ("welfare", "fisher", "maxmin") if m != mechanism]
    policy_shadow_set(
        version=policy_version_create(actor=None, based_on=market.policy, mechanism=others[0]),
        actor=None,
    )
    _bid(team, market, quantity=3, limits={"a100": 3000, "h100": 5000})
    _bid(team, market, quantity=2, min_quantity=2, limits={"h100": 4500})
    _bid(rival, market, quantity=4, limits={"a100": 2500})
    _bid(rival, market, quantity=1, limits={"h100": 2200})
    rnd = round_process(round_id=market.round.pk, now=market.after_close())
    assert rnd.status == "settled", rnd.failure_reason
    assert rnd.diagnostics["mechanism"] == mechanism
    assert Allocation.objects.filter(round=rnd).exists()
    _assert_settled_ledger(rnd)
    shadow = rnd.shadow_result
    assert "error" not in shadow and shadow["mechanism"] == others[0]
    assert all(shadow["allocated"][slug] <= rnd.capacities[slug] for slug in rnd.capacities)


def _statements(call) -> int:
    with CaptureQueriesContext(connection) as captured:
        call()
    return len(captured.captured_queries)


def _rounds_of(market, teams, sizes):
    """One round per size, each with that many one-GPU bids spread over ``teams``, closed and
    cleared in turn (each next round opens as the one before closes): the cleared rounds."""
    rounds, now, rnd = [], T0, market.round
    for n in sizes:
        for i in range(n):
            tenant, user = teams[i % len(teams)]
            bid_place(
                user=user, tenant=tenant, round=rnd, now=now, quantity=1, limits={"a100": 1500 + i}
            )
        now = rnd.closes_at + timedelta(seconds=1)
        rounds.append(round_clear(round_id=rnd.pk, now=now))
        rnd = round_open_next(now=now)
    return rounds


def test_settling_a_round_takes_as_many_statements_for_40_bids_as_for_4(market, team, rival):
    # A settlement wrote one ledger transfer at a time, each with its own savepoint, locks,
    # idempotency record and audit append: a 7,400-bid round took 85 s to settle after its
    # 0.03 s clear (bench/bidstorm.py). The transfers of a round now go in one batch.
    platform_account("revenue")  # the first charge ever would create it, in the first count
    small, large = _rounds_of(market, [team, rival], (4, 40))
    counts = [_statements(lambda r=r: round_settle(round_id=r.pk)) for r in (small, large)]
    assert counts[0] == counts[1]
    for rnd in (small, large):
        rnd.refresh_from_db()
        assert rnd.status == "settled"
        _assert_settled_ledger(rnd)
    assert Transfer.objects.filter(kind="release").count() == 44  # every bid had escrow left


def test_failing_a_round_takes_as_many_statements_for_40_bids_as_for_4(market, team, rival):
    small, large = _rounds_of(market, [team, rival], (4, 40))
    counts = [_statements(lambda r=r: round_fail(round=r, reason="test")) for r in (small, large)]
    assert counts[0] == counts[1]
    assert set(Bid.objects.values_list("status", "escrow")) == {("refunded", 0)}
    for tenant, _ in (team, rival):
        assert balance_get(tenant=tenant).escrow == 0
    assert ledger_verify() == []


def test_voiding_a_round_refunds_every_charge_in_as_many_statements_for_6_winners_as_for_2(
    market, team, rival
):
    small, large = _rounds_of(market, [team, rival], (2, 40))  # 4 + 2 GPUs: 6 winners at most
    for rnd in (small, large):
        round_settle(round_id=rnd.pk)
    winners = [Bid.objects.filter(round=r, status="won").count() for r in (small, large)]
    assert winners == [2, 4]  # one-GPU bids on a100 only (4 GPUs)
    counts = [
        _statements(lambda r=r: round_void(round=r, actor=None, reason="test"))
        for r in (small, large)
    ]
    assert counts[0] == counts[1]
    assert Transfer.objects.filter(kind="refund").count() == 6
    assert ledger_verify() == []
