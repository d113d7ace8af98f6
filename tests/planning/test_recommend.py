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


def test_a_spike_is_not_met_with_reservations_charged_only_for_the_horizon():
    # Six days of 8 GPUs on an empty tier, nothing before or after (a campaign). A 12-month
    # reservation at 2.2 costs 8 x 2.2 x 8,760 = 154,176 credits, not 8 x 2.2 x 168: renting
    # the 1,152 GPU-hours on demand at 4 (4,608) is far cheaper.
    spike = TierNeed(tier="a100", capacity=0, demand=(8.0,) * 144 + (0.0,) * 24, hours=1.0,
                     after=(0.0,) * 168)  # fmt: skip
    rentals = [
        Option(tier="a100", kind="reserved", per_hour=2_200, term_months=12),
        Option(tier="a100", kind="on_demand", per_hour=4_000),
    ]
    plan = recommend([spike], rentals, targets=STRICT, kwh_price=0)
    assert [(line.kind, line.gpus, line.gpu_hours) for line in plan.lines] == [
        ("on_demand", 8, 1152.0)
    ]
    assert plan.cost == 1152 * 4_000 and plan.commitment == plan.cost
    assert plan.tiers[0].window_hours == 12 * 730


def test_a_reservation_shows_its_whole_commitment_and_break_even():
    steady = TierNeed(tier="a100", capacity=0, demand=(5.0,) * 168, hours=1.0)
    rentals = [
        Option(tier="a100", kind="reserved", per_hour=2_200, term_months=12),
        Option(tier="a100", kind="on_demand", per_hour=4_000),
    ]
    plan = recommend([steady], rentals, targets=STRICT, kwh_price=0)
    (line,) = plan.lines
    assert (line.kind, line.gpus, line.term_months) == ("reserved", 5, 12)
    assert line.cost == 5 * 168 * 2_200  # the week's part
    assert line.commitment == 5 * 12 * 730 * 2_200  # 96,360 credits: the whole term
    assert line.break_even_pct == 55.0  # 2.2 / 4: worth it above 55 % of the hours
    assert plan.commitment == line.commitment


def test_p90_beyond_firm_capacity_is_said_and_spot_named_as_the_risk():
    # P50 10 GPUs, P90 14, on a tier of 6: on-demand may rent at most 2, spot the rest.
    need = TierNeed(tier="a100", capacity=6, demand=(10.0,) * 168, hours=1.0, p90=(14.0,) * 168)
    menu = [
        Option(tier="a100", kind="on_demand", per_hour=4_000, max_gpus=2),
        Option(tier="a100", kind="spot", per_hour=1_000, interruption_rate=0.5),
    ]
    plan = recommend([need], menu, targets=STRICT, kwh_price=0)
    outcome = plan.tiers[0]
    # Firm: 6 + 2 on demand = 8 against 14 at P90: 6 GPUs x 168 h.
    assert outcome.p90_uncovered_gpu_hours == 6 * 168
    assert outcome.spot_gpu_hours > 0
    assert "NOT covered" in outcome.p90_note and "if spot is interrupted" in outcome.p90_note
    unlimited = Option(tier="a100", kind="on_demand", per_hour=4_000)
    covered = recommend([need], [unlimited], targets=STRICT, kwh_price=0)
    assert covered.tiers[0].p90_uncovered_gpu_hours == 0
    assert covered.tiers[0].p90_note.startswith("P90 demand is covered")
