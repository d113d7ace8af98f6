"""End to end in Chromium: bidding, clearing, inline errors, the admin's policy change and
audit export, and tenant isolation. State is set up through the services, as in production."""

from __future__ import annotations

import csv
import io
from datetime import UTC, datetime, timedelta

import pytest

from audit.models import AuditEvent
from market.models import Allocation, Bid, PolicyVersion
from market.services.bids import bid_place
from market.services.policy import policy_activate, policy_version_create
from market.services.rounds import round_open_next
from market.services.tick import round_process
from market.services.tiers import tier_create
from tenants.ledger import balance_get
from tests import factories
from tests.browser.conftest import login, shot

pytestmark = pytest.mark.browser

PASSWORD = "pw-member-123"
# Rounds far in the future, so bidding stays open whatever the wall clock says.
T0 = datetime(2030, 1, 7, 9, 10, tzinfo=UTC)


@pytest.fixture
def market(live_server):
    admin = factories.admin_user(username="ops-admin")
    tier_create(actor=admin, slug="a100", name="A100", capacity=4)
    tier_create(actor=admin, slug="h100", name="H100", capacity=2)
    version = policy_version_create(
        actor=admin,
        mechanism="welfare",
        round_minutes=60,
        reserve_prices={"a100": 1000, "h100": 2000},
    )
    policy_activate(version=version, actor=admin)
    rnd = round_open_next(now=T0)
    vision = factories.tenant(name="Vision Lab", credits=100_000)
    researcher = factories.member(tenant=vision, username="ada", password=PASSWORD)
    return {"admin": admin, "round": rnd, "tenant": vision, "researcher": researcher}


def _plot_traces(page, selector: str = ".js-plotly-plot") -> int:
    page.wait_for_selector(selector)
    return page.evaluate(f"document.querySelector('{selector}').data.length")


def test_researcher_bids_sees_escrow_then_allocation_price_and_chart(page, market):
    login(page, "ada", PASSWORD)
    shot(page, "01-dashboard-researcher")
    page.click("nav a:text-is('Market')")
    page.wait_for_selector("#tiers")
    shot(page, "02-market-open-round")

    page.goto("/market/bids/new/")
    page.fill("#id_limit_a100", "3")
    page.fill("#id_quantity", "2")
    # htmx posts the form to the preview as it changes: 2 GPUs x 3 credits x 1 h.
    page.wait_for_selector("[data-testid=escrow-preview]:has-text('6.000')")
    shot(page, "03-bid-form-preview")
    page.click("#place-bid")
    page.wait_for_selector("[data-testid=bid-escrow]")
    assert page.inner_text("[data-testid=bid-escrow]") == "6.000"
    bid = Bid.objects.get(tenant=market["tenant"])
    page.goto("/")
    assert page.inner_text("[data-testid=escrow]") == "6.000"
    assert page.inner_text("[data-testid=available]") == "94.000"

    rnd = market["round"]
    round_process(round_id=rnd.pk, now=rnd.closes_at + timedelta(seconds=1))
    allocation = Allocation.objects.get(bid=bid)

    page.goto(f"/market/bids/{bid.pk}/")
    price = page.inner_text("[data-testid=allocation-price]")
    assert price == f"{allocation.price // 1000:,}.{allocation.price % 1000:03d}"
    assert f"{allocation.gpus} × a100" in page.inner_text("[data-testid=allocation]")
    shot(page, "04-bid-outcome")

    page.goto("/market/")
    assert _plot_traces(page, "#price-history") > 0
    assert _plot_traces(page, "#supply-demand-0") > 0
    shot(page, "05-market-charts")

    page.goto("/market/spend/")
    assert _plot_traces(page, "#spend-chart") > 0
    shot(page, "06-spend")


