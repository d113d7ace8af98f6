"""Scenario runs: read the market's history and the declared campaigns, forecast demand, replay
it through the clearing with and without the scenario's changes, recommend what to buy.

``scenario_create`` keeps the document and queues the run; ``scenario_run`` (the Celery task
``planning.scenario_run``, or ``gpumarket plan`` directly) does the work outside any long
transaction, saving progress as it goes, and stores the results on the scenario.
"""

from __future__ import annotations

import logging
import math
import statistics
from collections import defaultdict
from dataclasses import asdict
from datetime import datetime, timedelta
from typing import Any

from django.contrib.auth.models import AbstractBaseUser
from django.db import transaction
from django.db.models import Avg
from django.utils import timezone

import audit.services as audit
from market import clearing
from market.forecast import rounds_per_day
from market.forecast_selectors import tier_demand_history
from market.models import Bid, BidLimit, PolicyVersion, Tier
from market.selectors import policy_active_get
from market.services.policy import PLATFORM_PARAMS
from planning.demand import CampaignLoad, TierDemand, backtest, tier_demand
from planning.errors import PlanningError
from planning.models import PlannedCampaign, Scenario
from planning.recommend import (
    RecommendError,
    TierNeed,
    plan_csv,
    recommend,
    tradeoff_curve,
)
from planning.replay import Bidders, ReplayTier, replay, weekly
from planning.scenario import ScenarioDoc, ScenarioError, scenario_parse
from telemetry.models import SampleMinute

logger = logging.getLogger(__name__)

HISTORY_ROUNDS = 2016
# The replay clears at most this many rounds per run (each standing for ``stride`` rounds):
# one an hour over four weeks at hourly rounds.
MAX_REPLAYED = 672
POWER_DAYS = 7


def _tiers_known(doc: ScenarioDoc) -> None:
    existing = set(Tier.objects.filter(active=True).values_list("slug", flat=True))
    new = {c.tier for c in doc.changes if c.new}
    clash = sorted(new & existing)
    if clash:
        raise PlanningError(f"changes: tier {', '.join(clash)} already exists; change it instead")
    unknown = sorted({c.tier for c in doc.changes if not c.new} - existing)
    unknown += sorted({o.tier for o in doc.options} - existing - new)
    if unknown:
        raise PlanningError(
            f"unknown tier {', '.join(unknown)}; tiers on offer: {', '.join(sorted(existing))}"
        )


@transaction.atomic
def scenario_create(
    *, actor: AbstractBaseUser | str | None, document: Any, queue: bool = True
) -> Scenario:
    """Keep a scenario (validated) and, with ``queue``, run it on a worker after commit."""
    try:
        doc = scenario_parse(document)
    except ScenarioError as exc:
        raise PlanningError(str(exc)) from exc
    _tiers_known(doc)
    # A process (the `gpumarket plan` command) is an actor in the audit log, not a user.
    created_by = actor if isinstance(actor, AbstractBaseUser) else None
    scenario = Scenario.objects.create(name=doc.name, inputs=document, created_by=created_by)
    audit.record(
        actor=actor,
        action="planning.scenario_create",
        target=scenario,
        after={"name": doc.name, "inputs": document},
    )
    if queue:
        from planning.tasks import scenario_run_task

        transaction.on_commit(lambda: scenario_run_task.delay(scenario.pk))
    return scenario


def _claim(scenario_id: int, now: datetime) -> Scenario | None:
    with transaction.atomic():
        scenario = Scenario.objects.select_for_update().get(pk=scenario_id)
        if scenario.status != Scenario.Status.QUEUED:
            return None
        scenario.status = Scenario.Status.RUNNING
        scenario.started_at = now
        scenario.save(update_fields=["status", "started_at"])
    return scenario


def scenario_run(*, scenario_id: int, now: datetime | None = None) -> Scenario:
    """Run a queued scenario once (a second call, or a redelivered task, returns it as is)."""
    now = now or timezone.now()
    scenario = _claim(scenario_id, now)
    if scenario is None:
        return Scenario.objects.get(pk=scenario_id)

    def progress(done: int, total: int) -> None:
        if done == total or done % 25 == 0:
            Scenario.objects.filter(pk=scenario_id).update(progress_done=done, progress_total=total)

    try:
        results = scenario_results(scenario_parse(scenario.inputs), now=now, progress=progress)
    except (PlanningError, ScenarioError, clearing.ClearingError) as exc:
        return _finish(scenario, error=str(exc))
    except Exception as exc:  # a run must end failed, not stay "running" for ever
        logger.exception("scenario %s failed", scenario_id)
        return _finish(scenario, error=f"the run failed: {exc}")
    return _finish(scenario, results=results)


