"""In Chromium: a manager declares a planned campaign, an admin runs a scenario, and the page
shows the forecast error, price and wait per week, and the recommendation with its chart."""

from __future__ import annotations

import json
from datetime import timedelta

import pytest

from planning.models import PlannedCampaign, Scenario
from planning.services.scenarios import scenario_run
from tests.browser.conftest import login, shot
from tests.planning.history import PASSWORD, history_build

pytestmark = pytest.mark.browser

LOCAL = "%Y-%m-%dT%H:%M"


def test_manager_declares_a_campaign_and_an_admin_plans_for_it(page, sent_tasks):
    history = history_build(rounds=8)
    # The broker and a real worker are tested in tests/planning/test_worker.py; here the run
    # the page queues is recorded (sent_tasks), then run in this process as the worker would.

    login(page, "vmanager", PASSWORD)
    page.goto("/planning/campaigns/")
    start = history.end + timedelta(hours=1)
    page.fill("#id_name", "CVPR push")
    page.fill("#id_starts_at", start.strftime(LOCAL))
    page.fill("#id_ends_at", (start + timedelta(days=7)).strftime(LOCAL))
    page.fill("#id_gpu_hours", "1344")  # 8 GPUs for the week: the tier's capacity
    page.check("input[name=tiers]")
    page.select_option("#id_priority", "3")
    page.click("#planned-campaign-form button[type=submit]")
    page.wait_for_url("**/planning/campaigns/")
    assert "CVPR push" in page.inner_text("#planned-campaigns")
    campaign = PlannedCampaign.objects.get()
    assert (campaign.tenant, campaign.gpu_hours, campaign.priority) == (history.vision, 1344, 3)
    shot(page, "50-planned-campaign")
    page.click("form.logout button")

    login(page, "ops", "pw-admin-123")
    page.goto("/planning/scenarios/")
    document = json.loads(page.input_value("#id_document"))
    assert document["changes"] == [{"tier": "a100", "add_gpus": 8}]  # the example, prefilled
    document["horizon_weeks"] = 1
    page.fill("#id_document", json.dumps(document))
    page.click("#scenario-form button[type=submit]")
    page.wait_for_selector("#scenario-status")
    assert "Queued" in page.inner_text("#scenario-status")
    scenario = Scenario.objects.get()
    assert sent_tasks.of("planning.scenario_run") == [[scenario.pk]]

    # The queued page refreshes itself every 3 s; leave it, so that a refresh firing while
    # the run below takes longer cannot abort the next navigation.
    page.goto("about:blank")
    scenario_run(scenario_id=scenario.pk)
    page.goto(f"/planning/scenarios/{scenario.pk}/")
    assert "Done" in page.inner_text("#scenario-status")
    assert "a100" in page.inner_text("#backtest")
    # Eight hours of history: the page warns before anything else that it cannot be checked.
    assert "a weekly pattern needs two weeks" in page.inner_text("#plan-warnings")
    page.wait_for_selector("#forecast-chart .main-svg")
    weeks = page.inner_text("#weeks-a100")
    assert "Price now" in weeks and "Wait with" in weeks
    page.wait_for_selector("#price-wait-chart .main-svg")
    # The cost curve is drawn when it has a cost on it; otherwise a sentence says why.
    page.wait_for_selector("#tradeoff-chart .main-svg, #tradeoff-none")
    results = Scenario.objects.get().results
    if "error" in results["recommendation"]:
        assert results["recommendation"]["error"] in page.inner_text("#recommendation-error")
    else:
        total = page.inner_text("#recommendation-total")
        assert (
            total
            == f"{results['recommendation']['cost'] // 1000:,}.{results['recommendation']['cost'] % 1000:03d}"
        )
        with page.expect_download() as download:
            page.click("#plan-csv")
        assert download.value.suggested_filename == f"scenario-{scenario.pk}-plan.csv"
    shot(page, "51-capacity-scenario")
