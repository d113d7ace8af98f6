"""Money as a person reads it: credits, not milli-credits; teams by name, not by id."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from market.diagnostics import diagnostics_rows
from market.models import Round
from tests import factories

pytestmark = pytest.mark.django_db


def test_round_diagnostics_show_the_awards_value_in_credits():
    rows = dict(diagnostics_rows({"welfare": 12_345, "rounding_loss": 500}))
    assert rows["Total value of the awards (credits per hour, bids' limits)"] == "12.345"
    assert rows["Value lost rounding to whole GPUs (credits per hour)"] == "0.500"


def test_round_diagnostics_name_their_figures_and_round_the_rest():
    rows = dict(
        diagnostics_rows(
            {"left_out_by_placement": {"7": "no node"}, "preemptions": 0, "arrays_seconds": 2e-4}
        )
    )
    assert rows == {"Bids placement could not fit": "1", "Preemptions": "0"}
    assert dict(diagnostics_rows({"new_figure": 0.123456})) == {"new_figure": "0.123"}


def test_a_rounds_shadow_outcome_reads_in_credits_and_team_names(client):
    from market.services.tiers import tier_create
    from tests.telemetry.market_data import allocation_make

    tier = tier_create(actor=None, slug="a100", name="A100 80GB")
    vision = factories.tenant(name="Vision Lab")
    now = timezone.now()
    allocation = allocation_make(
        tenant=vision, tier=tier, starts_at=now - timedelta(hours=1), ends_at=now
    )
    Round.objects.filter(pk=allocation.round_id).update(
        shadow_result={
            "policy": 1,
            "number": 2,
            "mechanism": "fisher",
            "prices": {"a100": 3_100},
            "allocated": {"a100": 3},
            "gpus_by_tenant": {str(vision.pk): 3},
            "winners": 1,
            "revenue": 9_300,
            "utilisation": {"a100": 0.75},
            "fairness": 1.0,
            "awards": [],
            "diagnostics": {},
        }
    )
    client.force_login(factories.admin_user())
    page = client.get(f"/market/admin/rounds/{allocation.round_id}/").content.decode()
    assert "<dt>Prices (credits per GPU-hour)</dt><dd>a100 3.100</dd>" in page
    assert "<dt>GPUs by team</dt><dd>Vision Lab 3</dd>" in page
    assert "<dt>Revenue (credits)</dt><dd>9.300</dd>" in page
    assert "9300" not in page and "gpus_by_tenant" not in page
