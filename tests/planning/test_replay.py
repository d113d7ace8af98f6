"""The replay clears forecast demand with the market's own clearing code."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from planning.demand import TierDemand
from planning.replay import Bidders, ReplayTier, replay, wait_rounds, weekly

T0 = datetime(2026, 12, 1, tzinfo=UTC)
EMPTY_FORECAST = None


def demand_of(values: list[float], campaigns: list[dict] | None = None) -> TierDemand:
    return TierDemand(
        tier="a100",
        starts_at=tuple(T0 + timedelta(hours=i) for i in range(len(values))),
        history=tuple(values),
        campaigns=tuple(campaigns or [{}] * len(values)),
        forecast=EMPTY_FORECAST,
    )


BIDDERS = {
    "a100": Bidders(
        shares={"vision": 0.5, "nlp": 0.3, "bio": 0.2},
        limits={"vision": 3_000, "nlp": 2_500, "bio": 4_000},
        default_limit=2_000,
    )
}


def run(capacity: int, values: list[float], reserve: int = 1_000):
    tiers = [ReplayTier(slug="a100", capacity=capacity, reserve=reserve)]
    return replay(tiers=tiers, demand={"a100": demand_of(values)}, bidders=BIDDERS, round_hours=1.0)


@settings(max_examples=25, deadline=None)
@given(
    capacity=st.integers(min_value=0, max_value=30),
    extra=st.integers(min_value=1, max_value=20),
    values=st.lists(st.floats(min_value=0, max_value=40), min_size=1, max_size=6),
)
def test_adding_capacity_never_raises_the_price_or_the_unmet_demand(capacity, extra, values):
    before = weekly(run(capacity, values), rounds_per_week=168, job_gpus=1)["a100"][0]
    after = weekly(run(capacity + extra, values), rounds_per_week=168, job_gpus=1)["a100"][0]
    assert after.price <= before.price
    assert after.unmet_gpu_hours <= before.unmet_gpu_hours + 1e-9


def test_a_short_tier_prices_at_the_marginal_limit_and_reports_unmet_demand():
    # 20 GPUs wanted (10 vision at 3, 6 nlp at 2.5, 4 bio at 4) on 14 GPUs: the price is
    # set between 2.5 and 3 credits (the welfare mechanism's fairness floor may still give
    # nlp some GPUs, at no more than its limit).
    result = run(14, [20.0] * 3)
    week = weekly(result, rounds_per_week=168, job_gpus=4)["a100"][0]
    assert 2_500 <= week.price <= 3_000
    assert week.unmet_gpu_hours == pytest.approx(3 * 6)
    assert week.utilisation_pct == pytest.approx(100)
    assert week.wait_rounds == pytest.approx(20 / 14 - 1)
    assert {"vision", "bio"} <= set(result.spend)
    assert 0 < sum(result.spend.values()) <= 3 * 14 * week.price


def test_the_wait_estimate():
    assert wait_rounds(demand=5, capacity=10, job_gpus=4) == 0
    assert wait_rounds(demand=20, capacity=10, job_gpus=4) == pytest.approx(1)
    assert wait_rounds(demand=20, capacity=10, job_gpus=11) is None


def test_fractional_demand_is_carried_not_lost():
    result = run(100, [0.5] * 8, reserve=1)
    allocated = sum(r.allocated for r in result.tiers["a100"])
    assert allocated == pytest.approx(0.5 * 8, abs=3)  # three tenants, each up to 1 short
    assert allocated > 0
