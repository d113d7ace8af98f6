"""Chart data: the fleet heatmap fitted to the minutes with data; price history with
readable dates and prices from zero."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from market.charts import price_history
from telemetry.charts import MIN_MINUTES, gpu_heatmap

T = datetime(2026, 11, 24, 9, 0, tzinfo=UTC)


def test_the_heatmap_starts_at_the_first_minute_any_gpu_reported():
    minutes = [T + timedelta(minutes=i) for i in range(61)]
    values = [[None] * 45 + [50.0] * 16, [None] * 50 + [20.0] * 11]
    fig = gpu_heatmap(gpus=["n/0", "n/1"], minutes=minutes, values=values)
    heat = fig.data[0]
    assert list(heat.x)[0] == minutes[45] and len(heat.x) == 16
    assert heat.z[0][0] == 50.0 and heat.z[1][0] is None


def test_the_heatmap_keeps_a_minimum_window_and_a_silent_fleet_keeps_its_last_minutes():
    minutes = [T + timedelta(minutes=i) for i in range(61)]
    late = gpu_heatmap(gpus=["n/0"], minutes=minutes, values=[[None] * 58 + [1.0] * 3])
    assert len(late.data[0].x) == MIN_MINUTES
    silent = gpu_heatmap(gpus=["n/0"], minutes=minutes, values=[[None] * 61])
    assert len(silent.data[0].x) == MIN_MINUTES


def test_price_history_reads_as_dates_and_starts_at_zero():
    fig = price_history({"a100": [(T, 3100), (T + timedelta(hours=1), 3150)]})
    assert fig.layout.xaxis.type == "date" and "%H:%M" in fig.layout.xaxis.tickformat
    assert fig.layout.yaxis.rangemode == "tozero"
    assert list(fig.data[0].y) == [3.1, 3.15]


def test_a_new_allocations_chart_spans_its_window_in_hours_and_minutes():
    from telemetry.charts import utilisation_lines

    start = datetime(2026, 11, 18, 10, 0, tzinfo=UTC)
    # Two samples a few seconds apart: alone they would give the axis millisecond ticks.
    series = {"gpu0": [(start, 40.0), (start + timedelta(seconds=3), 55.0)]}
    fig = utilisation_lines(series, window=(start, start + timedelta(hours=1)))
    assert fig.layout.xaxis.tickformat == "%H:%M"
    assert list(fig.layout.xaxis.range) == [start, start + timedelta(hours=1)]
