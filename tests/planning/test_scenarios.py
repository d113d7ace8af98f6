"""Scenario runs on the database: history and declared campaigns in, results kept, audited."""

from __future__ import annotations

import copy
import json
import re
from datetime import UTC, datetime, timedelta

import pytest

from audit.models import AuditEvent
from planning.errors import PlanningError
from planning.models import PlannedCampaign, Scenario
from planning.services.campaigns import planned_campaign_declare, planned_campaign_withdraw
from planning.services.scenarios import scenario_create, scenario_run
from tenants.models import Tenant
from tests.planning.history import history_build

pytestmark = pytest.mark.django_db

DOCUMENT = {
    "name": "8 more a100",
    "horizon_weeks": 1,
    "changes": [{"tier": "a100", "add_gpus": 8}],
    "job_gpus": 2,
    "targets": {"max_unmet_pct": 0, "max_wait_rounds": 0},
    "kwh_price": "0.2",
    "options": [
        {"tier": "a100", "kind": "reserved", "per_hour": "2", "term_months": 12},
        {"tier": "a100", "kind": "on_demand", "per_hour": "4"},
    ],
}


@pytest.fixture
def history():
    return history_build(rounds=8)


def run(document: dict, actor) -> Scenario:
    kept = scenario_create(actor=actor, document=document, queue=False)
    return scenario_run(scenario_id=kept.pk)


def test_a_scenario_that_adds_capacity_lowers_price_and_unmet_demand(history):
    # 11 GPUs wanted an hour on 8: 3 short. With 8 more nothing is short.
    done = run(DOCUMENT, history.admin)
    assert done.status == Scenario.Status.DONE, done.error
    tier = done.results["tiers"]["a100"]
    assert (tier["capacity_before"], tier["capacity_after"]) == (8, 16)
    for before, after in zip(tier["weeks_before"], tier["weeks_after"], strict=True):
        assert after["price"] <= before["price"]
        assert after["unmet_gpu_hours"] <= before["unmet_gpu_hours"]
    assert tier["weeks_before"][0]["unmet_gpu_hours"] > 0
    assert tier["weeks_after"][0]["unmet_gpu_hours"] == 0
    assert done.results["history_rounds"] == 8
    assert set(done.results["spend_after"]) == {"vision-lab", "nlp-group"}
    # Capacity meets demand: nothing to buy.
    assert done.results["recommendation"]["cost"] == 0
    assert AuditEvent.objects.filter(
        action="planning.scenario_run", object_id=str(done.pk)
    ).exists()


def test_a_declared_campaign_raises_demand_and_the_plan_buys_for_it(history):
    start = history.end + timedelta(hours=1)
    planned_campaign_declare(
        tenant=history.vision, actor=history.manager, name="CVPR push", starts_at=start,
        ends_at=start + timedelta(days=7), gpu_hours=7 * 24 * 8, tiers=["a100"],
        priority=PlannedCampaign.Priority.HIGH, now=history.end,
    )  # fmt: skip
    unchanged = copy.deepcopy(DOCUMENT) | {"changes": []}
    done = run(unchanged, history.admin)
    assert done.status == Scenario.Status.DONE, done.error
    assert [c["name"] for c in done.results["campaigns"]] == ["CVPR push"]
    week = done.results["tiers"]["a100"]["weeks_after"][0]
    # History plus 8 GPUs for the week (the most the tier's 8 GPUs can declare).
    assert week["demand_gpu_hours"] > 9 * 24 * 7 * 0.9
    plan = done.results["recommendation"]
    assert plan["cost"] > 0
    # The 3 GPUs the history keeps short recur after the week: reserved (2/h for every
    # hour of its 12 months beats 4/h on demand). The campaign does not recur: reserving
    # for it would commit 12 months to serve one week, so it is rented on demand.
    lines = {line["kind"]: line for line in plan["lines"]}
    assert set(lines) == {"reserved", "on_demand"}
    assert lines["reserved"]["gpus"] == 3
    assert lines["reserved"]["commitment"] == 3 * 2_000 * 12 * 730
    assert lines["on_demand"]["gpus"] == 8
    assert plan["tiers"][0]["unmet_pct"] == pytest.approx(0, abs=1e-6)
    assert plan["csv"].startswith("tier,option,gpus,gpu_hours,cost_credits")


