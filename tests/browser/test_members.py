"""In Chromium: a manager creates a member's account (a mistyped confirmation creates none),
changes a role after confirming it, and is refused when demoting the team's last manager."""

from __future__ import annotations

import pytest
from django.contrib.auth import get_user_model

from tenants.models import Membership
from tests import factories
from tests.browser.conftest import login, shot

pytestmark = pytest.mark.browser

PASSWORD = "pw-member-123"


@pytest.fixture
def lab(live_server):
    tenant = factories.tenant(name="Vision Lab", credits=100_000)
    manager = factories.member(
        tenant=tenant, username="mira", password=PASSWORD, role=Membership.Role.MANAGER
    )
    factories.member(tenant=tenant, username="ada", password=PASSWORD)
    return tenant, manager


def test_the_last_manager_is_refused_and_a_typo_creates_no_account(page, lab):
    tenant, manager = lab
    login(page, "mira", PASSWORD)
    page.goto("/team/members/")

    # A mistyped confirmation: an inline error, no account.
    page.fill("#id_username", "newbie")
    page.fill("#id_password1", "correct-horse-battery-7")
    page.fill("#id_password2", "correct-horse-battery-8")
    page.click("button:text-is('Create account')")
    page.wait_for_selector("text=The two passwords do not match")
    assert not get_user_model().objects.filter(username="newbie").exists()
    shot(page, "20-members-password-typo")

    # The last manager demoting herself: confirmed, then refused with the reason.
    page.select_option(f"#role-{Membership.objects.get(user=manager).pk}", "researcher")
    page.click(f"form:has(#role-{Membership.objects.get(user=manager).pk}) button")
    page.wait_for_selector("[data-testid=confirm-question]")
    assert "Change mira from manager to researcher?" in page.inner_text(
        "[data-testid=confirm-question]"
    )
    page.click("#confirm")
    page.wait_for_selector(".messages li.error")
    assert "mira is the last manager of Vision Lab" in page.inner_text(".messages")
    assert Membership.objects.get(user=manager).role == "manager"
    assert "last manager" in page.inner_text("#members")
    shot(page, "21-members-last-manager-refused")
