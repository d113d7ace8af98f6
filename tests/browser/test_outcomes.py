"""In Chromium: a lost bid shows why it lost; a capped team's allocation that a hard cap
paused before it ran shows "Paused (cap)" and its charge came back (ledger checked)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from django.utils import timezone

from market.models import Allocation, Tier
from market.services.bids import bid_place
from market.services.policy import policy_activate, policy_version_create
from market.services.rounds import round_open_next
from market.services.tick import round_process
from market.services.tiers import tier_create
from telemetry.services import enforce
from tenants.budgets import budget_set
from tenants.ledger import MILLI, balance_get, credits_charge, credits_hold, ledger_verify
from tenants.models import Transfer
from tests import factories
from tests.browser.conftest import login, shot
from tests.telemetry.market_data import allocation_make

pytestmark = pytest.mark.browser

PASSWORD = "pw-member-123"
T0 = datetime(2030, 1, 7, 9, 10, tzinfo=UTC)


@pytest.fixture
def team(live_server):
    admin = factories.admin_user(username="ops")
    tier_create(actor=admin, slug="a100", name="A100", capacity=4)
    version = policy_version_create(
        actor=admin, mechanism="welfare", round_minutes=60, reserve_prices={"a100": 2000}
    )
    policy_activate(version=version, actor=admin)
    tenant = factories.tenant(name="Vision Lab", credits=100 * MILLI)
    user = factories.member(tenant=tenant, username="ada", password=PASSWORD)
    return tenant, user


def test_a_lost_bid_shows_its_reason(page, team):
    tenant, user = team
    rnd = round_open_next(now=T0)
    bid = bid_place(user=user, tenant=tenant, round=rnd, quantity=1, limits={"a100": 1500}, now=T0)
    round_process(round_id=rnd.pk, now=rnd.closes_at + timedelta(seconds=1))
    login(page, "ada", PASSWORD)
    page.goto(f"/market/bids/{bid.pk}/")
    reason = page.inner_text("[data-testid=bid-reason]")
    assert "Won nothing" in reason and "a100 reserve 2.000 > your 1.500" in reason
    page.goto("/market/bids/")
    assert "below its tier's reserve" in page.inner_text("#bids")
    shot(page, "30-lost-bid-reason")


def test_a_capped_teams_unrun_allocation_shows_paused_and_is_not_charged(page, team):
    tenant, _ = team
    now = timezone.now()
    allocation = allocation_make(
        tenant=tenant,
        tier=Tier.objects.get(slug="a100"),
        starts_at=now - timedelta(minutes=1),
        ends_at=now + timedelta(hours=1),
    )
    Allocation.objects.filter(pk=allocation.pk).update(charge=30 * MILLI)
    credits_hold(tenant=tenant, amount=30 * MILLI, actor=None, reason="won", reference="t")
    credits_charge(tenant=tenant, amount=30 * MILLI, actor=None, reason="won", reference="t")
    charged = balance_get(tenant=tenant).available
    budget_set(tenant=tenant, window="day", mode="hard", cap=20 * MILLI, actor=None)
    enforce(now=now)

    assert balance_get(tenant=tenant).available == charged + 30 * MILLI
    assert Transfer.objects.filter(kind="refund", reference=f"allocation:{allocation.pk}").exists()
    assert ledger_verify() == []
    login(page, "ada", PASSWORD)
    page.goto(f"/fleet/allocations/{allocation.pk}/")
    heading = page.inner_text("h1")
    assert "Paused (cap)" in heading
    assert "refunded 30.000" in page.inner_text("main")
    shot(page, "31-capped-allocation-paused-refunded")
