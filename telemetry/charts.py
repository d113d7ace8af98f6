"""Telemetry charts: pure functions from plain data to plotly figures (no database access)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime

import plotly.graph_objects as go

__all__ = ["gpu_heatmap", "utilisation_lines"]

_LAYOUT = {"margin": {"l": 60, "r": 20, "t": 40, "b": 50}, "template": "plotly_white"}
MIN_MINUTES = 10


def gpu_heatmap(
    *, gpus: Sequence[str], minutes: Sequence[datetime], values: Sequence[Sequence[float | None]]
) -> go.Figure:
    """Utilisation per GPU (rows) per minute (columns), percent; None where nothing was reported.

    Fitted to the data: minutes before any GPU reported are left off (keeping at least the
    last ``MIN_MINUTES``), so a fleet that started ten minutes ago fills the chart.
    """
    first = next(
        (i for i in range(len(minutes)) if any(row[i] is not None for row in values)),
        len(minutes),
    )
    first = min(first, max(len(minutes) - MIN_MINUTES, 0))
    minutes = list(minutes)[first:]
    values = [list(row)[first:] for row in values]
    fig = go.Figure(
        go.Heatmap(
            z=[list(row) for row in values],
            x=list(minutes),
            y=list(gpus),
            zmin=0,
            zmax=100,
            colorscale="Viridis",
            colorbar={"title": {"text": "%"}},
            hoverongaps=False,
            hovertemplate="%{y}<br>%{x}<br>%{z:.0f}%<extra></extra>",
        )
    )
    fig.update_layout(
        title="GPU utilisation per minute",
        xaxis_title="Minute (UTC)",
        height=max(260, 60 + 22 * len(gpus)),
        **_LAYOUT,
    )
    return fig


def utilisation_lines(
    series: Mapping[str, Sequence[tuple[datetime, float]]],
    *,
    window: tuple[datetime, datetime] | None = None,
) -> go.Figure:
    """Utilisation over time, one line per GPU: {gpu label: [(time, percent)]}.

    ``window``: the allocation's [start, end); the time axis spans it, in hours and minutes,
    so a new allocation's first samples do not stretch a few seconds into millisecond ticks."""
    fig = go.Figure()
    for label, points in sorted(series.items()):
        fig.add_trace(
            go.Scatter(x=[t for t, _ in points], y=[v for _, v in points], mode="lines", name=label)
        )
    fig.update_layout(
        title="GPU utilisation",
        xaxis_title="Time (UTC)",
        yaxis_title="Utilisation %",
        yaxis_range=[0, 100],
        height=320,
        legend={"orientation": "h", "y": -0.25},
        **_LAYOUT,
    )
    fig.update_xaxes(tickformat="%H:%M")
    if window is not None:
        fig.update_xaxes(range=[window[0], window[1]])
    return fig
