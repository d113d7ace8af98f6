"""Demand for planning: the forecast plus declared campaigns, and a backtest on unseen rounds."""

from __future__ import annotations

import math
from datetime import UTC, datetime, timedelta

import pytest

from planning.demand import CampaignLoad, backtest, campaign_gpus, tier_demand

T0 = datetime(2026, 12, 1, tzinfo=UTC)
HOUR = timedelta(hours=1)


def seasonal(rounds: int) -> list[float]:
    return [10 + 5 * math.sin(2 * math.pi * i / 24) for i in range(rounds)]


def test_the_backtest_scores_only_rounds_the_model_did_not_see():
    history = seasonal(24 * 6)
    first = backtest(history, season_length=24, holdout=24)
    # Change only the held-out rounds: the forecast is the same, its error is not.
    changed = history[:-24] + [x + 7 for x in history[-24:]]
    second = backtest(changed, season_length=24, holdout=24)
    assert first.predicted == second.predicted
    assert first.trained_on == second.trained_on == 24 * 5
    assert second.actual != first.actual
    assert first.mape_pct is not None and second.mape_pct is not None
    assert first.mape_pct < 5 < second.mape_pct
    assert second.mae == pytest.approx(
        sum(abs(p - a) for p, a in zip(second.predicted, second.actual, strict=True)) / 24
    )


def test_a_backtest_without_enough_history_says_why():
    short = backtest([3.0, 4.0], season_length=24, holdout=24)
    assert short.mape_pct is None and "more than 24 rounds" in short.reason
    zeros = backtest([0.0] * 100, season_length=24, holdout=10)
    assert zeros.mape_pct is None and "zero demand" in zeros.reason


def test_a_declared_campaign_adds_its_gpu_hours_spread_over_its_span_and_tiers():
    # 480 GPU-hours over 24 hours on two tiers: 20 GPUs at once, 10 on each tier.
    campaign = CampaignLoad(
        tenant="vision",
        name="paper",
        starts_at=T0 + 2 * HOUR,
        ends_at=T0 + 26 * HOUR,
        gpu_hours=480,
        tiers=("a100", "h100"),
    )
    starts = [T0 + i * HOUR for i in range(30)]
    demand = tier_demand(
        tier="a100",
        history=seasonal(24 * 3),
        starts_at=starts,
        round_length=HOUR,
        season_length=24,
        campaigns=[campaign],
    )
    added = [sum(c.values()) for c in demand.campaigns]
    assert added[:2] == [0, 0] and added[26:] == [0] * 4
    assert added[2:26] == [pytest.approx(10)] * 24
    assert sum(added) == pytest.approx(480 / 2)
    assert demand.total[5] == pytest.approx(demand.history[5] + 10)
    half = campaign_gpus(campaign, tier="a100", start=T0 + 1.5 * HOUR, round_length=HOUR)
    assert half == pytest.approx(5)  # half the round overlaps
    assert campaign_gpus(campaign, tier="l40s", start=T0 + 3 * HOUR, round_length=HOUR) == 0
