"""The recommendation: the cheapest mix that meets the targets, on examples checked by hand."""

from __future__ import annotations

import pytest

from planning.recommend import RecommendError, TierNeed, plan_csv, recommend, tradeoff_curve
from planning.scenario import Option, Targets

# One week of hourly rounds, 10 GPUs wanted in every one, 6 on the tier.
NEED = TierNeed(tier="a100", capacity=6, demand=(10.0,) * 168, hours=1.0)
STRICT = Targets(max_unmet_pct=0, max_wait_rounds=0)


def options(**per_hour: str) -> list[Option]:
    prices = {"reserved": 2_000, "on_demand": 4_000, "spot": 1_000} | {
        k: int(float(v) * 1000) for k, v in per_hour.items()
    }
    return [
        # 30,000 credits over 36 months = 1.142 credits an hour, plus 0.5 kW at 0.2 = 0.1.
        Option(
            tier="a100", kind="purchase", price=30_000_000, amortisation_months=36, power_kw=0.5
        ),
        Option(tier="a100", kind="reserved", per_hour=prices["reserved"]),
        Option(tier="a100", kind="on_demand", per_hour=prices["on_demand"]),
        Option(tier="a100", kind="spot", per_hour=prices["spot"], interruption_rate=0.5),
    ]


def test_the_cheapest_option_is_picked_and_the_targets_are_met():
    # 4 GPUs short in every hour. Per GPU-hour of work: purchase 1.142 + 0.100 = 1.242,
    # reserved 2, on-demand 4, spot 1 / (1 - 0.5) = 2. Purchase wins: 4 GPUs for 168 h
    # = 4 x 168 x 1.242 = 834.9 credits.
    plan = recommend([NEED], options(), targets=STRICT, kwh_price=200)
    assert [(line.kind, line.gpus) for line in plan.lines] == [("purchase", 4)]
    hourly = 30_000_000 / (36 * 730) + 0.5 * 200
    assert plan.cost == pytest.approx(4 * 168 * hourly, abs=2)
    assert plan.tiers[0].unmet_pct == 0 and plan.tiers[0].worst_wait_rounds == 0


def test_a_cheaper_rental_takes_over_and_a_cap_on_purchases_is_kept():
    capped = [
        Option(tier="a100", kind="purchase", price=30_000_000, power_kw=0.5, max_gpus=1),
        *options()[1:],
    ]
    # One purchase (1.242/h), then the rest at 2/h: reserved and spot tie at 2 per GPU-hour
    # of work, so the cost is 1 x 168 x 1.242 + 3 x 168 x 2 whatever mix of the two.
    plan = recommend([NEED], capped, targets=STRICT, kwh_price=200)
    assert {line.kind: line.gpus for line in plan.lines}["purchase"] == 1
    hourly = 30_000_000 / (36 * 730) + 0.5 * 200
    assert plan.cost == pytest.approx(168 * hourly + 3 * 168 * 2_000, abs=5)


def test_on_demand_is_paid_only_for_the_hours_it_works():
    # Short only in 10 of 168 hours (by 2 GPUs): on-demand at 4/h for 20 GPU-hours = 80
    # credits beats a reservation for the whole week (2 x 168 x 2 = 672).
    peaky = TierNeed(tier="a100", capacity=6, demand=(8.0,) * 10 + (5.0,) * 158, hours=1.0)
    only_rentals = [o for o in options() if o.kind in ("reserved", "on_demand")]
    plan = recommend([peaky], only_rentals, targets=STRICT, kwh_price=0)
    assert [(line.kind, line.gpu_hours) for line in plan.lines] == [("on_demand", 20.0)]
    assert plan.cost == 80_000


def test_allowing_more_unmet_demand_never_costs_more():
    # A wait of one round lets the tier run at half its demand, so unmet demand decides.
    waits = Targets(max_unmet_pct=0, max_wait_rounds=1)
    curve = tradeoff_curve([NEED], options(), targets=waits, kwh_price=200)
    costs = [cost for _, cost in curve]
    assert None not in costs
    assert all(later <= earlier for earlier, later in zip(costs, costs[1:], strict=False))
    assert dict(curve)[50] == 0  # 4 of 10 GPUs short is 40 % unmet: nothing to buy
    assert costs[0] == recommend([NEED], options(), targets=waits, kwh_price=200).cost > 0


def test_a_target_no_option_can_meet_says_what_to_change():
    with pytest.raises(RecommendError, match="tier a100.*add an option"):
        recommend([NEED], [], targets=STRICT, kwh_price=0)


def test_the_plan_exports_as_csv_in_credits():
    plan = recommend([NEED], options(), targets=STRICT, kwh_price=200)
    lines = plan_csv(plan, tier_names={"a100": "A100 80GB"}).splitlines()
    assert lines[0] == "tier,option,gpus,gpu_hours,cost_credits"
    assert lines[1].startswith("A100 80GB,purchase,4,672.0,")
    assert lines[-1] == f"total,,,,{plan.cost / 1000:.3f}"
