"""Planning figures (pure data -> plotly figure). Money arrives in milli-credits."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import plotly.graph_objects as go
from plotly.subplots import make_subplots

_LAYOUT = {
    "margin": {"l": 60, "r": 20, "t": 60, "b": 50},
    "template": "plotly_white",
    "legend": {"orientation": "h", "y": -0.15},
}
# One colour per tier, the same in both panels (plotly's default sequence).
_COLOURS = ("#636efa", "#ef553b", "#00cc96", "#ab63fa", "#ffa15a", "#19d3f3")


def price_wait(tiers: Mapping[str, Mapping]) -> go.Figure:
    """Per tier and week: expected clearing price (credits/GPU-h) above, expected wait in
    rounds below, each dotted for now and solid with the scenario. One legend entry per tier
    (clicking it hides the tier in both panels); a "never" wait is a gap."""
    fig = make_subplots(rows=2, cols=1, shared_xaxes=True, vertical_spacing=0.08)
    for i, (slug, tier) in enumerate(sorted(tiers.items())):
        colour = _COLOURS[i % len(_COLOURS)]
        for key, dash in (("weeks_after", None), ("weeks_before", "dot")):
            weeks = tier.get(key) or []
            if not weeks:
                continue
            x = [w["week"] for w in weeks]
            shown = key == "weeks_after"
            common = {"legendgroup": slug, "mode": "lines+markers"}
            line = {"dash": dash, "color": colour}
            fig.add_trace(
                go.Scatter(
                    x=x,
                    y=[w["price"] / 1000 for w in weeks],
                    name=slug,
                    showlegend=shown,
                    line=line,
                    **common,
                ),
                row=1,
                col=1,
            )
            fig.add_trace(
                go.Scatter(
                    x=x,
                    y=[w["wait_rounds"] for w in weeks],
                    name=slug,
                    showlegend=False,
                    line=line,
                    **common,
                ),
                row=2,
                col=1,
            )
    fig.update_layout(
        title={"text": "Expected price and wait per week (solid: with the scenario, dotted: now)"},
        height=460,
        **_LAYOUT,
    )
    fig.update_yaxes(title_text="Credits per GPU-hour", rangemode="tozero", row=1, col=1)
    fig.update_yaxes(title_text="Wait (rounds)", rangemode="tozero", row=2, col=1)
    last = max(
        (w["week"] for t in tiers.values() for k in ("weeks_before", "weeks_after")
         for w in t.get(k) or []),
        default=1,
    )  # fmt: skip
    # Weeks 1..last with half a week either side: no "week 0", no point on the frame.
    fig.update_xaxes(range=[0.5, last + 0.5])
    fig.update_xaxes(dtick=1, tickprefix="week ", row=2, col=1)
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


def demand_forecast(forecast: Mapping[str, Mapping]) -> go.Figure:
    """Per tier: forecast demand in GPUs (P50, declared campaigns included) with its P10-P90
    band shaded, over the horizon's replayed rounds. One legend entry per tier; the band
    belongs to the tier's legend group."""
    fig = go.Figure()
    for i, (slug, series) in enumerate(sorted(forecast.items())):
        colour = _COLOURS[i % len(_COLOURS)]
        x = series.get("starts") or []
        common = {"x": x, "legendgroup": slug, "mode": "lines"}
        fig.add_trace(
            go.Scatter(y=series["p10"], name=f"{slug} P10", showlegend=False,
                       line={"width": 0, "color": colour}, hoverinfo="skip", **common)
        )  # fmt: skip
        fig.add_trace(
            go.Scatter(y=series["p90"], name=f"{slug} P10-P90", showlegend=False, fill="tonexty",
                       line={"width": 0, "color": colour}, opacity=0.25, **common)
        )  # fmt: skip
        fig.add_trace(go.Scatter(y=series["p50"], name=slug, line={"color": colour}, **common))
    fig.update_layout(
        title={"text": "Forecast demand per round: P50 line, P10-P90 shaded"},
        xaxis={"title": "Round start"},
        yaxis={"title": "GPUs", "rangemode": "tozero"},
        height=380,
        **_LAYOUT,
    )
    return fig
