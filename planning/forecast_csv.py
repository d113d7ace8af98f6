"""Hourly demand as CSV for ``gpumarket forecast``: read and check a history, write a forecast.
Pure, no Django.

Both files have the columns ``timestamp,tier,gpu_hours``: one row per tier and hour, the
timestamp ISO-8601 with its UTC offset (``2026-11-02T13:00:00+00:00``) on the hour, the
GPU-hours used in that hour a finite number >= 0. The forecast adds ``p10`` and ``p90``
beside the P50 in ``gpu_hours``. A bad row is refused with its line number; an hour missing
inside a tier's history is filled with the same hour one week (else one day) earlier, or 0,
and reported.
"""

from __future__ import annotations

import csv
import io
import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from market.forecast import DemandForecast

COLUMNS = ("timestamp", "tier", "gpu_hours")
HOUR = timedelta(hours=1)
MAX_HOURS = 5 * 365 * 24


class HistoryError(ValueError):
    """The history file cannot be read; the message names the line and the field."""


@dataclass
class TierSeries:
    """One tier's hourly history from ``start``: ``values[i]`` is the hour start + i."""

    tier: str
    start: datetime
    values: list[float]
    filled: list[datetime] = field(default_factory=list)

    @property
    def end(self) -> datetime:
        return self.start + (len(self.values) - 1) * HOUR


def _timestamp(text: str, line: int) -> datetime:
    try:
        at = datetime.fromisoformat(text.strip())
    except ValueError:
        raise HistoryError(
            f"line {line}: timestamp {text!r} is not ISO-8601 (e.g. 2026-11-02T13:00:00+00:00)"
        ) from None
    if at.tzinfo is None or at.utcoffset() is None:
        raise HistoryError(f"line {line}: timestamp {text!r} has no UTC offset (add +00:00)")
    if (at.minute, at.second, at.microsecond) != (0, 0, 0):
        raise HistoryError(f"line {line}: timestamp {text!r} is not on the hour")
    return at


def _amount(text: str, line: int) -> float:
    try:
        value = float(text)
    except ValueError:
        raise HistoryError(f"line {line}: gpu_hours {text!r} is not a number") from None
    if not math.isfinite(value) or value < 0:
        raise HistoryError(f"line {line}: gpu_hours must be a finite number >= 0, got {text}")
    return value


def history_read(text: str) -> dict[str, TierSeries]:
    """Per tier, the hourly series the CSV ``text`` holds, gaps filled (see the docstring)."""
    reader = csv.reader(io.StringIO(text))
    header = next(reader, None)
    if header is None or [h.strip() for h in header] != list(COLUMNS):
        raise HistoryError(f"line 1: the header must be {','.join(COLUMNS)}")
    seen: dict[str, dict[datetime, float]] = {}
    for row in reader:
        line = reader.line_num
        if not row or all(not cell.strip() for cell in row):
            continue
        if len(row) != len(COLUMNS):
            raise HistoryError(f"line {line}: {len(row)} fields; expected {','.join(COLUMNS)}")
        at = _timestamp(row[0], line)
        tier = row[1].strip()
        if not tier:
            raise HistoryError(f"line {line}: tier is empty")
        hours = seen.setdefault(tier, {})
        if at in hours:
            raise HistoryError(f"line {line}: a second row for {tier} at {at.isoformat()}")
        hours[at] = _amount(row[2], line)
    if not seen:
        raise HistoryError("the history has no rows")
    return {tier: _series(tier, hours) for tier, hours in sorted(seen.items())}


def _series(tier: str, hours: dict[datetime, float]) -> TierSeries:
    start, end = min(hours), max(hours)
    length = int((end - start) / HOUR) + 1
    if length > MAX_HOURS:
        raise HistoryError(f"tier {tier}: the history spans more than {MAX_HOURS:,} hours")
    series = TierSeries(tier=tier, start=start, values=[0.0] * length)
    for i in range(length):
        at = start + i * HOUR
        if at in hours:
            series.values[i] = hours[at]
            continue
        # A missing hour takes the same hour a week earlier, else a day earlier, else 0.
        back = 168 if i >= 168 else 24 if i >= 24 else 0
        series.values[i] = series.values[i - back] if back else 0.0
        series.filled.append(at)
    return series


def gaps_report(series: Iterable[TierSeries]) -> list[str]:
    """One line per tier with filled hours: how many, and the first and last."""
    return [
        f"{s.tier}: {len(s.filled)} missing hour{'s' if len(s.filled) != 1 else ''} filled "
        f"({s.filled[0].isoformat()} .. {s.filled[-1].isoformat()})"
        for s in series
        if s.filled
    ]


def forecast_write(
    forecasts: dict[str, tuple[datetime, DemandForecast]], *, intervals: bool = True
) -> str:
    """The forecast CSV: per tier (sorted) and hour, from the hour each one's start gives."""
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow([*COLUMNS, *(("p10", "p90") if intervals else ())])
    for tier, (first, forecast) in sorted(forecasts.items()):
        for i, (p10, p50, p90) in enumerate(
            zip(forecast.p10, forecast.p50, forecast.p90, strict=True)
        ):
            row = [(first + i * HOUR).isoformat(), tier, f"{p50:.3f}"]
            writer.writerow(row + ([f"{p10:.3f}", f"{p90:.3f}"] if intervals else []))
    return out.getvalue()
