"""In Chromium: a researcher creates a standing order through the form, finds it on the list
and its page, pauses and resumes it (screenshots 70-; the order page is docs/images/orders.png)."""

from __future__ import annotations

import shutil
from datetime import timedelta

import pytest
from django.utils import timezone

from market.models import Order
from market.services.bids import bid_place
from market.services.policy import policy_activate, policy_version_create
from market.services.rounds import round_open_next
from market.services.tick import round_process
from market.services.tiers import tier_create
from tenants.ledger import MILLI
from tests import factories
from tests.browser.conftest import ROOT, SCREENSHOTS, login, shot

pytestmark = pytest.mark.browser

PASSWORD = "pw-member-123"


def test_a_researcher_creates_pauses_and_resumes_an_order(page, live_server):
    admin = factories.admin_user(username="ops")
    tier_create(actor=admin, slug="a100", name="A100 80GB", capacity=8)
    tier_create(actor=admin, slug="h100", name="H100 NVLink", capacity=4)
    version = policy_version_create(
        actor=admin, round_minutes=60, reserve_prices={"a100": 1000, "h100": 2000}
    )
    policy_activate(version=version, actor=admin)
    # Three past rounds a rival team bid in give the foresight its clearing prices.
    rival = factories.tenant(name="Speech Lab", credits=1_000 * MILLI)
    someone = factories.member(tenant=rival)
    now = timezone.now()
    for hours_ago, limit in ((4, 1500), (3, 3000), (2, 2000)):
        past = round_open_next(now=now - timedelta(hours=hours_ago, minutes=30))
        bid_place(
            user=someone,
            tenant=rival,
            round=past,
            quantity=8,
            limits={"a100": limit},
            now=past.opens_at,
        )
        round_process(round_id=past.pk, now=past.closes_at)
    round_open_next(now=now)
    tenant = factories.tenant(name="Vision Lab", credits=1_000 * MILLI)
    factories.member(tenant=tenant, username="ada", password=PASSWORD)
    deadline = (timezone.now() + timedelta(days=3)).strftime("%Y-%m-%dT%H:%M")

    login(page, "ada", PASSWORD)
    page.click("nav >> text=Orders")
    page.wait_for_url("**/market/orders/")
    assert "No orders yet" in page.inner_text("#orders")
    page.click("#new-order")
    page.fill("#id_name", "resnet sweep")
    page.fill("#id_value_a100", "2.5")
    page.fill("#id_gpus", "2")
    page.fill("#id_gpu_hours", "40")
    page.fill("#id_ceiling", "150")
    page.fill("#id_deadline", deadline)
    page.fill("#id_command", "python train.py")
    shot(page, "70-order-form")
    page.click("#create-order")
    order = Order.objects.get(tenant=tenant)
    page.wait_for_url(f"**/market/orders/{order.pk}/")
    assert "(Active)" in page.inner_text("h1")
    assert page.inner_text("[data-testid=hours]") == "0.00 received of 40.00 wanted"
    assert page.inner_text("[data-testid=spend]") == "0.000 of 150.000 credits"
    assert "of the last 3 rounds" in page.inner_text("#foresight")
    assert f"gpumarket run --order {order.pk} -- python train.py" in page.inner_text("main")
    shot(page, "71-order-detail")
    images = ROOT / "docs" / "images"
    images.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(SCREENSHOTS / "71-order-detail.png", images / "orders.png")

    page.click("#pause-order")
    page.wait_for_selector("#resume-order")
    assert "(Paused)" in page.inner_text("h1")
    assert "paused by ada" in page.inner_text("[data-testid=status-reason]")
    page.click("#resume-order")
    page.wait_for_selector("#pause-order")
    assert "(Active)" in page.inner_text("h1")
    order.refresh_from_db()
    assert order.status == Order.Status.ACTIVE

    page.click("nav >> text=Orders")
    row = page.inner_text(f"#orders tr[data-order='{order.pk}']")
    assert "resnet sweep" in row and "0.00 / 40.00" in row and "0.000 / 150.000" in row
    shot(page, "72-order-list")
