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
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass
from datetime import datetime, timedelta
from typing import Any

from celery import current_app
from django.contrib.auth.models import AbstractBaseUser
from django.db import transaction
from django.db.models import Avg
from django.utils import timezone

import audit.services as audit
from market import clearing
from market.forecast import rounds_per_day
from market.forecast_selectors import TierHistory, tier_demand_history
from market.models import Bid, BidLimit, PolicyVersion, Tier
from market.selectors import policy_active_get
from planning.demand import CampaignLoad, TierDemand, tier_demand
from planning.errors import PlanningError
from planning.models import PlannedCampaign, Scenario
from planning.recommend import (
    RecommendError,
    TierNeed,
    plan_csv,
    recommend,
    tradeoff_curve,
)
from planning.replay import Bidders, ReplayResult, ReplayTier, Team, replay, weekly
from planning.scenario import ScenarioDoc, ScenarioError, scenario_parse
from telemetry.models import SampleMinute
from tenants.models import Tenant

logger = logging.getLogger(__name__)

SCENARIO_RUN_TASK = "planning.scenario_run"  # queued by name, after the scenario commits
HISTORY_ROUNDS = 2016
# The replay clears at most this many rounds per run (each standing for ``stride`` rounds):
# one an hour over four weeks at hourly rounds.
MAX_REPLAYED = 672
POWER_DAYS = 7


