"""Efficiency charts: pure functions from plain data to plotly figures (no database access).
Money arrives in milli-credits and is shown in credits."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import date

import plotly.graph_objects as go

__all__ = ["efficiency_over_time", "spend_over_time", "teams_idle_spend"]

_LAYOUT = {
    "margin": {"l": 70, "r": 70, "t": 50, "b": 60},
    "template": "plotly_white",
    "legend": {"orientation": "h", "y": -0.2},
}
_USED = "#2a9d8f"
_PAID = "#8d99ae"
_IDLE = "#e76f51"


def efficiency_over_time(
    *, days: Sequence[date], paid: Sequence[float], used: Sequence[float]
) -> go.Figure:
    """GPU-hours paid for and used (utilisation-weighted) per day, side by side."""
    fig = go.Figure(
        [
            go.Bar(
                x=list(days),
                y=list(paid),
                name="GPU-hours paid",
                marker_color=_PAID,
                hovertemplate="%{x|%Y-%m-%d}: %{y:.2f} GPU-hours paid<extra></extra>",
            ),
            go.Bar(
                x=list(days),
                y=list(used),
                name="GPU-hours used",
                marker_color=_USED,
                hovertemplate="%{x|%Y-%m-%d}: %{y:.2f} GPU-hours used<extra></extra>",
            ),
        ]
    )
    fig.update_layout(
        title="GPU-hours paid vs used",
        barmode="group",
        xaxis_title="Day (UTC)",
        yaxis_title="GPU-hours",
        height=340,
        **_LAYOUT,
    )
    fig.update_xaxes(type="date", tickformat="%b %d")
    return fig


def spend_over_time(
    *,
    days: Sequence[date],
    used_spend: Sequence[int],
    idle_spend: Sequence[int],
    cost_per_used_hour: Sequence[int | None],
) -> go.Figure:
    """Spend per day split into used and idle (stacked, credits), with the cost of a GPU-hour
    actually used on a second axis."""
    fig = go.Figure(
        [
            go.Bar(
                x=list(days),
                y=[v / 1000 for v in used_spend],
                name="Spend on used GPU-hours",
                marker_color=_USED,
                hovertemplate="%{x|%Y-%m-%d}: %{y:.3f} credits used<extra></extra>",
            ),
            go.Bar(
                x=list(days),
                y=[v / 1000 for v in idle_spend],
                name="Idle spend",
                marker_color=_IDLE,
                hovertemplate="%{x|%Y-%m-%d}: %{y:.3f} credits idle<extra></extra>",
            ),
            go.Scatter(
                x=list(days),
                y=[None if v is None else v / 1000 for v in cost_per_used_hour],
                name="Cost per GPU-hour used",
                yaxis="y2",
                mode="lines+markers",
                line={"color": "#264653"},
                connectgaps=False,
                hovertemplate="%{x|%Y-%m-%d}: %{y:.3f} credits per GPU-hour used<extra></extra>",
            ),
        ]
    )
    fig.update_layout(
        title="Spend: used and idle",
        barmode="stack",
        xaxis_title="Day (UTC)",
        yaxis={"title": {"text": "Spend (credits)"}, "rangemode": "tozero"},
        yaxis2={
            "title": {"text": "Credits per GPU-hour used"},
            "overlaying": "y",
            "side": "right",
            "rangemode": "tozero",
            "showgrid": False,
        },
        height=340,
        **_LAYOUT,
    )
    fig.update_xaxes(type="date", tickformat="%b %d")
    return fig


def teams_idle_spend(
    *, teams: Sequence[str], used_spend: Sequence[int], idle_spend: Sequence[int]
) -> go.Figure:
    """Each team's spend split into used and idle (credits), most idle at the top."""
    fig = go.Figure(
        [
            go.Bar(
                y=list(teams),
                x=[v / 1000 for v in idle_spend],
                name="Idle spend",
                orientation="h",
                marker_color=_IDLE,
                hovertemplate="%{y}: %{x:.3f} credits idle<extra></extra>",
            ),
            go.Bar(
                y=list(teams),
                x=[v / 1000 for v in used_spend],
                name="Spend on used GPU-hours",
                orientation="h",
                marker_color=_USED,
                hovertemplate="%{y}: %{x:.3f} credits used<extra></extra>",
            ),
        ]
    )
    fig.update_layout(
        title="Teams by idle spend",
        barmode="stack",
        xaxis_title="Spend (credits)",
        yaxis_title="Team",
        height=max(260, 90 + 32 * len(teams)),
        **_LAYOUT,
    )
    fig.update_yaxes(autorange="reversed")
    return fig
