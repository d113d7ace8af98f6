"""market/foresight.py by hand: win rates, ETAs and the value needed for a deadline."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from market.foresight import foresee, round_costs, rounds_won

NOW = datetime(2030, 1, 7, 10, 0, tzinfo=UTC)
HOUR = 3600
# Ten rounds; a100 cleared at 1.0 .. 2.8 credits, h100 at 3.0 except where it did not clear.
PRICES = [{"a100": 1000 + 200 * i, **({"h100": 3000} if i % 2 == 0 else {})} for i in range(10)]


def test_round_costs_take_the_cheapest_acceptable_tier_and_none_when_none_cleared():
    assert round_costs([{"a100": 1500, "h100": 1200}, {"a100": 900}, {}], ["a100", "h100"]) == [
        1200,
        900,
        None,
    ]


def test_rounds_won_compares_each_tier_with_its_own_value():
    # a100 <= 1.5 in rounds 0, 1, 2 (1.0, 1.2, 1.4); h100 <= 3.0 in the five even rounds.
    assert rounds_won(prices=PRICES, values={"a100": 1500}) == 3
    assert rounds_won(prices=PRICES, values={"a100": 1500, "h100": 3000}) == 6  # 0,1,2,4,6,8


def test_eta_is_windows_needed_over_the_win_rate():
    # 10 GPU-hours left at 2 GPUs a 1-hour window: 5 windows; wins 3 of 10 rounds -> 5 / 0.3
    # = 16.7, so 17 windows from now.
    sight = foresee(
        prices=PRICES,
        values={"a100": 1500},
        gpus=2,
        remaining_gpu_seconds=10 * HOUR,
        window_seconds=HOUR,
        now=NOW,
    )
    assert (sight.rounds, sight.win_rate, sight.windows_needed) == (10, 0.3, 5)
    assert sight.eta == NOW + timedelta(hours=17)
    assert sight.eta_reason == ""


def test_no_eta_without_history_or_without_a_win():
    none = foresee(
        prices=[],
        values={"a100": 5000},
        gpus=1,
        remaining_gpu_seconds=HOUR,
        window_seconds=HOUR,
        now=NOW,
    )
    assert none.eta is None and none.win_rate is None
    assert "no price history" in none.eta_reason
    lost = foresee(
        prices=PRICES,
        values={"a100": 900},
        gpus=1,
        remaining_gpu_seconds=HOUR,
        window_seconds=HOUR,
        now=NOW,
    )
    assert lost.eta is None and lost.win_rate == 0
    assert "none of the last 10 rounds" in lost.eta_reason


def test_until_cancelled_and_finished_orders():
    forever = foresee(
        prices=PRICES,
        values={"a100": 5000},
        gpus=1,
        remaining_gpu_seconds=None,
        window_seconds=HOUR,
        now=NOW,
    )
    assert forever.eta is None and forever.eta_reason == "it runs until cancelled"
    assert forever.win_rate == 1.0
    done = foresee(
        prices=PRICES,
        values={"a100": 5000},
        gpus=1,
        remaining_gpu_seconds=0,
        window_seconds=HOUR,
        now=NOW,
    )
    assert (done.windows_needed, done.eta) == (0, NOW)


def test_needed_value_is_the_price_that_wins_enough_rounds_for_the_deadline():
    # 5 windows needed in the 10 before the deadline: half the rounds. Costs over a100 and
    # h100 sorted: 1.0 1.2 1.4 1.6 1.8 2.0 2.2 2.4 2.6 2.8 (h100 at 3.0 is never cheaper);
    # 5 of 10 rounds are won at 1.8 credits.
    sight = foresee(
        prices=PRICES,
        values={"a100": 1500, "h100": 1500},
        gpus=2,
        remaining_gpu_seconds=10 * HOUR,
        window_seconds=HOUR,
        now=NOW,
        deadline=NOW + timedelta(hours=10, minutes=30),
    )
    assert sight.needed_value == 1800
    assert sight.needed_reason == ""
    # 5 windows in 7: 10 x 5/7 = 7.14 -> 8 rounds of 10 -> 2.4 credits.
    tighter = foresee(
        prices=PRICES,
        values={"a100": 1500},
        gpus=2,
        remaining_gpu_seconds=10 * HOUR,
        window_seconds=HOUR,
        now=NOW,
        deadline=NOW + timedelta(hours=7),
    )
    assert tighter.needed_value == 2400


def test_needed_value_says_when_no_price_finishes_in_time():
    short = foresee(
        prices=PRICES,
        values={"a100": 1500},
        gpus=2,
        remaining_gpu_seconds=10 * HOUR,
        window_seconds=HOUR,
        now=NOW,
        deadline=NOW + timedelta(hours=4),
    )
    assert short.needed_value is None
    assert "cannot finish by then at any price" in short.needed_reason
    assert "needs 5 more window(s) and only 4 remain" in short.needed_reason
    # Only h100 acceptable: it cleared in 5 of 10 rounds, and 6 of 10 are needed.
    sparse = foresee(
        prices=PRICES,
        values={"h100": 4000},
        gpus=2,
        remaining_gpu_seconds=10 * HOUR,
        window_seconds=HOUR,
        now=NOW,
        deadline=NOW + timedelta(hours=8),
    )
    assert sparse.needed_value is None
    assert "cleared in only 5 of the last 10 rounds and it needs 7" in sparse.needed_reason


def test_foresee_refuses_a_zero_gang():
    with pytest.raises(ValueError):
        foresee(
            prices=PRICES,
            values={"a100": 1},
            gpus=0,
            remaining_gpu_seconds=1,
            window_seconds=HOUR,
            now=NOW,
        )
