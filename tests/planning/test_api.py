"""The planning API: members read their team's planned campaigns, managers declare them,
platform admins keep and queue scenarios; the same services as the pages."""

from __future__ import annotations

import json
from datetime import timedelta

import pytest
from rest_framework.test import APIClient

from planning.models import PlannedCampaign, Scenario
from tests.planning.history import history_build
from tests.planning.test_scenarios import DOCUMENT

pytestmark = pytest.mark.django_db


def client_for(user) -> APIClient:
    api = APIClient()
    api.force_authenticate(user)
    return api


def post(api: APIClient, url: str, body):
    return api.post(url, data=json.dumps(body), content_type="application/json")


@pytest.fixture
def history():
    return history_build(rounds=3)


def campaign_body(history, **overrides) -> dict:
    start = history.end + timedelta(hours=2)
    return {
        "name": "ICML",
        "starts_at": start.isoformat(),
        "ends_at": (start + timedelta(days=3)).isoformat(),
        "gpu_hours": 500,
        "tiers": ["a100"],
        "priority": 3,
    } | overrides


def test_managers_declare_members_read_and_other_teams_see_nothing(history):
    url = "/api/v1/planning/campaigns"
    refused = post(client_for(history.researcher), url, campaign_body(history))
    assert refused.status_code == 403
    made = post(client_for(history.manager), url, campaign_body(history))
    assert made.status_code == 201, made.content
    assert made.json()["tiers"] == ["a100"] and made.json()["tenant"] == "vision-lab"
    listed = client_for(history.researcher).get(url).json()
    assert [c["name"] for c in listed["results"]] == ["ICML"]
    other = PlannedCampaign.objects.get().pk
    nlp = history.nlp.memberships.get().user
    assert client_for(nlp).get(f"{url}/{other}").status_code == 404
    assert client_for(nlp).get(url).json()["count"] == 0
    withdrawn = client_for(history.manager).post(f"{url}/{other}/withdraw")
    assert withdrawn.status_code == 200 and withdrawn.json()["withdrawn_at"]


@pytest.mark.parametrize(
    ("override", "status", "text"),
    [
        ({"gpu_hours": "500"}, 400, "whole number"),
        ({"tiers": []}, 400, "tiers"),
        ({"tiers": ["h900"]}, 409, "choose at least one tier"),
        ({"priority": 7}, 400, "priority"),
        ({"name": 5}, 400, "JSON string"),
    ],
)
def test_a_bad_declaration_says_what_to_fix(history, override, status, text):
    answer = post(
        client_for(history.manager),
        "/api/v1/planning/campaigns",
        campaign_body(history, **override),
    )
    assert answer.status_code == status, answer.content
    assert text in answer.content.decode()
    assert not PlannedCampaign.objects.exists()


def test_admins_keep_and_queue_scenarios(history, sent_tasks, django_capture_on_commit_callbacks):
    url = "/api/v1/planning/scenarios"
    assert post(client_for(history.manager), url, DOCUMENT).status_code == 403
    with django_capture_on_commit_callbacks(execute=True):
        made = post(client_for(history.admin), url, DOCUMENT)
    assert made.status_code == 201, made.content
    body = made.json()
    assert body["status"] == "queued" and body["inputs"]["changes"] == DOCUMENT["changes"]
    assert sent_tasks.of("planning.scenario_run") == [[body["id"]]]
    assert client_for(history.admin).get(f"{url}/{body['id']}").json()["name"] == DOCUMENT["name"]
    wrong_kind = DOCUMENT | {"options": [{"tier": "a100", "kind": "purchase", "per_hour": "2"}]}
    conflict = post(client_for(history.admin), url, wrong_kind)
    assert conflict.status_code == 409 and "options[0]" in conflict.json()["error"]["message"]
    typed = post(client_for(history.admin), url, DOCUMENT | {"kwh_price": 0.2})
    assert typed.status_code == 400 and "kwh_price" in typed.json()["error"]["fields"]
    assert Scenario.objects.count() == 1
