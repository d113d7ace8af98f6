"""Demand forecast: the smoothing maths on synthetic series (no database), the history
selector on rounds settled through the market services, and the chart on the market page."""

from __future__ import annotations

import math
import re
from datetime import timedelta

import numpy as np
import pytest
from django.urls import reverse

from market.forecast import (
    BAND_Z,
    HOLT_WINTERS,
    MIN_ROUNDS,
    NONE,
    SIMPLE,
    demand_forecast,
    rounds_per_day,
)
from market.forecast_selectors import tier_demand_history
from market.models import Round
from market.services.bids import bid_cancel, bid_place
from market.services.rounds import round_open_next
from market.services.tick import round_process

# Pure maths -----------------------------------------------------------------------------


def _seasonal(n: int, *, m: int, level: float, amplitude: float, slope: float = 0.0):
    t = np.arange(n)
    return level + slope * t + amplitude * np.sin(2 * np.pi * t / m)


def test_a_noisy_seasonal_series_is_forecast_within_its_noise():
    m, n, horizon = 24, 96, 24
    noise = np.random.default_rng(7).normal(0.0, 1.0, n)
    history = _seasonal(n, m=m, level=40.0, amplitude=10.0) + noise
    forecast = demand_forecast(history, horizon=horizon, season_length=m)
    truth = _seasonal(n + horizon, m=m, level=40.0, amplitude=10.0)[n:]
    assert forecast.method == HOLT_WINTERS
    assert forecast.params["season_length"] == m
    # The noise has std 1: the forecast follows the daily shape (peak-to-trough 20 GPUs) to
    # within a few GPUs, the residual std estimates the noise, and the truth lies in the band.
    assert np.max(np.abs(np.array(forecast.mean) - truth)) < 2.5
    assert 0.7 < forecast.sigma < 1.4
    assert np.all(np.array(forecast.lower) <= truth)
    assert np.all(truth <= np.array(forecast.upper))


def test_an_exact_seasonal_series_with_a_trend_is_continued_exactly():
    m, n = 6, 30
    history = _seasonal(n, m=m, level=20.0, amplitude=5.0, slope=0.5)
    forecast = demand_forecast(history, horizon=m, season_length=m)
    truth = _seasonal(n + m, m=m, level=20.0, amplitude=5.0, slope=0.5)[n:]
    assert forecast.method == HOLT_WINTERS
    np.testing.assert_allclose(forecast.mean, truth, atol=1e-6)
    assert forecast.sigma < 1e-6


@pytest.mark.parametrize(("n", "method"), [(5, SIMPLE), (48, HOLT_WINTERS)])
def test_a_constant_series_forecasts_the_constant_with_no_band(n, method):
    forecast = demand_forecast([7] * n, horizon=5, season_length=24)
    assert forecast.method == method
    assert forecast.mean == (7.0,) * 5
    assert forecast.lower == forecast.mean == forecast.upper
    assert forecast.sigma == 0.0


@pytest.mark.parametrize("n", [0, 1, 2])
def test_fewer_than_three_rounds_give_no_forecast_and_say_why(n):
    forecast = demand_forecast([4.0] * n, horizon=3, season_length=24)
    assert n < MIN_ROUNDS
    assert forecast.method == NONE
    assert forecast.label == "no forecast"
    assert forecast.mean == forecast.lower == forecast.upper == ()
    assert forecast.params == {}
    assert f"needs at least {MIN_ROUNDS} settled rounds" in forecast.reason
    assert forecast.history == n


def test_shorter_than_two_seasons_falls_back_to_simple_smoothing():
    history = _seasonal(47, m=24, level=30.0, amplitude=8.0)
    forecast = demand_forecast(history, horizon=4, season_length=24)
    assert forecast.method == SIMPLE
    assert forecast.label == "simple exponential smoothing"
    assert set(forecast.params) == {"alpha"}
    assert "fewer than two seasons of 24" in forecast.reason
    # Simple smoothing forecasts a flat line at its last level.
    assert len(set(forecast.mean)) == 1
    # Two full seasons are enough for Holt-Winters.
    assert demand_forecast([*history, 30.0], horizon=4, season_length=24).method == HOLT_WINTERS


def test_a_season_of_one_round_is_simple_smoothing():
    forecast = demand_forecast([1.0, 2.0, 3.0, 4.0, 5.0], horizon=2, season_length=1)
    assert forecast.method == SIMPLE
    assert "season of 1 round" in forecast.reason


def test_simple_smoothing_band_is_the_residual_std_and_stays_non_negative():
    history = [0.0, 3.0, 0.0, 3.0, 0.0, 3.0]
    forecast = demand_forecast(history, horizon=2, season_length=24)
    alpha = forecast.params["alpha"]
    level, errors = history[0], []
    for value in history[1:]:
        errors.append(value - level)
        level += alpha * (value - level)
    sigma = math.sqrt(sum(e * e for e in errors) / len(errors))
    assert forecast.sigma == pytest.approx(sigma)
    assert forecast.mean[0] == pytest.approx(level)
    assert forecast.upper[0] == pytest.approx(level + BAND_Z * sigma)
    assert forecast.lower[0] == max(level - BAND_Z * sigma, 0.0) == 0.0


def test_the_grid_search_picks_the_least_squared_error_alpha():
    # A level shift: the forecast should follow it quickly, so the largest alpha wins.
    forecast = demand_forecast([0.0] * 5 + [10.0] * 5, horizon=1, season_length=24)
    assert forecast.params["alpha"] == 0.9


