"""Writing a simulation's report: summary.md, summary.json and report.html with plotly charts.

The HTML loads plotly.js from a copy written next to it (``plotly.min.js``, from the installed
plotly package), so the report opens offline and asks no other host for anything.
"""

from __future__ import annotations

import html
import json
from pathlib import Path

import plotly.graph_objects as go
from plotly.offline import get_plotlyjs

from market.simulator.engine import SimResult
from market.simulator.metrics import Summary, as_json, job_fairness
from market.simulator.table import PER_TENANT_COLUMNS, goals, markdown_table

PLOTLY_FILE = "plotly.min.js"
_CONFIG = {"displaylogo": False, "responsive": True}
_LAYOUT = {
    "template": "plotly_white",
    "height": 380,
    "margin": {"l": 60, "r": 20, "t": 50, "b": 50},
}


def jct_figure(summaries: list[Summary]) -> go.Figure:
    names = [s.policy for s in summaries]
    fig = go.Figure(
        [
            go.Bar(name="mean", x=names, y=[s.jct_mean_h for s in summaries]),
            go.Bar(name="p95", x=names, y=[s.jct_p95_h for s in summaries]),
        ]
    )
    fig.update_layout(title="Job completion time (hours)", barmode="group", **_LAYOUT)
    return fig


def rho_figure(results: list[SimResult]) -> go.Figure:
    fig = go.Figure()
    for result in results:
        rhos = sorted(f.rho for f in job_fairness(result).values())
        if rhos:
            fig.add_trace(
                go.Scatter(
                    x=rhos,
                    y=[(i + 1) / len(rhos) for i in range(len(rhos))],
                    mode="lines",
                    name=result.policy,
                    line={"shape": "hv"},
                )
            )
    fig.add_vline(x=1.0, line_dash="dot")
    fig.update_layout(
        title="Finish-time fairness: CDF of rho (JCT / JCT alone on 1/N of the cluster)",
        xaxis_title="rho",
        yaxis_title="share of jobs",
        xaxis_type="log",
        **_LAYOUT,
    )
    return fig


def utilisation_figure(results: list[SimResult]) -> go.Figure:
    fig = go.Figure()
    for result in results:
        capacity = sum(result.config.tiers.values())
        seconds = result.config.round_minutes * 60.0
        fig.add_trace(
            go.Scattergl(
                x=[r.start / 3600 for r in result.rounds],
                y=[r.busy_gpu_seconds / (capacity * seconds) for r in result.rounds],
                mode="markers",
                marker={"size": 4},
                name=result.policy,
            )
        )
    fig.update_layout(
        title="Utilisation per round (rounds with work waiting)",
        xaxis_title="hours since the first arrival",
        yaxis_title="GPU-time used / offered",
        **_LAYOUT,
    )
    return fig


def spend_figure(summaries: list[Summary]) -> go.Figure:
    tenants = sorted({t for s in summaries for t in s.spend})
    if len(tenants) > PER_TENANT_COLUMNS:
        # One bar per tenant is unreadable with a tenant per job: totals per policy instead.
        fig = go.Figure(
            [go.Bar(x=[s.policy for s in summaries], y=[s.spend_total / 1000 for s in summaries])]
        )
        fig.update_layout(title="Credits spent in total", yaxis_title="credits", **_LAYOUT)
        return fig
    fig = go.Figure(
        [
            go.Bar(
                name=s.policy,
                x=[f"t{t}" for t in tenants],
                y=[s.spend.get(t, 0) / 1000 for t in tenants],
            )
            for s in summaries
        ]
    )
    fig.update_layout(
        title="Credits spent per tenant", barmode="group", yaxis_title="credits", **_LAYOUT
    )
    return fig


def report_write(
    *, results: list[SimResult], summaries: list[Summary], out: Path, command: str, context: str
) -> dict[str, Path]:
    """Write the report files into ``out`` (created if missing) and return their paths."""
    out.mkdir(parents=True, exist_ok=True)
    table = markdown_table(summaries)
    paths = {
        "markdown": out / "summary.md",
        "json": out / "summary.json",
        "html": out / "report.html",
        "plotly": out / PLOTLY_FILE,
    }
    checks = "\n".join(goals(summaries))
    paths["markdown"].write_text(f"{context}\n\nCommand: `{command}`\n\n{table}\n\n{checks}\n")
    paths["json"].write_text(json.dumps(summary_json(command, context, summaries), indent=2))
    paths["plotly"].write_text(get_plotlyjs())
    figures = [
        jct_figure(summaries),
        rho_figure(results),
        utilisation_figure(results),
        spend_figure(summaries),
    ]
    body = "\n".join(
        fig.to_html(include_plotlyjs=False, full_html=False, div_id=f"figure-{i}", config=_CONFIG)
        for i, fig in enumerate(figures)
    )
    rows = "".join(
        "<tr>"
        + "".join(f"<td>{html.escape(cell.strip())}</td>" for cell in line.strip("|").split("|"))
        + "</tr>"
        for line in table.splitlines()[2:]
    )
    header = "".join(
        f"<th>{html.escape(cell.strip())}</th>"
        for cell in table.splitlines()[0].strip("|").split("|")
    )
    paths["html"].write_text(
        '<!doctype html><html lang="en"><head><meta charset="utf-8">'
        "<title>gpumarket what-if simulation</title>"
        f'<script src="{PLOTLY_FILE}"></script>'
        "<style>body{font-family:system-ui,sans-serif;margin:1.5rem;max-width:1100px}"
        "table{border-collapse:collapse}td,th{border-bottom:1px solid #ddd;padding:.3rem .6rem;text-align:left}</style>"
        "</head><body><h1>What-if simulation</h1>"
        f"<p>{html.escape(context)}</p><p><code>{html.escape(command)}</code></p>"
        f"<table><thead><tr>{header}</tr></thead><tbody>{rows}</tbody></table>{body}</body></html>"
    )
    return paths


def summary_json(command: str, context: str, summaries: list) -> dict:
    """The comparison as JSON: the command, its context, each policy's metrics, the goals."""
    return {
        "command": command,
        "context": context,
        "policies": [as_json(s) for s in summaries],
        "goals": goals(summaries),
    }
