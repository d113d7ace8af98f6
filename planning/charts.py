"""Planning figures (pure data -> plotly figure). Money arrives in milli-credits."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import plotly.graph_objects as go

_LAYOUT = {"margin": {"l": 60, "r": 20, "t": 50, "b": 50}, "legend": {"orientation": "h"}}


def price_wait(tiers: Mapping[str, Mapping]) -> go.Figure:
    """Per tier and week: expected clearing price (credits/GPU-h) now and with the scenario,
    and the expected wait in rounds on a second axis."""
    fig = go.Figure()
    for slug, tier in sorted(tiers.items()):
        for key, label, dash in (("weeks_before", "now", "dot"), ("weeks_after", "scenario", None)):
            weeks = tier.get(key) or []
            if not weeks:
                continue
            x = [f"week {w['week']}" for w in weeks]
            fig.add_trace(
                go.Scatter(
                    x=x,
                    y=[w["price"] / 1000 for w in weeks],
                    mode="lines+markers",
                    name=f"{slug} price, {label}",
                    line={"dash": dash},
                )
            )
            fig.add_trace(
                go.Bar(
                    x=x,
                    y=[w["wait_rounds"] for w in weeks],
                    name=f"{slug} wait, {label}",
                    yaxis="y2",
                    opacity=0.35,
                )
            )
    fig.update_layout(
        title="Expected price and wait per week",
        yaxis={"title": "Credits per GPU-hour", "rangemode": "tozero"},
        yaxis2={
            "title": "Wait (rounds)",
            "overlaying": "y",
            "side": "right",
            "rangemode": "tozero",
        },
        barmode="group",
        **_LAYOUT,
    )
    return fig


def tradeoff(points: Sequence[Mapping], *, chosen_pct: float) -> go.Figure:
    """Cheapest cost against the unmet demand allowed; the admin's target marked."""
    feasible = [p for p in points if p["cost"] is not None]
    fig = go.Figure()
    fig.add_trace(
        go.Scatter(
            x=[p["max_unmet_pct"] for p in feasible],
            y=[p["cost"] / 1000 for p in feasible],
            mode="lines+markers",
            name="cheapest mix",
        )
    )
    fig.add_vline(x=chosen_pct, line_dash="dash", annotation_text="target")
    fig.update_layout(
        title="Cost against unmet demand allowed",
        xaxis={"title": "Unmet demand allowed (%)", "rangemode": "tozero"},
        yaxis={"title": "Cost over the horizon (credits)", "rangemode": "tozero"},
        **_LAYOUT,
    )
    return fig
