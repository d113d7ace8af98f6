"""In Chromium: each staff and team form with a number, given 1e30 and then 1e5000 in it, shows
an inline error next to the field and writes nothing (screenshots of each)."""

from __future__ import annotations

import pytest

from audit.models import AuditEvent
from market.models import Bid, PolicyVersion
from market.services.bids import bid_place
from market.services.policy import policy_activate, policy_version_create
from market.services.rounds import round_open_next
from market.services.tiers import tier_create
from tests import factories
from tests.browser.conftest import login, shot

pytestmark = pytest.mark.browser

PASSWORD = "pw-member-123"


@pytest.fixture
def world(live_server):
    from datetime import UTC, datetime

    admin = factories.admin_user(username="ops")
    tier_create(actor=admin, slug="a100", name="A100", capacity=4)
    version = policy_version_create(
        actor=admin, mechanism="welfare", round_minutes=60, reserve_prices={"a100": 1000}
    )
    policy_activate(version=version, actor=admin)
    t0 = datetime(2030, 1, 7, 9, 10, tzinfo=UTC)
    rnd = round_open_next(now=t0)
    tenant = factories.tenant(name="Vision Lab", credits=100_000)
    manager = factories.member(tenant=tenant, username="mira", password=PASSWORD, role="manager")
    bid = bid_place(
        user=manager, tenant=tenant, round=rnd, quantity=1, limits={"a100": 2000}, now=t0
    )
    return {"bid": bid, "tenant": tenant, "policy": PolicyVersion.objects.get()}


def _forms(world):
    """(who, page, field selector, submit selector) for one number field of each form."""
    return [
        ("mira", "/market/bids/new/", "#id_quantity", "#place-bid"),
        ("mira", "/market/bids/new/", "#id_limit_a100", "#place-bid"),
        ("mira", f"/market/bids/{world['bid'].pk}/edit/", "#id_limit_a100",
         "button:text-is('Save changes')"),
        ("mira", "/team/campaigns/", "#budget-form [name=cap]", "#budget-form button"),
        ("ops", "/staff/credits/", "#id_amount", "button:text-is('Grant')"),
        ("ops", "/staff/budgets/", "#id_cap", "button:text-is('Set budget')"),
        ("ops", "/staff/tenants/", "#id_weight", "button:text-is('Create tenant')"),
        ("ops", "/market/admin/tiers/", "#id_new-capacity", "button:text-is('Create tier')"),
        ("ops", f"/market/policy/v{world['policy'].number}/edit/", "#id_reserve_a100",
         "button:has-text('Save as new version')"),
    ]  # fmt: skip


def test_each_form_refuses_1e30_and_1e5000_inline_and_writes_nothing(page, world):
    signed_in = None
    for n, (who, url, field, submit) in enumerate(_forms(world)):
        if who != signed_in:
            page.context.clear_cookies()
            login(page, who, PASSWORD if who == "mira" else "pw-admin-123")
            signed_in = who
        for value in ("1e30", "1e5000"):
            events, bids = AuditEvent.objects.count(), Bid.objects.count()
            page.goto(url)
            page.fill(field, value)
            page.click(submit)
            page.wait_for_selector(".errorlist", timeout=10_000)
            assert (AuditEvent.objects.count(), Bid.objects.count()) == (events, bids), (
                url,
                field,
                value,
            )
        shot(page, f"40-hostile-{n:02d}")