def test_the_backtest_is_shown_for_every_tier_and_short_history_warns(history):
    done = run(DOCUMENT, history.admin)
    backtest = done.results["backtest"]["a100"]
    # Eight hourly rounds: too short to score at a day, so no horizon is claimed.
    assert backtest["history"] == 8 and backtest["beside_baseline"] == []
    assert "only 0.3 days of history" in backtest["warning"]
    assert any("a100: only 0.3 days" in w for w in done.results["warnings"])
    forecast = done.results["forecast"]["a100"]
    assert len(forecast["p50"]) == 168
    assert all(lo <= mid <= hi for lo, mid, hi in
               zip(forecast["p10"], forecast["p50"], forecast["p90"], strict=True))  # fmt: skip


def test_an_empty_history_warns_instead_of_saying_buy_nothing():
    empty = history_build(rounds=0)
    done = run(DOCUMENT, empty.admin)
    assert done.status == Scenario.Status.DONE, done.error
    assert done.results["history_rounds"] == 0
    assert "not evidence that nothing needs buying" in done.results["warnings"][0]


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"horizon_weeks": 0}, "horizon_weeks: a whole number from 1"),
        ({"changes": [{"tier": "h900", "add_gpus": 1}]}, "unknown tier h900"),
        ({"changes": [{"new_tier": "a100", "gpus": 1}]}, "already exists"),
        ({"options": [{"tier": "a100", "kind": "lease"}]}, "options[0].kind"),
        ({"kwh_price": 0.2}, "kwh_price: write credits as a string"),
        ({"targets": {"max_unmet_pct": 500}}, "targets.max_unmet_pct"),
        ({"colour": "red"}, "unknown field(s) colour"),
    ],
)
def test_a_bad_scenario_is_refused_with_the_field_to_fix_and_nothing_kept(history, change, message):
    with pytest.raises(PlanningError, match=re.escape(message)):
        scenario_create(actor=history.admin, document=DOCUMENT | change, queue=False)
    assert not Scenario.objects.exists()


def test_a_run_happens_once(history):
    kept = scenario_create(actor=history.admin, document=DOCUMENT, queue=False)
    first = scenario_run(scenario_id=kept.pk)
    second = scenario_run(scenario_id=kept.pk)
    assert first.finished_at == second.finished_at
    assert AuditEvent.objects.filter(action="planning.scenario_run").count() == 1


def test_planned_campaigns_are_validated_audited_and_withdrawn(history):
    start = history.end + timedelta(days=1)
    with pytest.raises(PlanningError, match="choose at least one tier"):
        planned_campaign_declare(
            tenant=history.vision, actor=history.manager, name="x", starts_at=start,
            ends_at=start + timedelta(days=1), gpu_hours=10, tiers=["h900"], now=history.end,
        )  # fmt: skip
    with pytest.raises(PlanningError, match="already ended"):
        planned_campaign_declare(
            tenant=history.vision, actor=history.manager, name="x",
            starts_at=history.end - timedelta(days=3), ends_at=history.end - timedelta(days=1),
            gpu_hours=10, tiers=["a100"], now=history.end,
        )  # fmt: skip
    campaign = planned_campaign_declare(
        tenant=history.vision, actor=history.manager, name="ICML", starts_at=start,
        ends_at=start + timedelta(days=2), gpu_hours=100, tiers=["a100"], now=history.end,
    )  # fmt: skip
    with pytest.raises(PlanningError, match="no planned campaign"):
        planned_campaign_withdraw(tenant=history.nlp, actor=None, campaign_id=campaign.pk)
    planned_campaign_withdraw(tenant=history.vision, actor=history.manager, campaign_id=campaign.pk)
    actions = list(
        AuditEvent.objects.filter(object_id=str(campaign.pk), action__startswith="planning.")
        .order_by("seq")
        .values_list("action", flat=True)
    )
    assert actions == ["planning.campaign_declare", "planning.campaign_withdraw"]


def test_the_plan_command_runs_a_scenario_from_a_file_and_prints_its_results(history, tmp_path):
    from io import StringIO

    from django.core.management import call_command
    from django.core.management.base import CommandError

    path = tmp_path / "scenario.json"
    path.write_text(json.dumps(DOCUMENT))
    out = StringIO()
    call_command("plan", str(path), stdout=out)
    printed = json.loads(out.getvalue())
    kept = Scenario.objects.get(pk=printed["scenario"])
    assert printed["status"] == kept.status == Scenario.Status.DONE
    assert kept.created_by is None
    event = AuditEvent.objects.get(action="planning.scenario_create", object_id=str(kept.pk))
    assert event.actor_label == "cli"
    assert printed["results"]["tiers"]["a100"]["capacity_after"] == 8 + 8  # the history has 8

    path.write_text(json.dumps({**DOCUMENT, "horizon_weeks": 0}))
    with pytest.raises(CommandError, match="horizon_weeks"):
        call_command("plan", str(path), stdout=StringIO())


