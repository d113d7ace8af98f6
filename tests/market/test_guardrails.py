"""Guardrails: a breach after a settlement rolls the policy back to the version active before,
with an audit event and an admin notification, and the next round clears under it.

Rounds are driven through the real services with a fixed clock (tests/market/marketkit.py):
bids placed in the open round, then one tick of the market (which clears, settles, judges the
round against its guardrails and opens the next round).
"""

from __future__ import annotations

from datetime import timedelta
from io import StringIO

import pytest

from audit.models import AuditEvent
from market import tasks
from market.errors import MarketError
from market.models import PolicyVersion, Round
from market.policy.guardrails import Breach, guardrails_check, guardrails_validate
from market.services.bids import bid_place
from market.services.guardrails import policy_rollback
from market.services.policy import policy_activate, policy_version_create
from market.services.rounds import round_open_next
from market.services.tick import rounds_tick
from tenants.ledger import ledger_verify
from tenants.models import Notification
from tests import factories
from tests.market.marketkit import market_make

pytestmark = pytest.mark.django_db

Status = PolicyVersion.Status


class Clock:
    """Plays the market: bids in the open round, then a tick after bidding closes."""

    def __init__(self, market, teams):
        self.market = market
        self.teams = teams
        self.open = market.round

    def bid(self, team: int, quantity: int, limits: dict[str, int]):
        tenant, user = self.teams[team]
        return bid_place(
            user=user,
            tenant=tenant,
            round=self.open,
            quantity=quantity,
            limits=limits,
            now=self.open.opens_at + timedelta(seconds=1),
        )

    def tick(self, *, via_task: bool = False, monkeypatch=None) -> Round:
        """Close, clear and settle the open round; returns it (settled) and opens the next."""
        now = self.open.closes_at + timedelta(seconds=1)
        settled_id = self.open.pk
        if via_task:
            monkeypatch.setattr(tasks, "rounds_tick", lambda: rounds_tick(now=now))
            tasks.rounds_tick_task()
        else:
            rounds_tick(now=now)
        self.open = Round.objects.get(status=Round.Status.OPEN)
        return Round.objects.select_related("policy").get(pk=settled_id)


@pytest.fixture
def teams(db):
    return [
        (t, factories.member(tenant=t))
        for t in (factories.tenant(name=f"Lab {i}", credits=10_000_000) for i in range(2))
    ]


def settled_history(clock: Clock, rounds: int = 3) -> None:
    """Rounds where one tenant takes 2 of 4 a100 GPUs at the reserve (price 1.000)."""
    for _ in range(rounds):
        clock.bid(0, 2, {"a100": 5_000})
        rnd = clock.tick()
        assert rnd.status == Round.Status.SETTLED and rnd.prices["a100"] == 1_000


def candidate(market, **changes) -> PolicyVersion:
    """A new version based on the active one, activated now (applies from the next round)."""
    version = policy_version_create(actor=market.admin, based_on=market.policy, **changes)
    return policy_activate(version=version, actor=market.admin)


def test_price_spike_rolls_back_to_the_previous_version_within_one_settlement(teams, monkeypatch):
    market = market_make()
    clock = Clock(market, teams)
    settled_history(clock)
    # v2 raises the a100 reserve tenfold, with a guardrail of 3 x the trailing median price.
    v2 = candidate(
        market, reserve_prices={"a100": 10_000, "h100": 2_000}, guardrails={"price_max_multiple": 3}
    )
    clock.bid(0, 2, {"a100": 5_000})
    assert clock.tick().policy == market.policy  # opened before v2 was activated
    assert clock.open.policy_id == v2.pk

    clock.bid(0, 2, {"a100": 20_000})
    spiked = clock.tick(via_task=True, monkeypatch=monkeypatch)

    assert spiked.policy_id == v2.pk and spiked.prices["a100"] == 10_000
    restored = PolicyVersion.objects.get(status=Status.ACTIVE)
    assert restored.number == v2.number + 1
    assert restored.parent_id == v2.pk  # history stays linear: v1 -> v2 -> v3
    assert restored.reserve_prices == market.policy.reserve_prices
    assert restored.guardrails == market.policy.guardrails
    assert restored.mechanism == market.policy.mechanism
    assert PolicyVersion.objects.get(pk=v2.pk).status == Status.RETIRED

    event = AuditEvent.objects.get(action="policy.rollback")
    assert event.actor_label == "guardrail"
    assert event.before["active"] == v2.number
    assert event.after["restored_from"] == market.policy.number
    (breach,) = event.after["breaches"]
    assert breach["rule"] == "price_max_multiple" and breach["tier"] == "a100"
    assert breach["observed"] == 10_000 and breach["reference"]["median"] == 1_000
    assert breach["limit"] == 3_000
    notice = Notification.objects.get(tenant=None, kind="policy_guardrail")
    assert notice.level == Notification.Level.CRITICAL
    assert f"v{v2.number} was rolled back" in notice.message and "10000" in notice.message

    # The round opened during the spike's tick now belongs to the restored version...
    assert clock.open.policy_id == restored.pk
    clock.bid(0, 2, {"a100": 20_000})
    after = clock.tick()
    # ...and clears under it: back to the old reserve.
    assert after.policy_id == restored.pk and after.prices["a100"] == 1_000
    assert ledger_verify() == []


