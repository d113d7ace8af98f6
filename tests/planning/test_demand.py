"""Demand for planning: the forecast plus declared campaigns as known future demand."""

from __future__ import annotations

import math
from datetime import UTC, datetime, timedelta

import pytest

from planning.demand import CampaignLoad, campaign_gpus, tier_demand

T0 = datetime(2026, 12, 1, tzinfo=UTC)
HOUR = timedelta(hours=1)


def seasonal(rounds: int) -> list[float]:
    return [10 + 5 * math.sin(2 * math.pi * i / 24) for i in range(rounds)]


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
        rounds_per_day=24,
        campaigns=[campaign],
    )
    added = [sum(c.values()) for c in demand.campaigns]
    assert added[:2] == [0, 0] and added[26:] == [0] * 4
    assert added[2:26] == [pytest.approx(10)] * 24
    assert sum(added) == pytest.approx(480 / 2)
    assert demand.total[5] == pytest.approx(demand.history[5] + 10)
    # Known demand: it moves every quantile by the same GPUs, the band keeps its width.
    assert demand.p10[5] == pytest.approx(demand.forecast.p10[5] + 10)
    assert demand.p90[5] == pytest.approx(demand.forecast.p90[5] + 10)
    assert demand.p10[5] <= demand.total[5] <= demand.p90[5]
    half = campaign_gpus(campaign, tier="a100", start=T0 + 1.5 * HOUR, round_length=HOUR)
    assert half == pytest.approx(5)  # half the round overlaps
    assert campaign_gpus(campaign, tier="l40s", start=T0 + 3 * HOUR, round_length=HOUR) == 0
