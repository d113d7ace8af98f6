"""``gpumarket forecast``: a CSV history in, a CSV forecast out; bad rows named by line."""

from __future__ import annotations

import csv
import io
from datetime import UTC, datetime, timedelta

import pytest

from gpumarket.cli import main

T0 = datetime(2026, 9, 7, tzinfo=UTC)  # a Monday


def history_csv(path, *, hours: int = 3 * 168, skip: tuple[int, ...] = ()) -> None:
    lines = ["timestamp,tier,gpu_hours"]
    for tier, base in (("a100", 12.0), ("h100", 4.0)):
        for i in range(hours):
            if tier == "h100" and i in skip:
                continue
            weekday = (i // 24) % 7 < 5
            lines.append(f"{(T0 + timedelta(hours=i)).isoformat()},{tier},{base + 6 * weekday}")
    path.write_text("\n".join(lines) + "\n")


def test_the_forecast_starts_the_hour_after_the_history_one_row_per_tier_and_hour(tmp_path, capsys):
    history, out = tmp_path / "history.csv", tmp_path / "forecast.csv"
    history_csv(history, skip=(30, 31, 200))
    code = main(["forecast", "--history", str(history), "--horizon", "48", "--out", str(out)])
    assert code == 0
    rows = list(csv.DictReader(io.StringIO(out.read_text())))
    assert list(rows[0]) == ["timestamp", "tier", "gpu_hours", "p10", "p90"]
    assert len(rows) == 2 * 48
    first = T0 + timedelta(hours=3 * 168)
    a100 = [r for r in rows if r["tier"] == "a100"]
    assert a100[0]["timestamp"] == first.isoformat()
    assert a100[-1]["timestamp"] == (first + timedelta(hours=47)).isoformat()
    # The history repeats every week exactly: Monday after it is Monday's 18 GPU-hours.
    assert float(a100[0]["gpu_hours"]) == pytest.approx(18.0, abs=1e-6)
    assert all(float(r["p10"]) <= float(r["gpu_hours"]) <= float(r["p90"]) for r in rows)
    err = capsys.readouterr().err
    assert "h100: 3 missing hours filled (2026-09-08T06:00:00+00:00 .. " in err
    assert "a100: seasonal naive; 1 day WAPE 0.0 % (seasonal naive 0.0 %)" in err


@pytest.mark.parametrize(
    ("row", "message"),
    [
        ("2026-09-07T01:00:00,a100,3", "line 3: timestamp '2026-09-07T01:00:00' has no UTC offset"),
        ("2026-09-07T01:30:00+00:00,a100,3", "line 3: timestamp '2026-09-07T01:30:00+00:00' is not on the hour"),
        ("yesterday,a100,3", "line 3: timestamp 'yesterday' is not ISO-8601"),
        ("2026-09-07T01:00:00+00:00,a100,-2", "line 3: gpu_hours must be a finite number >= 0"),
        ("2026-09-07T01:00:00+00:00,a100,lots", "line 3: gpu_hours 'lots' is not a number"),
        ("2026-09-07T00:00:00+00:00,a100,3", "line 3: a second row for a100"),
        ("2026-09-07T01:00:00+00:00,a100", "line 3: 2 fields"),
    ],
)  # fmt: skip
def test_a_bad_row_is_refused_with_its_line_number(tmp_path, capsys, row, message):
    history, out = tmp_path / "history.csv", tmp_path / "forecast.csv"
    history.write_text(f"timestamp,tier,gpu_hours\n2026-09-07T00:00:00+00:00,a100,2\n{row}\n")
    code = main(["forecast", "--history", str(history), "--horizon", "4", "--out", str(out)])
    assert code == 1 and not out.exists()
    assert message in capsys.readouterr().err


def test_a_bad_horizon_or_missing_file_is_named(tmp_path, capsys):
    out = tmp_path / "f.csv"
    assert main(["forecast", "--history", "nope.csv", "--horizon", "4", "--out", str(out)]) == 2
    assert "--history: cannot read nope.csv" in capsys.readouterr().err
    assert main(["forecast", "--history", "x.csv", "--horizon", "0", "--out", str(out)]) == 2
    assert "--horizon: a whole number of hours" in capsys.readouterr().err
