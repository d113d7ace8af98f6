"""Budgets: windows, the admission question, alerts."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from tenants.budgets import (
    budget_alerts_raise,
    budget_check,
    budget_set,
    budget_usage,
    campaign_create,
    tenant_hard_capped,
    window_bounds,
)
from tenants.errors import TenantError
from tenants.ledger import credits_charge, credits_hold, credits_refund
from tenants.models import Budget
from tests import factories

pytestmark = pytest.mark.django_db


def _spend(tenant, amount, campaign=None):
    credits_hold(tenant=tenant, amount=amount, campaign=campaign)
    credits_charge(tenant=tenant, amount=amount, campaign=campaign)


def test_calendar_windows_are_utc_day_week_month():
    at = datetime(2026, 11, 18, 15, 30, tzinfo=UTC)  # a Wednesday
    b = Budget(window="day")
    assert window_bounds(budget=b, at=at) == (
        datetime(2026, 11, 18, tzinfo=UTC),
        datetime(2026, 11, 19, tzinfo=UTC),
    )
    b.window = "week"
    assert window_bounds(budget=b, at=at) == (
        datetime(2026, 11, 16, tzinfo=UTC),
        datetime(2026, 11, 23, tzinfo=UTC),
    )
    b.window = "month"
    assert window_bounds(budget=b, at=datetime(2026, 12, 31, 23, tzinfo=UTC)) == (
        datetime(2026, 12, 1, tzinfo=UTC),
        datetime(2027, 1, 1, tzinfo=UTC),
    )


def test_safe_budget_refuses_a_commitment_that_could_break_the_cap_with_numbers():
    t = factories.tenant(credits=100_000)
    budget_set(tenant=t, window="day", mode="safe", cap=10_000, actor=None)
    _spend(t, 4_000)
    credits_hold(tenant=t, amount=3_000)  # an open bid's escrow counts as committed
    assert budget_check(tenant=t, amount=3_000).allowed
    decision = budget_check(tenant=t, amount=3_001)
    assert not decision.allowed
    assert "cap 10.000" in decision.reason and "committed 7.000" in decision.reason
    assert "at most 3.000 more fits" in decision.reason


def test_refunds_give_spend_back_and_soft_budgets_never_refuse():
    t = factories.tenant(credits=100_000)
    budget_set(tenant=t, window="month", mode="soft", cap=1_000, actor=None)
    _spend(t, 5_000)
    assert budget_check(tenant=t, amount=50_000).allowed
    credits_refund(tenant=t, amount=4_500)
    budget = Budget.objects.get(tenant=t)
    assert budget_usage(budget=budget).spent == 500


def test_hard_cap_refuses_only_once_reached_and_is_reported_for_enforcement():
    t = factories.tenant(credits=100_000)
    budget_set(tenant=t, window="week", mode="hard", cap=5_000, actor=None)
    _spend(t, 4_999)
    assert budget_check(tenant=t, amount=10_000).allowed
    assert tenant_hard_capped(tenant=t) is None
    _spend(t, 1)
    decision = budget_check(tenant=t, amount=1)
    assert not decision.allowed and "hard cap" in decision.reason
    assert tenant_hard_capped(tenant=t) is not None
    budget_set(tenant=t, window="week", mode="hard", cap=6_000, actor=None)  # admin raises it
    assert tenant_hard_capped(tenant=t) is None
    assert Budget.objects.filter(tenant=t, active=True).count() == 1


def test_campaign_budget_counts_only_that_campaigns_spend():
    t = factories.tenant(credits=100_000)
    now = datetime.now(UTC)
    c = campaign_create(
        tenant=t,
        name="deadline",
        starts_at=now - timedelta(days=1),
        ends_at=now + timedelta(days=1),
        actor=None,
    )
    budget_set(tenant=t, window="campaign", mode="safe", cap=2_000, campaign=c, actor=None)
    _spend(t, 50_000)  # outside the campaign
    assert budget_check(tenant=t, amount=2_000, campaign=c).allowed
    _spend(t, 1_500, campaign=c)
    assert not budget_check(tenant=t, amount=501, campaign=c).allowed
    assert budget_check(tenant=t, amount=501).allowed  # tenant-wide: no budget


@pytest.mark.parametrize(
    ("kwargs", "fragment"),
    [
        ({"window": "year", "mode": "safe", "cap": 1}, "window must be one of"),
        ({"window": "day", "mode": "strict", "cap": 1}, "mode must be one of"),
        ({"window": "day", "mode": "safe", "cap": -1}, "cap must be"),
        ({"window": "day", "mode": "safe", "cap": 1.5}, "cap must be"),
        ({"window": "campaign", "mode": "safe", "cap": 1}, "needs a campaign"),
    ],
)
def test_bad_budget_input_is_refused_and_nothing_written(kwargs, fragment):
    t = factories.tenant()
    with pytest.raises(TenantError, match=fragment):
        budget_set(tenant=t, actor=None, **kwargs)
    assert not Budget.objects.filter(tenant=t).exists()


def test_alerts_fire_once_per_threshold_and_window_and_a_jump_is_one_alert():
    t = factories.tenant(credits=100_000)
    budget_set(tenant=t, window="day", mode="soft", cap=10_000, actor=None)
    _spend(t, 8_500)
    messages = [n.message for n in budget_alerts_raise(tenant=t)]
    assert messages == ["Day budget passed 80% (85% now): spent 8.500 of 10.000"]
    assert budget_alerts_raise(tenant=t) == []
    _spend(t, 2_000)
    created = budget_alerts_raise(tenant=t)
    assert len(created) == 1 and created[0].level == "critical"


def test_lowering_a_cap_below_the_spend_is_one_alert_not_three():
    from tenants.models import Notification

    t = factories.tenant(credits=100_000)
    budget_set(tenant=t, window="day", mode="hard", cap=40_000, actor=None)
    _spend(t, 5_000)
    assert budget_alerts_raise(tenant=t) == []
    budget_set(tenant=t, window="day", mode="hard", cap=4_000, actor=None)
    budget_alerts_raise(tenant=t)
    (alert,) = Notification.objects.filter(tenant=t, kind="budget")
    assert alert.message == (
        "Day budget passed 100% (125% now): spent 5.000 of 4.000 (hard cap: work is paused)"
    )


def test_raising_a_hard_cap_clears_the_work_paused_notice_too():
    from tenants.models import Notification

    t = factories.tenant(credits=100_000)
    budget_set(tenant=t, window="day", mode="hard", cap=10_000, actor=None)
    _spend(t, 10_000)
    Notification.objects.create(
        tenant=t, level="warning", kind="work_paused", message="Work paused on allocation(s) #1"
    )
    budget_set(tenant=t, window="day", mode="hard", cap=9_000, actor=None)  # still capped
    assert Notification.objects.filter(kind="work_paused", read_at__isnull=True).exists()
    budget_set(tenant=t, window="day", mode="hard", cap=40_000, actor=None)
    assert not Notification.objects.filter(kind="work_paused", read_at__isnull=True).exists()


def test_raising_a_hard_cap_clears_its_stale_work_is_paused_alert_and_a_new_crossing_alerts_again():
    from tenants.models import Notification

    t = factories.tenant(credits=100_000)
    budget_set(tenant=t, window="day", mode="hard", cap=10_000, actor=None)
    _spend(t, 10_000)
    budget_alerts_raise(tenant=t)
    unread = Notification.objects.filter(tenant=t, kind="budget", read_at__isnull=True)
    assert any("work is paused" in n.message for n in unread)
    # The cap is raised: spent 10 of 40 is 25 %, no alert holds any more, not even before any
    # allocation resumes (there may be none to resume).
    budget_set(tenant=t, window="day", mode="hard", cap=40_000, actor=None)
    assert not Notification.objects.filter(tenant=t, kind="budget", read_at__isnull=True).exists()
    # Crossing the new cap's 50 % is a new alert, not swallowed by the old one's key.
    _spend(t, 11_000)
    created = budget_alerts_raise(tenant=t)
    assert [n.message for n in created] == [
        "Day budget passed 50% (52% now): spent 21.000 of 40.000"
    ]


def test_raising_a_cap_alerts_once_at_the_threshold_that_still_holds():
    from tenants.models import Notification

    t = factories.tenant(credits=100_000)
    budget_set(tenant=t, window="day", mode="soft", cap=10_000, actor=None)
    _spend(t, 10_000)
    budget_alerts_raise(tenant=t)
    budget_set(tenant=t, window="day", mode="soft", cap=12_000, actor=None)  # 83 % now
    budget_alerts_raise(tenant=t)
    unread = Notification.objects.filter(tenant=t, kind="budget", read_at__isnull=True)
    assert [n.message for n in unread] == [
        "Day budget passed 80% (83% now): spent 10.000 of 12.000"
    ]
