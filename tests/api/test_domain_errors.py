"""Any app's refusal that reaches the API becomes a 409 with its message, never a 500.

A service may pass on a refusal from another app (the planner from the market, the market
from the ledger); the API's exception handler must answer it as the refusal it is, whichever
app raised it.
"""

from __future__ import annotations

import json

import pytest

from market.errors import MarketError
from planning.errors import PlanningError
from telemetry.errors import TelemetryError
from tenants.errors import TenantError
from tests.api.world import TIER

pytestmark = pytest.mark.django_db


@pytest.mark.parametrize("error", [MarketError, TenantError, TelemetryError, PlanningError])
def test_a_refusal_from_any_app_is_a_409_with_its_message(world, monkeypatch, error):
    def refuse(**kwargs):
        raise error("the team's quota for this tier is used up")

    monkeypatch.setattr("market.api.views.bid_place", refuse)
    answer = world.a.client().post(
        "/api/v1/bids",
        data=json.dumps({"round": world.open_round.pk, "quantity": 1, "limits": {TIER: "1.5"}}),
        content_type="application/json",
    )
    assert answer.status_code == 409
    assert answer.json()["error"]["message"] == "the team's quota for this tier is used up"
