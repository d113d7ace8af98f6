"""In Chromium: a researcher's allocation page names the GPUs placed for it and the command
that starts work on them; the fleet page shows each GPU's NVLink domain and the room left for
gangs (screenshots 60-, 61-)."""

from __future__ import annotations

import pytest

from tenants.ledger import MILLI
from tests import factories
from tests.browser.conftest import login, shot
from tests.telemetry.market_data import fleet_node, settled_gang

pytestmark = pytest.mark.browser

PASSWORD = "pw-member-123"


def test_the_allocation_names_its_gpus_and_the_fleet_its_room_for_gangs(page, live_server):
    from market.services.tiers import tier_create

    tier = tier_create(actor=None, slug="h100", name="H100 NVLink", capacity=0)
    for name in ("n1", "n2"):
        fleet_node(name=name, tier=tier)
    tenant = factories.tenant(name="Vision Lab", credits=1_000 * MILLI)
    user = factories.member(tenant=tenant, username="ada", password=PASSWORD)
    allocation = settled_gang(tier=tier, tenant=tenant, user=user, gpus=2)
    (node,) = {g["node"] for g in allocation.placement}
    indices = sorted(g["index"] for g in allocation.placement)

    login(page, "ada", PASSWORD)
    page.goto(f"/fleet/allocations/{allocation.pk}/")
    assert page.inner_text("#placement") == f"{node} GPUs {indices[0]}, {indices[1]}"
    assert page.inner_text(".ready-command") == (
        f"gpumarket run --allocation {allocation.pk} --node {node} -- python train.py"
    )
    shot(page, "60-allocation-placement")
    page.click("form.logout button")

    factories.admin_user(username="ops")
    login(page, "ops", "pw-admin-123")
    page.goto("/fleet/")
    rows = page.locator("#fragmentation tbody tr").all_inner_texts()
    # Eight GPUs, a pair placed inside one NVLink domain: six free, a whole node of four
    # still free, and at most two in one domain.
    assert [r.split("\t") for r in rows] == [["h100", "8", "6", "4", "2"]]
    assert "nvl2" in page.inner_text("#gpus")
    shot(page, "61-fleet-room-for-gangs")
