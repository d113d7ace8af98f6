"""The report files and the ``simulate`` command on a few jobs of a trace."""

from __future__ import annotations

import json
from io import StringIO
from pathlib import Path

import pytest
from django.core.management import CommandError, call_command

from market.simulator import (
    SimConfig,
    report_write,
    simulate,
    summarise,
    throughputs_load,
    trace_load,
)
from market.simulator.metrics import markdown_table, percentile

DATA = Path(__file__).parent / "data"
TIERS = {"k80": 2, "p100": 2, "v100": 2}


@pytest.fixture(scope="module")
def results():
    table = throughputs_load(DATA / "simulation_throughputs.json")
    jobs = trace_load(
        DATA / "head40.trace", throughputs=table, gpu_types=list(TIERS), tenants=2, max_jobs=5
    )
    config = SimConfig(tiers=TIERS, tenants=2, round_minutes=240)
    return [simulate(jobs, policy=p, config=config) for p in ("welfare", "fcfs")]


def test_report_is_offline_and_complete(results, tmp_path):
    summaries = [summarise(r) for r in results]
    paths = report_write(
        results=results, summaries=summaries, out=tmp_path / "r", command="cmd", context="ctx"
    )
    html = paths["html"].read_text()
    assert '<script src="plotly.min.js"></script>' in html
    assert "cdn" not in html.lower() and "https://" not in html.split("<body>")[0]
    assert paths["plotly"].stat().st_size > 1_000_000  # the library itself, next to the page
    assert html.count('class="plotly-graph-div"') == 4
    assert markdown_table(summaries) in paths["markdown"].read_text()
    data = json.loads(paths["json"].read_text())
    assert [p["policy"] for p in data["policies"]] == ["welfare", "fcfs"]
    assert data["policies"][0]["finished"] == 5


def test_markdown_table_has_one_row_per_policy(results):
    table = markdown_table([summarise(r) for r in results]).splitlines()
    assert table[0].startswith("| policy | jobs finished |")
    assert [row.split("|")[1].strip() for row in table[2:]] == ["welfare", "fcfs"]
    assert all(row.split("|")[2].strip() == "5/5" for row in table[2:])


def test_percentile():
    assert percentile([1.0, 2.0, 3.0, 4.0, 5.0], 50) == 3.0
    assert percentile([1.0, 2.0], 95) == pytest.approx(1.95)
    assert percentile([7.0], 95) == 7.0


def test_simulate_command_writes_the_report(tmp_path):
    out = StringIO()
    call_command(
        "simulate",
        "--trace",
        str(DATA / "head40.trace"),
        "--max-jobs",
        "6",
        "--policy",
        "fcfs,maxmin",
        "--tiers",
        "k80=4,v100=4",
        "--tenants",
        "3",
        "--round-minutes",
        "120",
        "--out",
        str(tmp_path),
        stdout=out,
        stderr=StringIO(),
    )
    text = out.getvalue()
    assert "6 jobs of head40.trace" in text and "3 tenants (seed 0)" in text
    assert "| fcfs | 6/6 |" in text and "| maxmin | 6/6 |" in text
    assert (tmp_path / "report.html").exists() and (tmp_path / "summary.md").exists()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--policy", "lottery"], "unknown policy lottery"),
        (["--tiers", "k80"], "should look like k80=8"),
        (["--tiers", "h100=4"], "no throughputs for GPU type 'h100'"),
        (["--tenants", "0"], "at least one tenant"),
    ],
)
def test_simulate_command_refuses_bad_arguments(tmp_path, args, message):
    with pytest.raises(CommandError, match=message):
        call_command(
            "simulate",
            "--trace",
            str(DATA / "head40.trace"),
            "--out",
            str(tmp_path),
            *args,
            stdout=StringIO(),
            stderr=StringIO(),
        )


def test_simulate_command_needs_a_trace_or_rounds():
    with pytest.raises(CommandError, match="--trace FILE .* or --from-rounds N"):
        call_command("simulate", stdout=StringIO())