def _declare(history, **overrides):
    start = history.end + timedelta(days=1)
    terms = dict(
        tenant=history.vision, actor=history.manager, name="bounds", starts_at=start,
        ends_at=start + timedelta(days=2), gpu_hours=100, tiers=["a100"], now=history.end,
    )  # fmt: skip
    return planned_campaign_declare(**terms | overrides)


@pytest.mark.parametrize(
    ("starts_at", "ends_at", "words"),
    [
        (datetime(1, 1, 1, tzinfo=UTC), datetime(9999, 12, 31, tzinfo=UTC), "planning horizon"),
        (datetime(1, 1, 1, tzinfo=UTC), None, "planning horizon"),
        (None, datetime(9999, 12, 31, tzinfo=UTC), "planning horizon"),
    ],
)
def test_a_campaign_outside_the_planning_horizon_is_refused(history, starts_at, ends_at, words):
    start = starts_at or history.end + timedelta(days=1)
    end = ends_at or history.end + timedelta(days=3)
    with pytest.raises(PlanningError, match=words):
        _declare(history, starts_at=start, ends_at=end)
    assert not PlannedCampaign.objects.exists()


def test_a_campaign_faster_than_its_tiers_capacity_is_refused(history):
    start = history.end + timedelta(days=1)
    with pytest.raises(PlanningError, match="capacity"):
        _declare(history, starts_at=start, ends_at=start + timedelta(microseconds=1),
                 gpu_hours=10_000_000)  # fmt: skip
    with pytest.raises(PlanningError, match="capacity"):
        _declare(history, ends_at=start + timedelta(hours=10), gpu_hours=81)  # 8.1 GPUs on 8
    assert not PlannedCampaign.objects.exists()
    assert _declare(history, ends_at=start + timedelta(hours=10), gpu_hours=80).gpu_hours == 80


@pytest.mark.parametrize("quotas", ["by_weight", {"vision-lab": {"a100": 4}}])
def test_a_scenario_runs_under_a_policy_with_reserved_quotas(history, quotas):
    from market.selectors import policy_active_get
    from market.services.policy import policy_activate, policy_version_create

    version = policy_version_create(
        actor=history.admin, based_on=policy_active_get(), params={"reserved_quotas": quotas}
    )
    policy_activate(version=version, actor=history.admin)
    done = run(DOCUMENT, history.admin)
    assert done.status == Scenario.Status.DONE, done.error
    assert done.results["tiers"]["a100"]["weeks_after"][0]["unmet_gpu_hours"] == 0


def test_retiring_more_gpus_than_a_tier_has_is_refused_with_the_field_named(history):
    retire = DOCUMENT | {"changes": [{"tier": "a100", "add_gpus": -1000}]}
    with pytest.raises(PlanningError, match=re.escape("changes[0].add_gpus")) as caught:
        scenario_create(actor=history.admin, document=retire, queue=False)
    assert "8 GPUs" in str(caught.value)
    assert not Scenario.objects.exists()


def test_the_replay_clears_with_each_teams_weight_as_the_market_does(history):
    # Vision weighs 3, nlp 1; under maxmin the market splits a short tier 3:1 where both
    # want more than their share (6 and 2 of 8 GPUs here), so the forecast's rounds must too:
    # with every weight taken as 1 the replay split them 4:4.
    from market.selectors import policy_active_get
    from market.services.policy import policy_activate, policy_version_create

    Tenant.objects.filter(pk=history.vision.pk).update(weight=3)
    version = policy_version_create(
        actor=history.admin, based_on=policy_active_get(), mechanism="maxmin"
    )
    policy_activate(version=version, actor=history.admin)
    done = run(copy.deepcopy(DOCUMENT) | {"changes": []}, history.admin)
    assert done.status == Scenario.Status.DONE, done.error
    spend = done.results["spend_after"]
    # Both pay the same price per GPU-hour, at most their limits (3 and 2.5 credits).
    assert spend["vision-lab"] >= 3 * spend["nlp-group"] * 2500 / 3000
