"""In Chromium: one admin's large grant becomes a request, a second admin approves it on the
approvals page, a manager asks for the team's credits, and the auditor reads the queue without
a single button (screenshots 96-; the queue is docs/images/approvals.png)."""

from __future__ import annotations

import shutil

import pytest

from governance.services import change_request
from tenants.ledger import balance_get
from tenants.models import Membership
from tests import factories
from tests.browser.conftest import ROOT, SCREENSHOTS, login, shot
from tests.governance.conftest import auditor_user

pytestmark = pytest.mark.browser

ADMIN_PASSWORD = "pw-admin-123"


def _logout(page) -> None:
    page.click("form.logout button")
    page.wait_for_url("**/login/**")


def test_a_second_admin_approves_on_the_approvals_page(page):
    alice = factories.admin_user(username="alice")
    factories.admin_user(username="bob")
    vision = factories.tenant(name="Vision Lab", credits=1_000_000)
    speech = factories.tenant(name="Speech Lab")
    factories.member(tenant=vision, username="vera", role=Membership.Role.MANAGER)
    auditor = auditor_user("audrey")
    auditor.set_password("pw-audit-123")
    auditor.save()

    # A manager asks for the team's credits.
    login(page, "vera", "pw-member-123")
    page.click("nav >> text=Credit requests")
    page.fill("#id_amount", "1500")
    page.fill("#id_reason", "ablation runs for the camera-ready")
    page.fill("#id_justification", "Reviewers asked for three more ablations.")
    page.click("main button[type=submit]")
    page.wait_for_selector(".messages >> text=A platform admin decides it")
    _logout(page)

    # Alice's large grant is turned into a request on the credits page.
    login(page, "alice", ADMIN_PASSWORD)
    page.goto("/staff/credits/")
    page.select_option("#id_tenant", label="Vision Lab")
    page.fill("#id_amount", "25000")
    page.fill("#id_reason", "deadline top-up")
    page.click("main button[type=submit]")
    page.wait_for_url("**/governance/new/credit_grant/**")
    assert page.input_value("#id_amount") == "25000"
    page.fill("#id_justification", "The NeurIPS deadline moved forward by a week.")
    page.click("main button[type=submit]")
    page.wait_for_selector(".messages >> text=Another administrator must approve it")
    # Her own request has no buttons for her.
    assert "Yours: another administrator decides it." in page.inner_text("#pending-requests")
    change_request(
        kind="tenant_weight",
        actor=alice,
        justification="Two research groups merged into Speech Lab.",
        payload={"tenant": speech.pk, "weight": 2},
    )
    _logout(page)

    login(page, "bob", ADMIN_PASSWORD)
    page.click("nav >> text=Approvals")
    pending = page.locator("#pending-requests tbody tr")
    assert pending.count() == 3
    shot(page, "96-approvals-queue")
    images = ROOT / "docs" / "images"
    images.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(SCREENSHOTS / "96-approvals-queue.png", images / "approvals.png")
    before = balance_get(tenant=vision).available
    row = page.locator("#pending-requests tr", has_text="Grant 25,000.000 credits")
    row.locator("button", has_text="Approve and apply").click()
    page.wait_for_selector(".messages >> text=approved and applied")
    assert balance_get(tenant=vision).available == before + 25_000_000
    row = page.locator("#pending-requests tr", has_text="ablation runs")
    row.locator("input[name=note]").nth(1).fill("Use the spare A100 quota first.")
    row.locator("button", has_text="Reject").click()
    page.wait_for_selector(".messages >> text=rejected")
    decided = page.inner_text("#decided-requests")
    assert "Use the spare A100 quota first." in decided and "bob" in decided
    shot(page, "97-approvals-decided")
    _logout(page)

    # The manager sees the decision; the auditor reads the queue and has no buttons.
    login(page, "vera", "pw-member-123")
    page.click("nav >> text=Credit requests")
    assert "Rejected" in page.inner_text("#team-requests")
    shot(page, "98-team-requests")
    _logout(page)
    login(page, "audrey", "pw-audit-123")
    page.click("nav >> text=Approvals")
    assert page.locator("#pending-requests button").count() == 0
    assert "Two research groups merged" in page.inner_text("#pending-requests")
