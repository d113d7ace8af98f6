"""The planning pages: who may see and do what; bad input is an error on the page, never a
5xx, and writes nothing."""

from __future__ import annotations

import json

import pytest
from django.urls import reverse

from audit.models import AuditEvent
from market.models import Tier
from planning.models import PlannedCampaign, Scenario
from planning.services.scenarios import scenario_create, scenario_run
from tests.planning.history import history_build
from tests.planning.test_scenarios import DOCUMENT

pytestmark = pytest.mark.django_db


@pytest.fixture
def history():
    return history_build(rounds=2)


def test_members_see_the_declarations_and_only_managers_declare(client, history):
    client.force_login(history.researcher)
    page = client.get(reverse("planned_campaigns"))
    assert page.status_code == 200 and b"Declare a campaign" not in page.content
    assert client.post(reverse("planned_campaigns"), {"name": "x"}).status_code == 403
    assert client.get(reverse("scenarios")).status_code == 403
    client.force_login(history.manager)
    assert b"Declare a campaign" in client.get(reverse("planned_campaigns")).content


def test_a_declaration_ending_before_it_starts_is_an_inline_error(client, history):
    client.force_login(history.manager)
    answer = client.post(
        reverse("planned_campaigns"),
        {"name": "x", "starts_at": "2030-01-02T00:00", "ends_at": "2030-01-01T00:00",
         "gpu_hours": "10", "tiers": [Tier.objects.get().pk], "priority": "2"},
    )  # fmt: skip
    assert answer.status_code == 400 and b"must end after it starts" in answer.content
    assert not PlannedCampaign.objects.exists()


@pytest.mark.parametrize(
    ("path", "value"),
    [
        (("horizon_weeks",), "1e30"),
        (("horizon_weeks",), "1e5000"),
        (("job_gpus",), "9" * 5000),
        (("changes", 0, "add_gpus"), "1e30"),
        (("changes", 0, "reserve"), '"1e30"'),
        (("options", 0, "per_hour"), '"12,5"'),
        (("targets", "max_unmet_pct"), "NaN"),
        (("targets", "max_wait_rounds"), "-1"),
        (("kwh_price",), '"' + "9" * 5000 + '"'),
    ],
)
def test_hostile_numbers_in_a_scenario_are_errors_on_the_page(client, history, path, value):
    document = json.loads(json.dumps(DOCUMENT))
    marker = "__HOSTILE__"
    node = document
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = marker
    text = json.dumps(document).replace(f'"{marker}"', value)
    client.force_login(history.admin)
    events = AuditEvent.objects.count()
    answer = client.post(reverse("scenarios"), {"document": text})
    assert answer.status_code == 400, answer.content[:300]
    assert b'role="alert"' in answer.content or b"errorlist" in answer.content
    assert not Scenario.objects.exists() and AuditEvent.objects.count() == events


def test_a_scenario_page_shows_progress_then_results_and_the_csv(client, history, sent_tasks):
    client.force_login(history.admin)
    made = client.post(reverse("scenarios"), {"document": json.dumps(DOCUMENT)})
    scenario = Scenario.objects.get()
    assert made.status_code == 302 and made["Location"] == reverse(
        "scenario_detail", args=[scenario.pk]
    )
    queued = client.get(made["Location"]).content.decode()
    assert 'http-equiv="refresh"' in queued and "Queued" in queued
    assert client.get(reverse("scenario_csv", args=[scenario.pk])).status_code == 404
    scenario_run(scenario_id=scenario.pk)
    done = client.get(made["Location"]).content.decode()
    assert 'http-equiv="refresh"' not in done and "Backtest error" in done
    scenario.refresh_from_db()
    scenario.results["spend_before"] = {"vision-lab": 1_500}
    scenario.save(update_fields=["results"])
    done = client.get(made["Location"]).content.decode()
    spend = done.split('id="spend"')[1].split("</table>")[0]
    assert "<td>Vision Lab</td>" in spend and "vision-lab" not in spend  # names, not slugs
    csv = client.get(reverse("scenario_csv", args=[scenario.pk]))
    assert csv.status_code == 200 and csv["Content-Type"].startswith("text/csv")
    assert csv.content.decode().splitlines()[0] == "tier,option,gpus,gpu_hours,cost_credits"


def test_the_example_prices_every_tier_and_its_plan_is_found(client, history):
    Tier.objects.create(slug="h100", name="H100", capacity=2)
    from planning.views import example_document

    document = example_document()
    assert {o["tier"] for o in document["options"]} == {"a100", "h100"}
    kept = scenario_create(actor=history.admin, document=document, queue=False)
    scenario = scenario_run(scenario_id=kept.pk)
    assert "error" not in scenario.results["recommendation"]


def test_a_queued_scenario_and_a_short_history_read_plainly(client, history, sent_tasks):
    client.force_login(history.admin)
    made = client.post(reverse("scenarios"), {"document": json.dumps(DOCUMENT)})
    queued = client.get(made["Location"]).content.decode()
    assert "of ? rounds" not in queued and "waiting for a worker to start it" in queued
    scenario = Scenario.objects.get()
    scenario_run(scenario_id=scenario.pk)
    scenario.refresh_from_db()
    # Two settled rounds of history: no backtest can be scored, and the page says so above
    # the plan rather than presenting "buy nothing" as an answer.
    assert scenario.results["history_rounds"] == 2
    page = " ".join(client.get(made["Location"]).content.decode().split())
    warning = page.split('id="plan-warnings"')[1].split("</div>")[0]
    assert "a100: only 0.1 days of history: a weekly pattern needs two weeks" in warning
    backtest = page.split('id="backtest"')[1].split("</table>")[0]
    assert "No backtest: only 0.1 days of history" in backtest


def test_a_teams_spend_forecast_stays_under_its_hard_cap(client, history, sent_tasks):
    from tenants.budgets import budget_set

    budget_set(tenant=history.vision, window="day", mode="hard", cap=400, actor=None)
    client.force_login(history.admin)
    made = client.post(reverse("scenarios"), {"document": json.dumps(DOCUMENT)})
    scenario = Scenario.objects.get()
    scenario_run(scenario_id=scenario.pk)
    scenario.refresh_from_db()
    scenario.results["spend_before"] = {"vision-lab": 3_552_000, "nlp-group": 5_000}
    scenario.results["spend_after"] = {"vision-lab": 3_000_000, "nlp-group": 4_000}
    scenario.save(update_fields=["results"])
    page = client.get(made["Location"]).content.decode()
    spend = " ".join(page.split('id="spend"')[1].split("</table>")[0].split())
    # One week at 0.400 a day is at most 2.800, whatever the replay would have it spend.
    assert "3552.000" not in spend and "3,552" not in spend
    assert (
        '<td>Vision Lab <span class="muted">(held to its daily hard cap of 0.400)</span></td>'
        "<td>2.800</td><td>2.800</td>" in spend
    )
    assert "<td>NLP Group</td><td>5.000</td><td>4.000</td>" in spend