def test_utilisation_collapse_rolls_back(teams):
    market = market_make()
    clock = Clock(market, teams)
    # v2 caps every tenant at 25 % of a100: a lone bidder for 4 GPUs gets 1.
    v2 = candidate(market, max_share_pct={"a100": 25}, guardrails={"utilisation_min": 0.5})
    clock.bid(0, 4, {"a100": 5_000})
    clock.tick()  # opened under v1
    clock.bid(0, 4, {"a100": 5_000})
    collapsed = clock.tick()

    assert collapsed.policy_id == v2.pk
    assert sum(a.gpus for a in collapsed.allocations.all()) == 1
    restored = PolicyVersion.objects.get(status=Status.ACTIVE)
    assert restored.max_share_pct == market.policy.max_share_pct
    event = AuditEvent.objects.get(action="policy.rollback")
    (breach,) = event.after["breaches"]
    assert breach["rule"] == "utilisation_min"
    assert breach["observed"] == 0.25 and breach["limit"] == 0.5
    assert breach["reference"] == {"offered": 6, "asked": 4, "allocated": 1, "utilisation": 0.25}
    assert "1 of 4 usable GPUs" in Notification.objects.get(kind="policy_guardrail").message

    clock.bid(0, 4, {"a100": 5_000})
    after = clock.tick()
    assert after.policy_id == restored.pk
    assert sum(a.gpus for a in after.allocations.all()) == 4


def test_no_breach_leaves_the_policy_alone(teams):
    market = market_make(guardrails={"price_max_multiple": 3, "utilisation_min": 0.5})
    clock = Clock(market, teams)
    settled_history(clock, rounds=4)
    assert PolicyVersion.objects.get(status=Status.ACTIVE) == market.policy
    assert not AuditEvent.objects.filter(action__startswith="policy.rollback").exists()


def test_a_price_rule_needs_enough_history(teams):
    market = market_make()
    clock = Clock(market, teams)
    settled_history(clock, rounds=1)
    candidate(market, reserve_prices={"a100": 10_000}, guardrails={"price_max_multiple": 3})
    clock.bid(0, 1, {"a100": 20_000})
    clock.tick()
    clock.bid(0, 1, {"a100": 20_000})
    spiked = clock.tick()
    # Two earlier settled rounds are fewer than the default minimum history of 3.
    assert spiked.prices["a100"] == 10_000
    assert guardrails_check(round=spiked) == []


def test_breach_without_an_earlier_version_alerts_but_cannot_roll_back(teams):
    market = market_make(guardrails={"utilisation_min": 0.9}, max_share_pct={"a100": 25})
    clock = Clock(market, teams)
    clock.bid(0, 4, {"a100": 5_000})
    clock.tick()
    assert PolicyVersion.objects.get(status=Status.ACTIVE) == market.policy
    event = AuditEvent.objects.get(action="policy.guardrail_breach")
    assert event.after["rolled_back"] is False
    assert "no earlier version" in Notification.objects.get(kind="policy_guardrail").message


def test_a_rollback_version_is_not_rolled_back_again(teams):
    market = market_make(guardrails={"utilisation_min": 0.5})
    clock = Clock(market, teams)
    candidate(market, max_share_pct={"a100": 25})
    clock.bid(0, 4, {"a100": 5_000})
    clock.tick()
    clock.bid(0, 4, {"a100": 5_000})
    clock.tick()  # v2 breaches (v2 copied v1's guardrails) -> v3 with v1's content
    v3 = PolicyVersion.objects.get(status=Status.ACTIVE)
    breach = Breach(
        rule="utilisation_min",
        observed=0.1,
        limit=0.5,
        message="made up",
        policy_id=v3.pk,
        round_id=1,
    )
    assert policy_rollback(breaches=[breach]) is None
    assert PolicyVersion.objects.get(status=Status.ACTIVE) == v3
    assert AuditEvent.objects.filter(
        action="policy.guardrail_breach", object_id=str(v3.pk)
    ).exists()


