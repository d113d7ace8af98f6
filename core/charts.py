"""Plotly figures as HTML fragments. plotly.js itself comes from our static files
(templates/includes/plotly.html), never a CDN."""

from __future__ import annotations

import plotly.graph_objects as go

CONFIG = {"displaylogo": False, "responsive": True}


def figure_html(fig: go.Figure, *, element_id: str) -> str:
    """The figure as an HTML fragment (div + script); plotly.js must already be on the page."""
    return fig.to_html(include_plotlyjs=False, full_html=False, div_id=element_id, config=CONFIG)
