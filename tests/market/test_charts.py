"""Market charts drawn from plain data: each cap against the spend of its own period, axes that
fit tiny and large amounts."""

from __future__ import annotations

from datetime import date, timedelta

import pytest

from market.charts import SpendPeriod, spend_over_time, supply_demand

NOV = [date(2026, 11, 1) + timedelta(days=i) for i in range(25)]  # Sun 1 .. Wed 25
WEEK = date(2026, 11, 23)  # Monday


def _trace(fig, prefix):
    found = [t for t in fig.data if t.name.startswith(prefix)]
    assert len(found) == 1, [t.name for t in fig.data]
    return found[0]


def test_a_week_cap_is_drawn_against_week_to_date_spend_not_month_to_date():
    fig = spend_over_time(
        days=NOV,
        daily=[1_000] * 25,  # 1 credit a day
        periods=[
            SpendPeriod(label="This month", cap_label="Monthly cap", start=NOV[0], cap=40_000),
            SpendPeriod(label="This week", cap_label="Weekly cap", start=WEEK, cap=5_000),
        ],
    )
    month, week = _trace(fig, "This month"), _trace(fig, "This week")
    assert list(month.y) == [float(i) for i in range(1, 26)]
    assert list(week.x) == [WEEK, WEEK + timedelta(days=1), WEEK + timedelta(days=2)]
    assert list(week.y) == [1.0, 2.0, 3.0]  # 3 of the week's 5, not 25 of the month's
    cap = _trace(fig, "Weekly cap 5")
    assert list(cap.x) == [WEEK, NOV[-1]] and list(cap.y) == [5.0, 5.0]
    assert list(_trace(fig, "Monthly cap 40").x) == [NOV[0], NOV[-1]]


def test_a_cap_far_above_the_spend_does_not_squash_it_and_is_still_named():
    fig = spend_over_time(
        days=NOV[:3],
        daily=[2, 3, 1],  # milli-credits
        periods=[
            SpendPeriod(label="This month", cap_label="Monthly cap", start=NOV[0], cap=10**9),
        ],
        daily_cap=4,
    )
    far = _trace(fig, "Monthly cap 1e+06")
    assert far.visible == "legendonly" and "far above" in far.name
    assert _trace(fig, "Daily cap").visible in (None, True)  # near the spend: drawn
    assert fig.layout.yaxis.range is None or fig.layout.yaxis.range[1] < 1  # fitted to spend


def test_supply_and_demand_at_tiny_prices_fill_the_chart():
    fig = supply_demand(tier="a100", bids=[(3, 2), (2, 1)], capacity=4, reserve=1, price=2)
    assert fig.layout.yaxis.range[1] == pytest.approx(0.003 * 1.15)


def test_supply_and_demand_at_large_prices_are_not_clipped():
    fig = supply_demand(tier="a100", bids=[(9 * 10**9, 2)], capacity=4, reserve=10**6, price=None)
    axis = fig.layout.yaxis
    top = 10 ** axis.range[1] if axis.type == "log" else axis.range[1]
    assert top >= 9 * 10**6


def test_the_demand_forecast_reads_as_dates_and_names_its_band_without_jargon():
    from datetime import UTC, datetime

    from market.charts import demand_forecast
    from market.forecast import SEASONAL_NAIVE, DemandForecast

    at = [datetime(2026, 11, 24, h, tzinfo=UTC) for h in range(4)]
    fig = demand_forecast(
        tier="a100",
        at=at,
        demand=[1, 3, 2, 4],
        capacity=[4, 4, 4, 4],
        price=[3000, 3100, None, 3200],
        future_at=[datetime(2026, 11, 24, 4, tzinfo=UTC)],
        forecast=DemandForecast(
            model=SEASONAL_NAIVE, season="none", p10=(1.0,), p50=(3.0,), p90=(5.0,)
        ),
        offered=4,
    )
    assert fig.layout.xaxis.type == "date" and "%H:%M" in fig.layout.xaxis.tickformat
    names = [t.name for t in fig.data if t.showlegend is not False]
    assert "Likely range (80 % of rounds, P10 to P90)" in names
    band = {t.name: list(t.y) for t in fig.data}
    # Each line starts at the last demand, so the forecast continues the history.
    assert band["Band upper"] == [4.0, 5.0] and band["Forecast"] == [4.0, 3.0]
    assert band["Likely range (80 % of rounds, P10 to P90)"] == [4.0, 1.0]
    assert not any("σ" in n or "sigma" in n for n in names)


def test_one_bid_far_above_the_rest_turns_supply_and_demand_to_a_log_axis_that_clips_nothing():
    import math

    fig = supply_demand(
        tier="a100",
        bids=[(10**9, 1), (3_000, 2), (2_500, 1)],  # one limit of a million credits
        capacity=4,
        reserve=2_000,
        price=3_000,
    )
    axis = fig.layout.yaxis
    assert axis.type == "log" and "log scale" in axis.title.text
    low, high = axis.range  # log10 of credits
    assert low <= math.log10(2.0) and high >= math.log10(1e6)  # reserve to the highest limit
    assert all(y > 0 for trace in fig.data for y in trace.y)  # nothing lost off a log axis


def test_bids_of_like_prices_keep_a_linear_axis_from_zero():
    fig = supply_demand(
        tier="a100", bids=[(3_000, 2), (2_500, 1)], capacity=4, reserve=0, price=2_500
    )
    assert fig.layout.yaxis.type in (None, "linear") and fig.layout.yaxis.range[0] == 0


def test_the_forecast_chart_gives_the_history_half_the_width_and_the_price_headroom():
    from datetime import UTC, datetime, timedelta

    from market.charts import demand_forecast
    from market.forecast import SEASONAL_NAIVE, DemandForecast

    at = [datetime(2026, 11, 24, h, tzinfo=UTC) for h in range(3)]
    future = [at[-1] + timedelta(hours=k) for k in range(1, 25)]  # a day ahead
    fig = demand_forecast(
        tier="a100",
        at=at,
        demand=[1, 3, 2],
        capacity=[4, 4, 4],
        price=[3000, 3000, 3000],
        future_at=future,
        forecast=DemandForecast(
            model=SEASONAL_NAIVE,
            season="none",
            p10=(1.0,) * 24,
            p50=(2.0,) * 24,
            p90=(3.0,) * 24,
        ),
        offered=4,
    )
    # The axis shows as many forecast rounds as there are rounds of history (pan for more).
    assert list(fig.layout.xaxis.range) == [at[0], future[2]]
    # A steady price sits below the top edge, not on it.
    assert list(fig.layout.yaxis2.range) == [0, 4.5]