@transaction.atomic
def _finish(scenario: Scenario, *, results: dict | None = None, error: str = "") -> Scenario:
    scenario = Scenario.objects.select_for_update().get(pk=scenario.pk)
    scenario.status = Scenario.Status.FAILED if error else Scenario.Status.DONE
    scenario.results = results
    scenario.error = error
    scenario.finished_at = timezone.now()
    scenario.save(update_fields=["status", "results", "error", "finished_at"])
    summary: dict[str, Any] = {"status": scenario.status}
    if error:
        summary["error"] = error
    elif results and results.get("recommendation"):
        summary["recommended_cost"] = results["recommendation"].get("cost")
    audit.record(actor="worker", action="planning.scenario_run", target=scenario, after=summary)
    return scenario


# Reads ---------------------------------------------------------------------------------


def _bidders(slugs: list[str], rounds: list[int]) -> dict[str, Bidders]:
    """Per tier: each tenant's share of the GPUs bid there over ``rounds`` and its median
    limit (milli-credits/GPU-hour)."""
    asked: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    limits: dict[str, dict[str, list[int]]] = defaultdict(lambda: defaultdict(list))
    rows = (
        BidLimit.objects.filter(bid__round_id__in=rounds, tier__slug__in=slugs)
        .exclude(bid__status=Bid.Status.CANCELLED)
        .values_list("tier__slug", "bid__tenant__slug", "bid__quantity", "price")
    )
    for slug, tenant, quantity, price in rows:
        asked[slug][tenant] += quantity
        limits[slug][tenant].append(price)
    out = {}
    for slug in slugs:
        total = sum(asked[slug].values())
        every = [p for prices in limits[slug].values() for p in prices]
        out[slug] = Bidders(
            shares={t: q / total for t, q in asked[slug].items()} if total else {},
            limits={t: int(statistics.median(p)) for t, p in limits[slug].items()},
            default_limit=int(statistics.median(every)) if every else 0,
        )
    return out


def _power_kw(slugs: list[str], now: datetime) -> dict[str, float]:
    """Mean metered draw of one GPU of each tier over the last week, kW (0 with no data)."""
    rows = (
        SampleMinute.objects.filter(
            gpu__tier__slug__in=slugs, minute__gte=now - timedelta(days=POWER_DAYS)
        )
        .values_list("gpu__tier__slug")
        .annotate(mean=Avg("power_avg"))
        .order_by()
    )
    return {slug: float(mean or 0) / 1000 for slug, mean in rows}


def _campaign_loads(now: datetime) -> list[CampaignLoad]:
    return [
        CampaignLoad(
            tenant=c.tenant.slug,
            name=c.name,
            starts_at=c.starts_at,
            ends_at=c.ends_at,
            gpu_hours=c.gpu_hours,
            tiers=tuple(t.slug for t in c.tiers.all()),
            priority=c.priority,
        )
        for c in PlannedCampaign.objects.filter(withdrawn_at__isnull=True, ends_at__gt=now)
        .select_related("tenant")
        .prefetch_related("tiers")
    ]


def _replay_tiers(
    doc: ScenarioDoc | None, policy: PolicyVersion | None, tiers: list[Tier]
) -> list[ReplayTier]:
    changes = {c.tier: c for c in doc.changes} if doc else {}
    out = []
    for tier in tiers:
        change = changes.get(tier.slug)
        reserve = policy.reserve_for(tier.slug) if policy else 0
        out.append(
            ReplayTier(
                slug=tier.slug,
                capacity=max(0, tier.offered + (change.add_gpus if change else 0)),
                reserve=change.reserve if change and change.reserve is not None else reserve,
                max_share_pct=policy.max_share_for(tier.slug) if policy else 100,
            )
        )
    for change in changes.values():
        if change.new:
            out.append(
                ReplayTier(slug=change.tier, capacity=change.add_gpus, reserve=change.reserve or 0)
            )
    return out


