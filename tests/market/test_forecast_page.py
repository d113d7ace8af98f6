"""The demand forecast on the market page: the history selector on rounds settled through
the market services, the forecast kept in the cache, and the chart with how it was made (the
forecast's maths is tested in tests/market/test_forecast.py)."""

from __future__ import annotations

import re
from datetime import timedelta

import pytest
from django.core.cache import cache
from django.urls import reverse
from redis import RedisError

import market.forecast_selectors as selectors
from market.forecast import SEASONAL_NAIVE
from market.forecast_selectors import tier_demand_history, tier_forecast
from market.models import Round
from market.services.bids import bid_cancel, bid_place
from market.services.rounds import round_open_next
from market.services.tick import round_process
from tenants.ledger import MILLI, credits_grant
from tests.market.marketkit import market_make

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


# The forecast, once per history ------------------------------------------------------


def test_a_history_is_forecast_once_and_a_new_round_forecasts_again(monkeypatch):
    cache.clear()
    calls = []
    real = selectors.demand_forecast

    def counted(history, **kwargs):
        calls.append(len(history))
        return real(history, **kwargs)

    monkeypatch.setattr(selectors, "demand_forecast", counted)
    history = [float(i % 5) for i in range(30)]
    first = tier_forecast(history, horizon=6, rounds_per_day=8)
    assert tier_forecast(list(history), horizon=6, rounds_per_day=8) == first
    assert calls == [30]
    # A round settled is a new history; another horizon is another forecast.
    tier_forecast([*history, 2.0], horizon=6, rounds_per_day=8)
    tier_forecast(history, horizon=7, rounds_per_day=8)
    assert calls == [30, 31, 30]


def test_the_forecast_is_still_made_when_the_cache_is_down(monkeypatch):
    def down(*args, **kwargs):
        raise RedisError("connection refused")

    monkeypatch.setattr(cache, "get", down)
    monkeypatch.setattr(cache, "set", down)
    forecast = tier_forecast([1.0, 2.0, 3.0, 4.0], horizon=3, rounds_per_day=2)
    assert forecast.model == SEASONAL_NAIVE and len(forecast.p50) == 3


# The market page ------------------------------------------------------------------------


@pytest.mark.django_db
def test_market_page_says_a_day_of_rounds_is_needed_first(client, market, team):
    _settle(market.round)
    client.force_login(team[1])
    page = client.get(reverse("market_overview")).content.decode()
    assert "Demand forecast" in page
    # Hourly rounds: a day is 24 of them.
    assert "Not enough rounds yet for a demand forecast" in page
    assert "it needs a day of settled rounds (24) and there is 1." in page
    assert 'id="demand-forecast-0"' not in page


@pytest.mark.django_db
def test_market_page_shows_each_tiers_forecast_its_check_and_its_band(client, team):
    # Rounds of a day: the 1-day check needs three of them.
    market = market_make(round_minutes=24 * 60)
    credits_grant(tenant=team[0], amount=10_000 * MILLI, actor=market.admin, reason="test")
    rnd = market.round
    for quantity in (1, 3, 2, 1, 3, 2, 1, 3, 2, 2):
        _bid(team, rnd, quantity=quantity, limits={"a100": 3000})
        rnd = _settle(rnd)
    client.force_login(team[1])
    page = client.get(reverse("market_overview")).content.decode()
    assert "Not enough rounds yet" not in page
    for i in range(2):  # a100 and h100
        assert f'id="demand-forecast-{i}"' in page
    assert '"name":"Forecast"' in page
    assert "Likely range (80 % of rounds, P10 to P90)" in page
    # The title; plotly's JSON escapes the dash or not, by the JSON library it finds.
    assert re.search(r"Demand forecast (—|\\u2014) a100", page)
    # 10 rounds, the last 4 shown (four days), and 6 ahead (a day is 1, at least 6).
    assert "over the last 4 settled rounds and the forecast for the next 6" in page
    # How it was made, folded under a plain summary: the model chosen, the check against
    # the seasonal-naive rule a day ahead, and what the band is.
    method = re.search(
        r"<summary[^>]*>a100: how this forecast is made</summary><p[^>]*>(.*?)</p>", page
    )
    assert method, page
    text = method.group(1)
    assert (
        "fitted on the last 10 rounds (no season yet: a daily one needs two days of rounds, a weekly one two weeks)"
        in text
    )
    assert re.search(r"1 day ahead: [0-9.]+ % weighted error \(seasonal naive [0-9.]+ %\)", text)
    assert "10th and 90th percentiles of its errors in that check." in text
    # Nobody bid on h100: checked, but only on rounds without demand.
    h100 = re.search(r"h100: how this forecast is made</summary><p[^>]*>(.*?)</p>", page)
    assert "checked only on rounds nobody bid in" in h100.group(1)


@pytest.mark.django_db
def test_market_page_before_a_check_says_it_copies_the_day_before(client, team):
    rnd = market_make(round_minutes=8 * 60).round
    for quantity in (1, 3, 2, 2):
        _bid(team, rnd, quantity=quantity, limits={"a100": 3000})
        rnd = _settle(rnd)
    client.force_login(team[1])
    page = client.get(reverse("market_overview")).content.decode()
    text = re.search(r"a100: how this forecast is made</summary><p[^>]*>(.*?)</p>", page).group(1)
    assert text.startswith("seasonal naive, fitted on the last 4 rounds")
    assert "no such check yet (it needs three days of rounds)" in text
    assert "(until then, of the changes within the history)" in text


@pytest.mark.django_db
def test_a_settlement_has_a_worker_make_the_forecast_so_the_page_fits_nothing(
    client, team, monkeypatch, sent_tasks
):
    # The fits take about a second a tier: the first reader after a round settled waited
    # for them. A tick that settles a round asks a worker for them by name; once it has
    # made them, the page only reads them.
    import market.services.tick as tick
    from market.tasks import demand_forecast_warm_task

    cache.clear()
    market = market_make(round_minutes=24 * 60)
    credits_grant(tenant=team[0], amount=10_000 * MILLI, actor=market.admin, reason="test")
    rnd = market.round
    for quantity in (1, 3, 2, 1):
        _bid(team, rnd, quantity=quantity, limits={"a100": 3000})
        rnd = _settle(rnd)
    _bid(team, rnd, quantity=2, limits={"a100": 3000})
    tick.rounds_tick(now=rnd.closes_at + timedelta(seconds=1))
    assert sent_tasks.of("market.demand_forecast_warm") == [[]]
    assert demand_forecast_warm_task() == 2  # a100 and h100
    calls = []
    real = selectors.demand_forecast
    monkeypatch.setattr(
        selectors, "demand_forecast", lambda *a, **kw: calls.append(1) or real(*a, **kw)
    )
    client.force_login(team[1])
    page = client.get(reverse("market_overview")).content.decode()
    assert 'id="demand-forecast-1"' in page
    assert calls == []
