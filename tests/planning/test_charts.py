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
