"""Charts for the policy pages: pure functions from comparison rows to plotly HTML fragments.

plotly.js itself comes from our static files (templates/includes/plotly.html), never a CDN.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from core.charts import figure_html
from tenants.ledger import MILLI


def comparison_figure(rows: Sequence[Any], *, label: str) -> go.Figure:
    """Revenue, GPUs allocated and Jain's index per round: the active version beside ``label``.

    ``rows`` are ``market.policy.selectors.ComparisonRow`` (oldest round first after sorting here).
    """
    ordered = sorted(rows, key=lambda r: r.round.starts_at)
    x = [f"#{r.round.pk}" for r in ordered]
    fig = make_subplots(
        rows=3,
        cols=1,
        shared_xaxes=True,
        vertical_spacing=0.08,
        subplot_titles=("Revenue (credits)", "GPUs allocated", "Jain's index"),
    )
    series = [
        (1, lambda s: s.revenue / MILLI),
        (2, lambda s: sum(s.allocated.values())),
        (3, lambda s: s.fairness),
    ]
    for row, value in series:
        for name, side, colour in (("Active", "active", "#2b59c3"), (label, "other", "#d97706")):
            fig.add_trace(
                go.Bar(
                    x=x,
                    y=[value(getattr(r, side)) for r in ordered],
                    name=name,
                    marker_color=colour,
                    showlegend=row == 1,
                    legendgroup=name,
                ),
                row=row,
                col=1,
            )
    fig.update_layout(
        barmode="group",
        height=620,
        template="plotly_white",
        margin={"l": 60, "r": 20, "t": 40, "b": 40},
        legend={"orientation": "h", "y": -0.08},
    )
    return fig


def comparison_html(rows: Sequence[Any], *, label: str, element_id: str) -> str:
    return figure_html(comparison_figure(rows, label=label), element_id=element_id)
