"""The worked example of docs/planning.md ("Which option for which demand"), checked by hand.

One tier with no GPUs of its own, a week's horizon of hourly rounds. Demand: a steady base
of 10 GPUs; 4 more from 08:00 to 18:00 on weekdays (50 hours a week); and a one-week
campaign of 6 GPUs (declared, so it does not recur after the horizon). Options: reserved at
2 credits/GPU-h for 12 months, on-demand at 4, spot at 2 with a quarter of the work lost to
interruptions (2 / 0.75 = 2.667 per GPU-hour of work), at most 8 spot GPUs to be had.
"""

from __future__ import annotations

import pytest

from planning.recommend import HOURS_PER_MONTH, TierNeed, recommend
from planning.scenario import Option, Targets

WEEK = 168


def office_hours(hour: int) -> bool:
    return (hour // 24) % 7 < 5 and 8 <= hour % 24 < 18


RECURRING = tuple(10.0 + (4.0 if office_hours(h) else 0.0) for h in range(WEEK))
NEED = TierNeed(
    tier="a100",
    capacity=0,
    demand=tuple(d + 6.0 for d in RECURRING),
    hours=1.0,
    after=RECURRING,
)
OPTIONS = [
    Option(tier="a100", kind="reserved", per_hour=2_000, term_months=12),
    Option(tier="a100", kind="on_demand", per_hour=4_000),
    Option(tier="a100", kind="spot", per_hour=2_000, interruption_rate=0.25, max_gpus=8),
]


def test_base_goes_to_reserved_weekdays_to_on_demand_and_the_spike_to_spot():
    plan = recommend(
        [NEED], OPTIONS, targets=Targets(max_unmet_pct=0, max_wait_rounds=0), kwh_price=0
    )
    lines = {line.kind: line for line in plan.lines}
    assert set(lines) == {"reserved", "on_demand", "spot"}

    # Steady base: 10 GPUs work every hour of the 12 months, above the break-even of
    # 2 / 4 = 50 % of the hours. The week's part 10 x 168 x 2 = 3,360 credits; the whole
    # commitment 10 x 2 x 12 x 730 = 175,200 credits.
    reserved = lines["reserved"]
    assert reserved.gpus == 10 and reserved.break_even_pct == 50.0
    assert reserved.cost == 3_360_000
    assert reserved.commitment == 175_200_000 == 10 * 2_000 * 12 * HOURS_PER_MONTH

    # The spike: 6 GPUs of work for the week. A reservation would work 168 of its 8,760
    # hours (1.9 %, far below 50 %); spot does it at 2.667 per GPU-hour of work against 4
    # on demand: 6 / 0.75 = 8 spot GPUs (all there are) for 168 h = 1,344 GPU-hours x 2
    # = 2,688 credits.
    spot = lines["spot"]
    assert (spot.gpus, spot.gpu_hours, spot.cost) == (8, 1344.0, 2_688_000)
    assert spot.commitment is None

    # Weekdays: 4 GPUs for 50 of 168 hours (30 %, below 50 %) and spot is all taken: on
    # demand, 200 GPU-hours x 4 = 800 credits.
    on_demand = lines["on_demand"]
    assert (on_demand.gpus, on_demand.gpu_hours, on_demand.cost) == (4, 200.0, 800_000)

    # The week: 3,360 + 2,688 + 800 = 6,848 credits; committed 175,200 + 2,688 + 800.
    assert plan.cost == 6_848_000
    assert plan.commitment == 178_688_000
    # Over the 12 months (8,760 h): the reservation, the week's rentals, and for the other
    # 8,592 hours (51.14 weeks) the weekday 4 GPUs on spot (free again once the campaign is
    # over): 200 GPU-hours of work x 2.667 a week.
    outcome = plan.tiers[0]
    rest_weeks = (12 * HOURS_PER_MONTH - WEEK) / WEEK
    expected = 175_200_000 + 2_688_000 + 800_000 + rest_weeks * 200 * 2_000 / 0.75
    assert outcome.window_hours == 12 * HOURS_PER_MONTH
    assert outcome.window_cost == pytest.approx(expected, rel=1e-6)
    assert outcome.unmet_pct == pytest.approx(0, abs=1e-9)