def test_rollback_of_a_version_no_longer_active_is_a_no_op(teams):
    market = market_make()
    v2 = candidate(market, round_minutes=30)
    breach = Breach(
        rule="jain_min",
        observed=0.1,
        limit=0.5,
        message="x",
        policy_id=market.policy.pk,
        round_id=1,
    )
    assert policy_rollback(breaches=[breach]) is None
    assert PolicyVersion.objects.get(status=Status.ACTIVE) == v2
    with pytest.raises(MarketError, match="at least one breach"):
        policy_rollback(breaches=[])


def test_spend_limit_over_the_window(teams):
    # Each round charges 2 GPUs x 1.000 x 1 h = 2.000 credits; v2 allows 5.000 per 24 h of
    # platform revenue, counting every settled round in the window.
    market = market_make()
    clock = Clock(market, teams)
    v2 = candidate(market, guardrails={"spend_max_per_window": 5_000})
    clock.bid(0, 2, {"a100": 5_000})
    clock.tick()  # under v1: 2.000
    clock.bid(0, 2, {"a100": 5_000})
    second = clock.tick()  # under v2: 4.000 in the window
    assert second.policy_id == v2.pk and guardrails_check(round=second) == []
    clock.bid(0, 2, {"a100": 5_000})
    clock.tick()  # 6.000
    event = AuditEvent.objects.get(action="policy.rollback")
    (breach,) = event.after["breaches"]
    assert breach["rule"] == "spend_max_per_window"
    assert (breach["observed"], breach["limit"]) == (6_000, 5_000)
    assert breach["reference"]["window_hours"] == 24


def test_void_on_breach_refunds_the_breaching_round(teams):
    market = market_make()
    clock = Clock(market, teams)
    candidate(
        market,
        max_share_pct={"a100": 25},
        guardrails={"utilisation_min": 0.5, "void_on_breach": True},
    )
    clock.bid(0, 4, {"a100": 5_000})
    clock.tick()
    clock.bid(0, 4, {"a100": 5_000})
    rnd = clock.tick()
    rnd.refresh_from_db()
    assert rnd.status == Round.Status.VOIDED
    assert "guardrail breach" in rnd.failure_reason
    assert ledger_verify() == []


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ({"price_max_multiple": 0.5}, "at least 1.0"),
        ({"utilisation_min": 2}, "at most 1.0"),
        ({"jain_min": "high"}, "must be a number"),
        ({"price_window_rounds": 2.5}, "whole number"),
        ({"void_on_breach": "yes"}, "true or false"),
        ({"price_cap": 3}, "unknown guardrail"),
        ([1], "mapping"),
    ],
)
def test_guardrails_validate_says_what_to_fix(value, message):
    with pytest.raises(MarketError, match=message):
        guardrails_validate(value)


def test_guardrails_validate_cleans():
    assert guardrails_validate(
        {"price_max_multiple": 3, "price_window_rounds": 12.0, "jain_min": None}
    ) == {
        "price_max_multiple": 3.0,
        "price_window_rounds": 12,
    }


def test_clear_round_command_runs_the_guardrails(teams):
    """``gpumarket clear-round`` settles like the tick does, guardrails included: a breaching
    round is rolled back by the command itself, not left for a later task."""
    from django.core.management import call_command
    from django.utils import timezone

    # Every time is hours in the past, so the wall clock the command reads has closed bidding.
    market = market_make(now=timezone.now() - timedelta(hours=3))
    market.round.delete()  # opened under v1; the round below opens under the guarded v2
    v2 = candidate(market, guardrails={"spend_max_per_window": 1})
    clock = Clock(market, teams)
    clock.open = market.round = round_open_next(now=timezone.now() - timedelta(hours=3))
    assert clock.open.policy_id == v2.pk and clock.open.closes_at < timezone.now()
    clock.bid(0, 2, {"a100": 5_000})

    call_command("clear_round", str(clock.open.pk), stdout=StringIO())

    assert Round.objects.get(pk=clock.open.pk).status == Round.Status.SETTLED
    restored = PolicyVersion.objects.get(status=Status.ACTIVE)
    assert restored.parent_id == v2.pk and restored.guardrails == market.policy.guardrails
    (breach,) = AuditEvent.objects.get(action="policy.rollback").after["breaches"]
    assert breach["rule"] == "spend_max_per_window"