def scenario_results(doc: ScenarioDoc, *, now: datetime, progress=None) -> dict:
    """Everything the scenario page shows, as JSON (money in milli-credits)."""
    policy = policy_active_get()
    round_minutes = policy.round_minutes if policy else 60
    mechanism = policy.mechanism if policy else "welfare"
    params = (
        {
            k: v
            for k, v in (policy.params or {}).items()
            if k != "quotas" and k not in PLATFORM_PARAMS
        }
        if policy
        else {}
    )
    step = timedelta(minutes=round_minutes)
    season = rounds_per_day(round_minutes)
    rounds_per_week = 7 * season
    horizon = doc.horizon_weeks * rounds_per_week
    stride = max(1, math.ceil(horizon / MAX_REPLAYED))
    tiers = list(Tier.objects.filter(active=True).order_by("slug"))
    slugs = [t.slug for t in tiers]
    history = tier_demand_history(tier_slugs=slugs, rounds=HISTORY_ROUNDS)
    any_history = next(iter(history.values()), None)
    first = (
        any_history.starts_at[-1] + step
        if any_history and any_history.starts_at
        else now.replace(minute=0, second=0, microsecond=0) + timedelta(hours=1)
    )
    starts = [first + i * step for i in range(horizon)]
    campaigns = _campaign_loads(now)
    new_slugs = [c.tier for c in doc.changes if c.new]
    demand: dict[str, TierDemand] = {
        slug: tier_demand(
            tier=slug,
            history=history[slug].demand if slug in history else [],
            starts_at=starts,
            round_length=step,
            season_length=season,
            campaigns=campaigns,
        )
        for slug in slugs + new_slugs
    }
    rounds = any_history.rounds if any_history else []
    bidders = _bidders(slugs + new_slugs, rounds)
    for slug in new_slugs:
        change = next(c for c in doc.changes if c.tier == slug)
        fallback = max(
            change.reserve or 0, max((b.default_limit for b in bidders.values()), default=0)
        )
        bidders[slug] = Bidders(shares={}, limits={}, default_limit=fallback)
    for slug, b in bidders.items():
        if b.default_limit <= 0:
            reserve = policy.reserve_for(slug) if policy else 0
            bidders[slug] = Bidders(b.shares, b.limits, default_limit=max(reserve * 2, 1000))
    priorities: dict[tuple[str, str], int] = {}
    for c in campaigns:
        for slug in c.tiers:
            key = (c.tenant, slug)
            priorities[key] = max(priorities.get(key, 0), c.priority)
    baseline_tiers = _replay_tiers(None, policy, tiers)
    scenario_tiers = _replay_tiers(doc, policy, tiers)
    total = 2 * len(range(0, horizon, stride))

    def half(offset: int):
        return lambda done, count: progress(offset + done, total) if progress else None

    common = dict(
        bidders=bidders, priorities=priorities, mechanism=mechanism, params=params,
        round_hours=round_minutes / 60, stride=stride,
    )  # fmt: skip
    base_demand = {s: d for s, d in demand.items() if s in slugs}
    before = replay(tiers=baseline_tiers, demand=base_demand, progress=half(0), **common)
    after = replay(tiers=scenario_tiers, demand=demand, progress=half(total // 2), **common)
    weeks_before = weekly(before, rounds_per_week=rounds_per_week, job_gpus=doc.job_gpus)
    weeks_after = weekly(after, rounds_per_week=rounds_per_week, job_gpus=doc.job_gpus)
    power = _power_kw(slugs, now)
    needs = [
        TierNeed(
            tier=t.slug,
            capacity=t.capacity,
            demand=tuple(r.demand for r in after.tiers[t.slug]),
            hours=round_minutes / 60 * stride,
            power_kw=power.get(t.slug, 0.0),
        )
        for t in scenario_tiers
    ]
    recommendation: dict[str, Any]
    try:
        plan = recommend(needs, doc.options, targets=doc.targets, kwh_price=doc.kwh_price)
    except RecommendError as exc:
        recommendation = {"error": str(exc)}
    else:
        recommendation = {
            "cost": plan.cost,
            "lines": [asdict(line) for line in plan.lines],
            "tiers": [asdict(t) for t in plan.tiers],
            "csv": plan_csv(plan),
        }
    curve = tradeoff_curve(needs, doc.options, targets=doc.targets, kwh_price=doc.kwh_price)
    backtests = {}
    for slug in slugs:
        past = history[slug].demand if slug in history else []
        holdout = min(season, max(1, len(past) // 4))
        backtests[slug] = asdict(backtest(past, season_length=season, holdout=holdout))
        backtests[slug].pop("actual")
        backtests[slug].pop("predicted")
    return {
        "generated_at": now.isoformat(),
        "round_minutes": round_minutes,
        "rounds_per_week": rounds_per_week,
        "stride": stride,
        "mechanism": mechanism,
        "history_rounds": len(rounds),
        "campaigns": [
            {"tenant": c.tenant, "name": c.name, "gpu_hours": c.gpu_hours, "tiers": list(c.tiers)}
            for c in campaigns
        ],
        "tiers": {
            t.slug: {
                "capacity_before": next(
                    (b.capacity for b in baseline_tiers if b.slug == t.slug), 0
                ),
                "capacity_after": t.capacity,
                "weeks_before": [asdict(w) for w in weeks_before.get(t.slug, [])],
                "weeks_after": [asdict(w) for w in weeks_after[t.slug]],
            }
            for t in scenario_tiers
        },
        "spend_before": before.spend,
        "spend_after": after.spend,
        "backtest": backtests,
        "targets": asdict(doc.targets),
        "recommendation": recommendation,
        "tradeoff": [{"max_unmet_pct": pct, "cost": cost} for pct, cost in curve],
    }
