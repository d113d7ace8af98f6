"""The report files and the ``simulate`` command on a few jobs of a trace."""

from __future__ import annotations

import dataclasses
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
from market.simulator.table import goals, markdown_table

DATA = Path(__file__).parent / "data"
TIERS = {"k80": 2, "p100": 2, "v100": 2}


@pytest.fixture(scope="module")
def results():
    table = throughputs_load(DATA / "simulation_throughputs.json")
    jobs = trace_load(
        DATA / "head40.trace", throughputs=table, gpu_types=list(TIERS), tenants=2, max_jobs=5
    )
    config = SimConfig(tiers=TIERS, tenants=2, round_minutes=240)
    return [simulate(jobs, policy=p, config=config) for p in ("welfare", "fifo")]


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
    assert [p["policy"] for p in data["policies"]] == ["welfare", "fifo"]
    assert data["policies"][0]["finished"] == 5


def test_markdown_table_has_one_row_per_policy(results):
    table = markdown_table([summarise(r) for r in results]).splitlines()
    assert table[0].startswith("| policy | finished | utilisation |")
    assert [row.split("|")[1].strip() for row in table[2:]] == ["welfare", "fifo"]
    assert all(row.split("|")[2].strip() == "5/5" for row in table[2:])


def test_goals_say_by_how_much_a_goal_is_missed(results):
    welfare, fifo = (summarise(r) for r in results)
    welfare = dataclasses.replace(welfare, utilisation=0.5)
    maxmin = dataclasses.replace(welfare, policy="maxmin", utilisation=0.9, rho_worst=3.0)
    gavel = dataclasses.replace(welfare, policy="gavel-maxmin", rho_worst=2.0)
    fifo = dataclasses.replace(fifo, utilisation=0.8)
    lines = goals([welfare, maxmin, gavel, fifo])
    assert lines[0] == "- maxmin worst rho <= Gavel max-min's: MISSED by 1 (50.0%) (3 vs 2)"
    assert "- welfare utilisation >= FIFO's: MISSED by 0.3 (37.5%) (0.5 vs 0.8)" in lines
    assert "- maxmin utilisation >= FIFO's: met (0.9 vs 0.8)" in lines


def test_simulate_command_writes_the_report(tmp_path):
    out = StringIO()
    call_command(
        "simulate",
        "--trace",
        str(DATA / "head40.trace"),
        "--max-jobs",
        "6",
        "--policy",
        "fifo,maxmin,gavel-maxmin",
        "--tiers",
        "k80=4,v100=4",
        "--tenants",
        "jobs",
        "--round-minutes",
        "6",
        "--restart-seconds",
        "60",
        "--format",
        "markdown",
        "--out",
        str(tmp_path),
        stdout=out,
        stderr=StringIO(),
    )
    text = out.getvalue()
    assert "6 jobs of head40.trace" in text and "one tenant per job" in text
    assert "6-minute rounds, gang job model, 60 s restart cost" in text
    assert "preemptions/job (mean, max)" in text
    assert "| fifo | 6/6 |" in text and "| gavel-maxmin | 6/6 |" in text
    assert "- maxmin worst rho <= Gavel max-min's:" in text
    assert (tmp_path / "report.html").exists() and (tmp_path / "summary.md").exists()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--policy", "lottery"], "unknown policy lottery"),
        (["--tiers", "k80"], "should look like k80=8"),
        (["--tiers", "h100=4"], "no throughputs for GPU type 'h100'"),
        (["--tenants", "0"], "at least one tenant"),
        (["--tenants", "everyone"], "positive whole number or 'jobs'"),
        (["--round-minutes", "0"], "round length must be positive"),
        (["--restart-seconds", "-1"], "restart cost must be 0 or more"),
        (["--round-minutes", "1", "--restart-seconds", "60"], "shorter than a round"),
        (["--job-model", "fluid", "--restart-seconds", "30"], "needs the gang job model"),
        (["--idle-reclaim", "10,10"], "four whole numbers BELOW,IDLE,GRACE,REFUND"),
        (["--idle-reclaim", "0,10,5,100"], "BELOW in 1-100 %"),
        (["--utilisation", "0.5", "--job-model", "fluid"], "gang"),
    ],
)
def test_simulate_command_refuses_bad_arguments_with_status_2(tmp_path, args, message):
    with pytest.raises(CommandError, match=message) as refused:
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
    assert refused.value.returncode == 2


def test_idle_reclaim_and_backfill_from_the_command_raise_utilisation(tmp_path):
    """Jobs busy half the time they hold GPUs: reclaim and backfill, set from the command,
    give the idle GPUs to waiting jobs, and the report says how it was run."""

    def run(*extra):
        out = StringIO()
        call_command(
            "simulate",
            "--trace",
            str(DATA / "head40.trace"),
            "--max-jobs",
            "20",
            "--policy",
            "welfare",
            "--tiers",
            "k80=4,v100=4",
            "--format",
            "json",
            "--utilisation",
            "0.5",
            "--out",
            str(tmp_path),
            *extra,
            stdout=out,
            stderr=StringIO(),
        )
        return json.loads(out.getvalue())

    plain = run()
    spare = run("--idle-reclaim", "10,10,5,100", "--backfill-minutes", "10")
    assert "busy 50% of their holding" in spare["context"]
    assert "idle reclaim below 10 % for 10+5 min" in spare["context"]
    assert "backfill every 10 min" in spare["context"] and "no backfill" in plain["context"]
    [before], [after] = plain["policies"], spare["policies"]
    assert after["utilisation"] > before["utilisation"]


def test_simulate_command_needs_a_trace_or_rounds():
    with pytest.raises(CommandError, match="--trace FILE .* or --from-rounds N"):
        call_command("simulate", stdout=StringIO())