def test_the_forecast_is_deterministic():
    history = list(np.random.default_rng(3).poisson(12, 60).astype(float))
    first = demand_forecast(history, horizon=8, season_length=12)
    assert first == demand_forecast(list(history), horizon=8, season_length=12)
    assert first.method == HOLT_WINTERS


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"history": [1, 2, 3], "horizon": 0, "season_length": 2}, "horizon must be at least 1"),
        ({"history": [1, 2, 3], "horizon": 1, "season_length": 0}, "season length must be"),
        ({"history": [1, float("nan"), 3], "horizon": 1, "season_length": 2}, "finite"),
        ({"history": [[1, 2], [3, 4]], "horizon": 1, "season_length": 2}, "flat sequence"),
    ],
)
def test_bad_input_is_refused_with_what_to_fix(kwargs, message):
    history = kwargs.pop("history")
    with pytest.raises(ValueError, match=message):
        demand_forecast(history, **kwargs)


def test_rounds_per_day_is_the_season():
    assert rounds_per_day(60) == 24
    assert rounds_per_day(15) == 96
    assert rounds_per_day(7 * 24 * 60) == 1
    with pytest.raises(ValueError, match="at least 1 minute"):
        rounds_per_day(0)


# The history on the database ------------------------------------------------------------


def _settle(rnd: Round) -> Round:
    """Clear and settle ``rnd`` once its bidding has closed; return the round open next."""
    after = rnd.closes_at + timedelta(seconds=1)
    done = round_process(round_id=rnd.pk, now=after)
    assert done.status == Round.Status.SETTLED, done.failure_reason
    return round_open_next(now=after)


def _bid(team, rnd: Round, **terms):
    tenant, user = team
    return bid_place(
        user=user, tenant=tenant, round=rnd, now=rnd.closes_at - timedelta(minutes=1), **terms
    )


@pytest.mark.django_db
def test_history_splits_a_bid_over_its_accepted_tiers_in_settled_rounds(market, team, rival):
    first = market.round
    _bid(team, first, quantity=2, limits={"a100": 3000})
    # Accepts both tiers: its 3 GPUs split over them, 1.5 on each (as the supply/demand chart).
    _bid(rival, first, quantity=3, limits={"a100": 3000, "h100": 4000})
    cancelled = _bid(team, first, quantity=5, limits={"h100": 5000})
    bid_cancel(user=team[1], tenant=team[0], bid_id=cancelled.pk, now=first.opens_at)
    second = _settle(first)
    third = _settle(second)  # nobody bid: demand 0, still a round of history
    _bid(team, third, quantity=1, limits={"a100": 2000})  # open round: not history yet

    history = tier_demand_history(rounds=10)
    first.refresh_from_db()
    second.refresh_from_db()
    assert sorted(history) == ["a100", "h100"]
    a100, h100 = history["a100"], history["h100"]
    assert a100.rounds == h100.rounds == [first.pk, second.pk]
    assert a100.starts_at == [first.starts_at, second.starts_at]
    assert a100.demand == [3.5, 0]
    assert h100.demand == [1.5, 0]
    assert a100.capacity == [4, 4] and h100.capacity == [2, 2]
    assert a100.price[0] == first.prices["a100"] and h100.price[0] == first.prices["h100"]
    # Only the last ``rounds`` rounds, and only the tiers asked for.
    assert tier_demand_history(tier_slugs=["h100"], rounds=1) == {
        "h100": type(h100)(
            tier="h100",
            rounds=[second.pk],
            starts_at=[second.starts_at],
            demand=[0],
            capacity=[2],
            price=[second.prices["h100"]],
        )
    }


@pytest.mark.django_db
def test_history_refuses_a_window_of_no_rounds():
    with pytest.raises(ValueError, match="rounds must be at least 1"):
        tier_demand_history(rounds=0)


# The market page ------------------------------------------------------------------------


@pytest.mark.django_db
def test_market_page_says_there_are_not_enough_rounds_yet(client, market, team):
    _settle(market.round)
    client.force_login(team[1])
    page = client.get(reverse("market_overview")).content.decode()
    assert "Demand forecast" in page
    assert "Not enough rounds yet for a demand forecast" in page
    assert "at least 3 settled rounds and there is 1." in page
    assert 'id="demand-forecast-0"' not in page


@pytest.mark.django_db
def test_market_page_shows_a_forecast_chart_per_tier_once_there_is_history(client, market, team):
    rnd = market.round
    for quantity in (1, 3, 2, 4):
        _bid(team, rnd, quantity=quantity, limits={"a100": 3000})
        rnd = _settle(rnd)
    client.force_login(team[1])
    page = client.get(reverse("market_overview")).content.decode()
    assert "Not enough rounds yet" not in page
    for i in range(2):  # a100 and h100
        assert f'id="demand-forecast-{i}"' in page
    assert '"name":"Forecast"' in page
    assert "Demand forecast \\u2014 a100" in page  # the title, JSON-escaped by plotly
    # 4 rounds are fewer than two days of hourly rounds: the page says which method it used,
    # folded under a plain summary so the parameters do not greet every reader.
    assert re.search(
        r"<summary[^>]*>a100: how this forecast is made</summary>"
        r"<p[^>]*>simple exponential smoothing \(α",
        page,
    )
    assert "last 4 settled rounds" in page