def _tiers_known(doc: ScenarioDoc) -> None:
    offered = {t.slug: t.offered for t in Tier.objects.filter(active=True)}
    existing = set(offered)
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
    for i, change in enumerate(doc.changes):
        if not change.new and offered[change.tier] + change.add_gpus < 0:
            have = offered[change.tier]
            raise PlanningError(
                f"changes[{i}].add_gpus: tier {change.tier} has {have} GPUs; "
                f"at most {have} can be retired (add_gpus >= -{have})"
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
        transaction.on_commit(lambda: current_app.send_task(SCENARIO_RUN_TASK, args=[scenario.pk]))
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


def _teams() -> dict[str, Team]:
    """Every tenant by slug with its id and weight, as the replay's bidders."""
    return {
        slug: Team(pk=pk, weight=weight)
        for slug, pk, weight in Tenant.objects.values_list("slug", "pk", "weight")
    }


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


@dataclass(frozen=True)
class _Setting:
    """The active policy as a run reads it, and the run's shape in rounds."""

    policy: PolicyVersion | None
    round_minutes: int
    mechanism: str
    rounds_per_day: int
    horizon: int  # future rounds
    stride: int

    @property
    def step(self) -> timedelta:
        return timedelta(minutes=self.round_minutes)

    @property
    def rounds_per_week(self) -> int:
        return 7 * self.rounds_per_day


def _setting(doc: ScenarioDoc) -> _Setting:
    """The active policy, its round length and mechanism, and the run's shape in rounds."""
    policy = policy_active_get()
    round_minutes = policy.round_minutes if policy else 60
    per_day = rounds_per_day(round_minutes)
    horizon = doc.horizon_weeks * 7 * per_day
    return _Setting(
        policy=policy,
        round_minutes=round_minutes,
        mechanism=policy.mechanism if policy else "welfare",
        rounds_per_day=per_day,
        horizon=horizon,
        stride=max(1, math.ceil(horizon / MAX_REPLAYED)),
    )


def _future_starts(
    history: Mapping[str, TierHistory], setting: _Setting, now: datetime
) -> list[datetime]:
    """The horizon's round starts: from the round after the history's last (else the next
    hour)."""
    some = next(iter(history.values()), None)
    first = (
        some.starts_at[-1] + setting.step
        if some and some.starts_at
        else now.replace(minute=0, second=0, microsecond=0) + timedelta(hours=1)
    )
    return [first + i * setting.step for i in range(setting.horizon)]


def _demand(
    slugs: list[str],
    history: Mapping[str, TierHistory],
    *,
    starts: list[datetime],
    setting: _Setting,
    campaigns: list[CampaignLoad],
) -> dict[str, TierDemand]:
    """Every tier's forecast demand (a new tier has no history: its campaigns only)."""
    return {
        slug: tier_demand(
            tier=slug,
            history=history[slug].demand if slug in history else [],
            starts_at=starts,
            round_length=setting.step,
            rounds_per_day=setting.rounds_per_day,
            campaigns=campaigns,
        )
        for slug in slugs
    }


def _bidders_all(
    doc: ScenarioDoc, slugs: list[str], rounds: list[int], setting: _Setting
) -> dict[str, Bidders]:
    """Who bids on each tier and at what limit; a new tier's bidders bid the highest typical
    limit (or its reserve), and a tier nobody bid on lately twice its reserve (at least 1)."""
    new_slugs = [c.tier for c in doc.changes if c.new]
    bidders = _bidders(slugs + new_slugs, rounds)
    for change in (c for c in doc.changes if c.new):
        fallback = max(
            change.reserve or 0, max((b.default_limit for b in bidders.values()), default=0)
        )
        bidders[change.tier] = Bidders(shares={}, limits={}, default_limit=fallback)
    for slug, b in bidders.items():
        if b.default_limit <= 0:
            reserve = setting.policy.reserve_for(slug) if setting.policy else 0
            bidders[slug] = Bidders(b.shares, b.limits, default_limit=max(reserve * 2, 1000))
    return bidders


def _priorities(campaigns: list[CampaignLoad]) -> dict[tuple[str, str], int]:
    priorities: dict[tuple[str, str], int] = {}
    for c in campaigns:
        for slug in c.tiers:
            key = (c.tenant, slug)
            priorities[key] = max(priorities.get(key, 0), c.priority)
    return priorities


def _replays(
    *,
    baseline: list[ReplayTier],
    scenario: list[ReplayTier],
    demand: dict[str, TierDemand],
    existing: list[str],
    bidders: dict[str, Bidders],
    campaigns: list[CampaignLoad],
    setting: _Setting,
    progress: Callable[[int, int], None] | None,
) -> tuple[ReplayResult, ReplayResult]:
    """The horizon replayed with today's tiers, then with the scenario's."""
    total = 2 * len(range(0, setting.horizon, setting.stride))

    def half(offset: int) -> Callable[[int, int], None]:
        return lambda done, count: progress(offset + done, total) if progress else None

    common = dict(
        bidders=bidders, teams=_teams(), priorities=_priorities(campaigns),
        policy=setting.policy,
        round_hours=setting.round_minutes / 60, stride=setting.stride,
    )  # fmt: skip
    base_demand = {s: d for s, d in demand.items() if s in existing}
    before = replay(tiers=baseline, demand=base_demand, progress=half(0), **common)
    after = replay(tiers=scenario, demand=demand, progress=half(total // 2), **common)
    return before, after


def _needs(
    scenario: list[ReplayTier],
    after: ReplayResult,
    demand: dict[str, TierDemand],
    *,
    setting: _Setting,
    power: dict[str, float],
) -> list[TierNeed]:
    """What the recommendation must serve per tier: the replayed demand with its P90, and the
    recurring demand of the horizon's last week (the forecast without the campaigns, which
    do not recur) for the rest of a commitment's term."""
    last_week = [r for r in after.rounds if r >= setting.horizon - setting.rounds_per_week]
    needs = []
    for t in scenario:
        history, p90 = demand[t.slug].history, demand[t.slug].p90
        needs.append(
            TierNeed(
                tier=t.slug,
                capacity=t.capacity,
                demand=tuple(r.demand for r in after.tiers[t.slug]),
                hours=setting.round_minutes / 60 * setting.stride,
                power_kw=power.get(t.slug, 0.0),
                after=tuple(history[r] for r in last_week),
                p90=tuple(p90[r] for r in after.rounds),
            )
        )
    return needs


def _recommendation(needs: list[TierNeed], doc: ScenarioDoc) -> dict[str, Any]:
    try:
        plan = recommend(needs, doc.options, targets=doc.targets, kwh_price=doc.kwh_price)
    except RecommendError as exc:
        return {"error": str(exc)}
    return {
        "cost": plan.cost,
        "commitment": plan.commitment,
        "lines": [asdict(line) for line in plan.lines],
        "tiers": [asdict(t) | {"p90_note": t.p90_note} for t in plan.tiers],
        "csv": plan_csv(plan),
    }


def _backtests(demand: dict[str, TierDemand], slugs: list[str]) -> dict[str, dict]:
    """Per tier: the chosen model, every candidate's backtest, and the chosen model's error
    beside the seasonal-naive rule's at each horizon."""
    out = {}
    for slug in slugs:
        forecast = demand[slug].forecast
        beside = [
            {"horizon": mine.horizon, "origins": mine.origins, "wape_pct": mine.wape_pct,
             "mase": mine.mase, "seasonal_naive_wape_pct": base.wape_pct,
             "seasonal_naive_mase": base.mase}
            for mine, base in forecast.beside_baseline()
        ]  # fmt: skip
        out[slug] = {
            "model": forecast.model,
            "label": forecast.label,
            "season": forecast.season,
            "history": forecast.history,
            "warning": forecast.warning,
            "beside_baseline": beside,
            "scores": [asdict(score) for score in forecast.scores],
        }
    return out


def _forecast_weeks(
    demand: dict[str, TierDemand], setting: _Setting, rounds: list[int]
) -> dict[str, dict]:
    """Per tier: P10/P50/P90 demand in GPUs at each replayed round (for the chart) and in
    GPU-hours per week."""
    hours = setting.round_minutes / 60
    out = {}
    for slug, d in demand.items():
        series = {"p10": d.p10, "p50": d.total, "p90": d.p90}
        weeks = []
        for week in range(setting.horizon // setting.rounds_per_week):
            span = slice(week * setting.rounds_per_week, (week + 1) * setting.rounds_per_week)
            weeks.append({q: sum(values[span]) * hours for q, values in series.items()})
        out[slug] = {
            "starts": [d.starts_at[r].isoformat() for r in rounds],
            **{q: [round(values[r], 3) for r in rounds] for q, values in series.items()},
            "weeks": weeks,
        }
    return out


def _warnings(demand: dict[str, TierDemand], existing: list[str], rounds: int) -> list[str]:
    """What the planner must know before trusting the plan: no or too little history."""
    if rounds == 0:
        return [
            "No settled rounds yet: the forecast is empty, so the plan covers only declared "
            "campaigns. It is not evidence that nothing needs buying; run again once the "
            "market has a few weeks of history."
        ]
    return [f"{slug}: {demand[slug].forecast.warning}" for slug in existing
            if demand[slug].forecast.warning]  # fmt: skip


def scenario_results(
    doc: ScenarioDoc, *, now: datetime, progress: Callable[[int, int], None] | None = None
) -> dict:
    """Everything the scenario page shows, as JSON (money in milli-credits)."""
    setting = _setting(doc)
    tiers = list(Tier.objects.filter(active=True).order_by("slug"))
    slugs = [t.slug for t in tiers]
    new_slugs = [c.tier for c in doc.changes if c.new]
    history = tier_demand_history(tier_slugs=slugs, rounds=HISTORY_ROUNDS)
    campaigns = _campaign_loads(now)
    starts = _future_starts(history, setting, now)
    demand = _demand(
        slugs + new_slugs, history, starts=starts, setting=setting, campaigns=campaigns
    )
    rounds = next(iter(history.values())).rounds if history else []
    baseline_tiers = _replay_tiers(None, setting.policy, tiers)
    scenario_tiers = _replay_tiers(doc, setting.policy, tiers)
    before, after = _replays(
        baseline=baseline_tiers, scenario=scenario_tiers, demand=demand, existing=slugs,
        bidders=_bidders_all(doc, slugs, rounds, setting), campaigns=campaigns,
        setting=setting, progress=progress,
    )  # fmt: skip
    needs = _needs(scenario_tiers, after, demand, setting=setting, power=_power_kw(slugs, now))
    weeks_before = weekly(before, rounds_per_week=setting.rounds_per_week, job_gpus=doc.job_gpus)
    weeks_after = weekly(after, rounds_per_week=setting.rounds_per_week, job_gpus=doc.job_gpus)
    curve = tradeoff_curve(needs, doc.options, targets=doc.targets, kwh_price=doc.kwh_price)
    capacity_before = {b.slug: b.capacity for b in baseline_tiers}
    return {
        "generated_at": now.isoformat(),
        "round_minutes": setting.round_minutes,
        "rounds_per_week": setting.rounds_per_week,
        "stride": setting.stride,
        "mechanism": setting.mechanism,
        "history_rounds": len(rounds),
        "warnings": _warnings(demand, slugs, len(rounds)),
        "campaigns": [
            {"tenant": c.tenant, "name": c.name, "gpu_hours": c.gpu_hours, "tiers": list(c.tiers)}
            for c in campaigns
        ],
        "tiers": {
            t.slug: {
                "capacity_before": capacity_before.get(t.slug, 0),
                "capacity_after": t.capacity,
                "weeks_before": [asdict(w) for w in weeks_before.get(t.slug, [])],
                "weeks_after": [asdict(w) for w in weeks_after[t.slug]],
            }
            for t in scenario_tiers
        },
        "forecast": _forecast_weeks(demand, setting, after.rounds),
        "spend_before": before.spend,
        "spend_after": after.spend,
        "backtest": _backtests(demand, slugs),
        "targets": asdict(doc.targets),
        "recommendation": _recommendation(needs, doc),
        "tradeoff": [{"max_unmet_pct": pct, "cost": cost} for pct, cost in curve],
    }
