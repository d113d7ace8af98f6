"""The planning figures read like the market's: one axis per quantity, a legend entry per tier."""

from __future__ import annotations

from planning.charts import price_wait


def _weeks(price: int, wait: float | None) -> list[dict]:
    return [{"week": w, "price": price, "wait_rounds": wait} for w in (1, 2)]


def test_price_and_wait_have_an_axis_each_and_one_legend_entry_per_tier():
    tiers = {
        slug: {"weeks_before": _weeks(2_000, 1.5), "weeks_after": _weeks(1_500, None)}
        for slug in ("a100", "h100", "l40s")
    }
    fig = price_wait(tiers)
    legend = [t.name for t in fig.data if t.showlegend is not False]
    assert legend == ["a100", "h100", "l40s"]
    assert fig.layout.yaxis.title.text == "Credits per GPU-hour"
    assert fig.layout.yaxis2.title.text == "Wait (rounds)"
    assert fig.layout.yaxis2.overlaying is None  # its own panel, not a second scale on one
    # Whole weeks on the time axis, named as the tables name them.
    assert fig.layout.xaxis2.dtick == 1 and fig.layout.xaxis2.tickprefix == "week "
    assert list(fig.layout.xaxis2.range) == [0.5, 2.5]  # weeks 1 and 2, no "week 0"
    assert fig.layout.template.layout.plot_bgcolor == "white"  # plotly_white, as the others
    # Prices in credits; "never" waits are gaps, not zeros.
    a100_now = next(t for t in fig.data if t.legendgroup == "a100" and t.line.dash == "dot")
    assert list(a100_now.y) == [2.0, 2.0]
    a100_wait = [t for t in fig.data if t.legendgroup == "a100" and t.yaxis == "y2"]
    assert any(list(t.y) == [None, None] for t in a100_wait)


def test_the_forecast_chart_draws_p50_with_its_p10_to_p90_band_per_tier():
    from planning.charts import demand_forecast

    series = {
        slug: {"starts": ["2026-12-01T00:00:00+00:00", "2026-12-01T01:00:00+00:00"],
               "p10": [1.0, 2.0], "p50": [3.0, 4.0], "p90": [6.0, 8.0]}
        for slug in ("a100", "h100")
    }  # fmt: skip
    fig = demand_forecast(series)
    assert [t.name for t in fig.data if t.showlegend is not False] == ["a100", "h100"]
    band = next(t for t in fig.data if t.name == "a100 P10-P90")
    low = next(t for t in fig.data if t.name == "a100 P10")
    # The band fills down to the P10 line drawn just before it, so it spans P10 to P90.
    assert band.fill == "tonexty" and list(fig.data).index(band) == list(fig.data).index(low) + 1
    assert list(low.y) == [1.0, 2.0] and list(band.y) == [6.0, 8.0]
    assert list(next(t for t in fig.data if t.name == "h100").y) == [3.0, 4.0]
