"""The demand forecast (market page, planning, ``gpumarket forecast``): statsmodels
candidates picked by a rolling-origin backtest, with P10/P50/P90, on series whose answer is
known."""

from __future__ import annotations

import numpy as np
import pytest

from market.forecast import (
    COMBINED,
    ETS,
    MODELS,
    MSTL,
    SEASONAL_NAIVE,
    Score,
    backtest_scores,
    choose_model,
    demand_forecast,
    model_forecast,
    rounds_per_day,
)

DAY, WEEK = 24, 168


def weekly_pattern(weeks: int) -> np.ndarray:
    """Weekdays 20 GPUs from 08:00 to 18:00 and 8 otherwise; weekends 3."""
    t = np.arange(weeks * WEEK)
    weekday = (t // DAY) % 7 < 5
    office = (t % DAY >= 8) & (t % DAY < 18)
    return np.where(weekday, np.where(office, 20.0, 8.0), 3.0)


def growing(weeks: int, *, seed: int = 3) -> np.ndarray:
    """A tier that triples over the history, with the weekly pattern on top and noise."""
    t = np.arange(weeks * WEEK)
    rng = np.random.default_rng(seed)
    return np.maximum(5 + 10 * t / len(t) + weekly_pattern(weeks) + rng.normal(0, 1.5, len(t)), 0)


def test_the_backtest_scores_each_origin_on_rounds_its_fit_never_saw():
    # A pattern that repeats every week: the seasonal-naive rule is exact at every origin.
    history = weekly_pattern(5)
    exact = {s.horizon: s for s in backtest_scores(history, rounds_per_day=DAY,
                                                   models=[SEASONAL_NAIVE])}  # fmt: skip
    assert exact["1 day"].wape_pct == 0 and exact["1 week"].wape_pct == 0
    assert exact["1 day"].origins == 3 and "4 weeks" not in exact  # needs eight weeks
    # Change only the last day: the fit from the origin a day before is the same, so the
    # 1-day error is exactly 7 GPUs in each of the last 24 rounds, over the 3 days scored.
    changed = history.copy()
    changed[-DAY:] += 7
    moved = {s.horizon: s for s in backtest_scores(changed, rounds_per_day=DAY,
                                                   models=[SEASONAL_NAIVE])}  # fmt: skip
    scored_days = [changed[-DAY:], history[-8 * DAY : -7 * DAY], history[-15 * DAY : -14 * DAY]]
    assert moved["1 day"].wape_pct == pytest.approx(
        100 * 7 * DAY / sum(float(d.sum()) for d in scored_days)
    )


def test_weekends_are_seen_and_the_exact_weekly_rule_is_kept_on_a_tie():
    history = weekly_pattern(3)
    forecast = demand_forecast(history, horizon=WEEK, rounds_per_day=DAY)
    # The history ends on a Sunday night; the next week starts on Monday like the first.
    assert forecast.p50 == pytest.approx(tuple(weekly_pattern(1)), abs=1e-6)
    saturday_noon = 5 * DAY + 12
    assert forecast.p50[saturday_noon] == pytest.approx(3.0, abs=1e-6)
    assert forecast.model == SEASONAL_NAIVE and forecast.season == "weekly"


def test_a_growing_tier_is_forecast_near_its_next_two_weeks():
    series = growing(14)
    history, truth = series[: 12 * WEEK], series[12 * WEEK :]
    forecast = demand_forecast(history, horizon=2 * WEEK, rounds_per_day=DAY)
    assert forecast.model in (ETS, MSTL, COMBINED)  # the trend beats last week's copy
    for week in (0, 1):
        span = slice(week * WEEK, (week + 1) * WEEK)
        assert sum(forecast.p50[span]) == pytest.approx(float(truth[span].sum()), rel=0.1)
    chosen = forecast.score(forecast.model, "4 weeks")
    naive = forecast.score(SEASONAL_NAIVE, "4 weeks")
    assert chosen.origins == 3 and chosen.wape_pct < naive.wape_pct
    assert chosen.mase is not None and naive.mase is not None
    # The band: ordered, and about four in five of the next fortnight's hours inside it.
    low, mid, high = (np.asarray(q) for q in (forecast.p10, forecast.p50, forecast.p90))
    assert np.all(low <= mid) and np.all(mid <= high) and np.all(low >= 0)
    inside = float(np.mean((truth >= low) & (truth <= high)))
    assert 0.6 <= inside <= 0.97


@pytest.mark.parametrize(
    ("rounds", "words"),
    [
        (0, "no demand history"),
        (3 * DAY, "only 3.0 days of history: a weekly pattern needs two weeks"),
        (20 * DAY, "the 4-week backtest needs eight weeks"),
        (50 * DAY, "the 4-week backtest needs eight weeks (four to fit, four to score)"),
    ],
)
def test_short_history_gives_a_warning_not_a_silent_answer(rounds, words):
    forecast = demand_forecast(weekly_pattern(3)[:rounds], horizon=WEEK, rounds_per_day=DAY)
    assert words in forecast.warning
    assert len(forecast.p50) == len(forecast.p10) == len(forecast.p90) == WEEK
    if rounds == 0:
        assert forecast.p50 == (0.0,) * WEEK and forecast.model == ""


def test_every_candidate_forecasts_the_horizon_asked_for():
    history = growing(3)
    for model in MODELS:
        ahead = model_forecast(model, history, horizon=30, day=DAY)
        assert ahead.shape == (30,) and np.all(np.isfinite(ahead))
    with pytest.raises(ValueError, match="unknown forecast model"):
        model_forecast("prophet", history, horizon=3, day=DAY)
    with pytest.raises(ValueError, match="horizon must be at least 1"):
        demand_forecast(history, horizon=0, rounds_per_day=DAY)


def test_a_four_week_origin_has_four_weeks_of_history_behind_it():
    # Fitted on two or three weeks, a weekly model's 4-week score says little about its fit
    # on the whole history: 9 weeks leave two such origins (weeks 5 and 6), 7 weeks none.
    nine = {s.horizon: s for s in backtest_scores(weekly_pattern(9), rounds_per_day=DAY,
                                                  models=[SEASONAL_NAIVE])}  # fmt: skip
    assert nine["4 weeks"].origins == 2 and nine["1 week"].origins == 3
    seven = {s.horizon for s in backtest_scores(weekly_pattern(7), rounds_per_day=DAY,
                                                models=[SEASONAL_NAIVE])}  # fmt: skip
    assert seven == {"1 day", "1 week"}


def test_the_combination_is_the_mean_of_the_three_fitted_forecasts():
    history = growing(3)
    members = [np.maximum(model_forecast(m, history, horizon=50, day=DAY), 0) for m in
               (SEASONAL_NAIVE, ETS, MSTL)]  # fmt: skip
    combined = model_forecast(COMBINED, history, horizon=50, day=DAY)
    assert combined == pytest.approx(np.mean(members, axis=0))
    # Scored like any candidate, from the same fits.
    scores = {(s.model, s.horizon): s for s in backtest_scores(history, rounds_per_day=DAY)}
    assert scores[COMBINED, "1 week"].origins == scores[ETS, "1 week"].origins == 1


def _scores(table: dict[str, dict[str, float]]) -> list[Score]:
    return [
        Score(model=m, horizon=h, rounds=0, origins=3, wape_pct=w, mase=None)
        for m, by_horizon in table.items()
        for h, w in by_horizon.items()
    ]


def test_the_choice_is_made_at_the_horizons_plans_use():
    # ETS follows the last hours best (1 day) but MSTL is better a week and four weeks out:
    # a plan looks weeks ahead, so MSTL is chosen, though ETS has the least mean over all three.
    table = {
        SEASONAL_NAIVE: {"1 day": 30.0, "1 week": 12.0, "4 weeks": 16.0},
        ETS: {"1 day": 5.0, "1 week": 11.0, "4 weeks": 15.0},
        MSTL: {"1 day": 20.0, "1 week": 10.0, "4 weeks": 14.0},
    }
    assert choose_model(_scores(table)) == MSTL
    # A horizon not scored for every candidate is left out; the 1 day decides only alone.
    del table[MSTL]["4 weeks"]
    assert choose_model(_scores(table)) == MSTL
    for by_horizon in table.values():
        by_horizon.pop("1 week"), by_horizon.pop("4 weeks", None)
    assert choose_model(_scores(table)) == ETS
    # A tie goes to the simpler; nothing scored: the seasonal-naive rule.
    tie = {ETS: {"1 week": 9.0}, SEASONAL_NAIVE: {"1 week": 9.0}}
    assert choose_model(_scores(tie)) == SEASONAL_NAIVE
    assert choose_model([]) == SEASONAL_NAIVE


def test_shorter_than_a_day_the_seasonal_naive_rule_repeats_the_last_round():
    # Five hourly rounds are not a day: there is no "same round a day earlier" to copy, and
    # repeating the five as if they were a season would invent a 5-hour cycle.
    history = [1.0, 2.0, 3.0, 4.0, 5.0]
    ahead = model_forecast(SEASONAL_NAIVE, history, horizon=7, day=DAY)
    assert ahead.tolist() == [5.0] * 7
    assert demand_forecast(history, horizon=7, rounds_per_day=DAY).p50 == (5.0,) * 7


def test_the_chosen_model_is_shown_beside_the_seasonal_naive_rule_at_each_scored_horizon():
    forecast = demand_forecast(growing(5), horizon=DAY, rounds_per_day=DAY)
    pairs = forecast.beside_baseline()
    assert [mine.horizon for mine, _ in pairs] == ["1 day", "1 week"]  # 4 weeks needs eight
    for mine, base in pairs:
        assert mine.model == forecast.model and base.model == SEASONAL_NAIVE
        assert mine == forecast.score(forecast.model, mine.horizon)
    assert demand_forecast([3.0] * 10, horizon=2, rounds_per_day=DAY).beside_baseline() == []


def test_rounds_per_day_is_the_daily_season():
    assert rounds_per_day(60) == 24
    assert rounds_per_day(15) == 96
    assert rounds_per_day(7 * 24 * 60) == 1
    with pytest.raises(ValueError, match="at least 1 minute"):
        rounds_per_day(0)


@pytest.mark.parametrize(("day", "rounds"), [(3, 6), (3, 11), (2, 10), (1, 14), (1, 15)])
def test_a_season_too_short_to_start_ets_gives_the_damped_trend_not_an_error(day, rounds):
    # statsmodels starts a seasonal ETS from at least 10 + 2 * (period // 2) rounds; with long
    # rounds (a day of 3 eight-hour rounds, a week of 7 daily ones) a history can have two
    # seasons and fewer rounds than that, at the backtest's first origins or on the page.
    history = np.random.default_rng(rounds).poisson(4, rounds).astype(float)
    ahead = model_forecast(ETS, history, horizon=5, day=day)
    damped = model_forecast(ETS, history, horizon=5, day=rounds)  # a day too long to see
    assert ahead == pytest.approx(damped)
    forecast = demand_forecast(history, horizon=5, rounds_per_day=day)
    assert len(forecast.p50) == 5 and all(np.isfinite(forecast.p50))