def test_invalid_bid_shows_inline_error_and_changes_nothing(page, market):
    tenant = market["tenant"]
    before = balance_get(tenant=tenant)
    login(page, "ada", PASSWORD)
    page.goto("/market/bids/new/")
    page.fill("#id_limit_a100", "12.3456")
    page.fill("#id_quantity", "2")
    page.click("#place-bid")
    error = page.locator("#id_limit_a100_error, .errorlist").first
    assert "at most three decimals" in error.inner_text()
    assert page.get_attribute("#id_limit_a100", "aria-invalid") == "true"

    # A refusal from the service (more than the tenant holds) comes back inline too.
    page.fill("#id_limit_a100", "100000")
    page.click("#place-bid")
    assert "insufficient credits" in page.inner_text("#form-errors")
    shot(page, "07-bid-inline-error")
    assert Bid.objects.filter(tenant=tenant).count() == 0
    assert balance_get(tenant=tenant) == before
    page.goto("/")
    assert page.inner_text("[data-testid=available]") == "100.000"


def test_admin_edits_reserve_price_audited_and_csv_exported(page, market, tmp_path):
    active = PolicyVersion.objects.get(status=PolicyVersion.Status.ACTIVE)
    login(page, "ops-admin", "pw-admin-123")
    shot(page, "08-admin-overview")
    page.click("text=Market policy")
    page.wait_for_url("**/market/policy/")
    page.goto(f"/market/policy/v{active.number}/edit/")
    page.fill("#id_reserve_a100", "2.5")  # credits per GPU-hour
    page.click("button:has-text('Save as new version')")
    page.wait_for_url("**/market/policy/v*/")
    new = PolicyVersion.objects.order_by("-number").first()
    assert new.number == active.number + 1
    assert new.reserve_prices["a100"] == 2500
    event = AuditEvent.objects.get(action="policy.version_create", object_id=str(new.pk))

    page.goto("/audit/")
    page.fill("#id_action", "policy.version_create")
    page.click("button:has-text('Apply filter')")
    rows = page.locator("#audit-events tbody tr")
    assert (
        rows.count() == AuditEvent.objects.filter(action__icontains="policy.version_create").count()
    )
    assert str(event.seq) in page.inner_text("#audit-events")
    page.click("#verify-chain")
    assert "audit chain intact" in page.inner_text(".messages")
    shot(page, "09-audit-review")

    with page.expect_download() as download_info:
        page.click("#csv-export")
    path = tmp_path / "audit.csv"
    download_info.value.save_as(path)
    rows = list(csv.DictReader(io.StringIO(path.read_text())))
    assert {r["action"] for r in rows} == {"policy.version_create"}
    assert str(event.seq) in {r["seq"] for r in rows}
    assert '"a100": "2.500"' in next(r["after"] for r in rows if r["seq"] == str(event.seq))

    for url, name in (
        ("/market/admin/tiers/", "10-admin-tiers"),
        ("/market/admin/rounds/", "11-admin-rounds"),
        ("/fleet/", "12-fleet"),
        ("/staff/credits/", "13-credits"),
    ):
        response = page.goto(url)
        assert response.status == 200
        shot(page, name)


def test_second_tenant_gets_404_and_sees_nothing(page, market):
    bid = bid_place(
        user=market["researcher"],
        tenant=market["tenant"],
        round=market["round"],
        quantity=1,
        limits={"a100": 2000},
    )
    rival = factories.tenant(name="Speech Lab", credits=50_000)
    factories.member(tenant=rival, username="grace", password=PASSWORD)
    login(page, "grace", PASSWORD)
    for url in (f"/market/bids/{bid.pk}/", f"/market/bids/{bid.pk}/edit/"):
        response = page.goto(url)
        assert response.status == 404
    for url in ("/market/bids/", "/", "/fleet/allocations/", "/market/spend/"):
        page.goto(url)
        body = page.content()
        assert f"/market/bids/{bid.pk}/" not in body
        assert "Vision Lab" not in body
    page.goto("/market/bids/")
    assert "No bids yet." in page.inner_text("#bids")
    shot(page, "14-rival-bids-empty")
    # The team pages are for managers; staff pages for admins.
    assert page.goto("/team/members/").status == 403
    assert page.goto("/audit/").status == 403
