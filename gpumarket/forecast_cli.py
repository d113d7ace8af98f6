"""``gpumarket forecast --history HISTORY.csv --horizon HOURS --out FORECAST.csv``: forecast
hourly demand per tier from a CSV history, with the forecast planning uses (the backtest picks
the model per tier), so a forecast can be checked on data that never entered the platform.
Needs no Django. The file formats are in planning/forecast_csv.py and docs/planning.md.

The output starts at the hour after the history's last (the latest over all tiers) and has
one row per tier and hour. What was filled and which model each tier got, with its backtest
WAPE beside the seasonal-naive rule's, goes to standard error.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import replace
from pathlib import Path

from market.forecast import DemandForecast, demand_forecast
from planning.forecast_csv import HOUR, HistoryError, forecast_write, gaps_report, history_read

MAX_HORIZON = 26 * 7 * 24


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="gpumarket forecast",
        description="Forecast hourly GPU-hours per tier (P10/P50/P90) from a CSV history "
        "with the columns timestamp,tier,gpu_hours.",
    )
    parser.add_argument("--history", required=True, help="CSV: timestamp,tier,gpu_hours")
    parser.add_argument("--horizon", required=True, type=int, help="hours to forecast")
    parser.add_argument("--out", required=True, help="CSV to write (- for standard output)")
    parser.add_argument(
        "--no-intervals", action="store_true", help="leave out the p10 and p90 columns"
    )
    return parser


def _score_line(tier: str, forecast: DemandForecast) -> str:
    parts = [
        f"{mine.horizon} WAPE {mine.wape_pct:.1f} % (seasonal naive {base.wape_pct:.1f} %)"
        for mine, base in forecast.beside_baseline()
    ]
    scored = "; ".join(parts) or "no backtest (history too short)"
    return f"{tier}: {forecast.label}; {scored}"


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if not 1 <= args.horizon <= MAX_HORIZON:
        sys.stderr.write(f"--horizon: a whole number of hours from 1 to {MAX_HORIZON}\n")
        return 2
    try:
        text = Path(args.history).read_text(encoding="utf-8")
    except OSError as exc:
        sys.stderr.write(f"--history: cannot read {args.history}: {exc.strerror}\n")
        return 2
    try:
        series = history_read(text)
    except HistoryError as exc:
        sys.stderr.write(f"{args.history}: {exc}\n")
        return 1
    first = max(s.end for s in series.values()) + HOUR
    forecasts = {}
    for tier, s in series.items():
        # A tier whose history stops early is forecast up to the common start, then on.
        behind = int((first - HOUR - s.end) / HOUR)
        forecast = demand_forecast(s.values, horizon=behind + args.horizon, rounds_per_day=24)
        forecasts[tier] = (first, _tail(forecast, args.horizon))
        sys.stderr.write(_score_line(tier, forecast) + "\n")
        if forecast.warning:
            sys.stderr.write(f"{tier}: warning: {forecast.warning}\n")
    for line in gaps_report(series.values()):
        sys.stderr.write(line + "\n")
    body = forecast_write(forecasts, intervals=not args.no_intervals)
    if args.out == "-":
        sys.stdout.write(body)
    else:
        Path(args.out).write_text(body, encoding="utf-8")
    return 0


def _tail(forecast: DemandForecast, hours: int) -> DemandForecast:
    return replace(
        forecast, p10=forecast.p10[-hours:], p50=forecast.p50[-hours:], p90=forecast.p90[-hours:]
    )
