"""Market charts: pure functions from plain data to plotly figures (no database access).

Money arrives in milli-credits (integers) and is shown in credits; the division happens here,
for display only. ``core.charts.figure_html`` turns a figure into a page fragment.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import date, datetime

import plotly.graph_objects as go

from market.forecast import QUANTILES, DemandForecast
from tenants.ledger import MILLI

_LAYOUT = {
    "margin": {"l": 60, "r": 20, "t": 40, "b": 50},
    "height": 340,
    "template": "plotly_white",
    "legend": {"orientation": "h", "y": -0.2},
}


# Dates a person reads ("Nov 24 09:00") on every time axis.
DATE_TICKS = "%b %d %H:%M"
# The share of rounds the P10-P90 band is meant to hold (80 %), so the legend says what the
# band means without the statistics.
BAND_SHARE = 100 * (QUANTILES[1] - QUANTILES[0])
# Supply/demand prices spread wider than this (highest / lowest above zero) go on a log axis.
LOG_SPREAD = 100


def _credits(milli: int | float) -> float:
    return milli / MILLI


def price_history(series: Mapping[str, Sequence[tuple[datetime, int]]]) -> go.Figure:
    """Clearing price per tier over rounds: {tier slug: [(window start, milli-credits/GPU-h)]}."""
    fig = go.Figure()
    for slug, points in sorted(series.items()):
        fig.add_trace(
            go.Scatter(
                x=[at for at, _ in points],
                y=[_credits(price) for _, price in points],
                mode="lines+markers",
                name=slug,
                line={"shape": "hv"},
            )
        )
    fig.update_layout(
        title="Clearing price per tier",
        xaxis_title="Round window start (UTC)",
        yaxis_title="Credits per GPU-hour",
        # Dates a person reads ("Nov 24 09:00"), and prices from zero so that a move of a
        # few milli-credits does not look like a crash.
        xaxis={"type": "date", "tickformat": DATE_TICKS},
        yaxis={"rangemode": "tozero"},
        **_LAYOUT,
    )
    return fig


def demand_steps(bids: Sequence[tuple[int, int]]) -> tuple[list[float], list[float]]:
    """A demand curve as step points: bids (limit milli-credits/GPU-h, GPUs) sorted by price,
    highest first; x is the cumulative GPUs wanted at or above each price, y that price in credits."""
    xs: list[float] = []
    ys: list[float] = []
    total = 0
    for price, quantity in sorted(bids, key=lambda b: -b[0]):
        xs += [float(total), float(total + quantity)]
        ys += [_credits(price)] * 2
        total += quantity
    if xs:
        xs.append(float(total))
        ys.append(0.0)
    return xs, ys


def supply_demand(
    *,
    tier: str,
    bids: Sequence[tuple[int, float]],
    capacity: int,
    reserve: int,
    price: int | None,
) -> go.Figure:
    """One tier's supply and demand in a round.

    Demand: the limits of the bids the clearing saw on this tier against cumulative GPUs, a
    multi-tier bid split over its tiers and each team cut at its share cap
    (market.selectors.round_demand).
    Supply: the reserve price up to the capacity offered.
    """
    xs, ys = demand_steps(bids)
    levels = [*ys, _credits(reserve), _credits(price or 0)]
    positive = [y for y in levels if y > 0]
    # A few bids far above the rest (a limit set sky-high to be sure of winning) would flatten
    # every other price at zero on a linear axis: past this spread the axis is logarithmic,
    # with zero drawn at its floor, so nothing is clipped and nothing squashed.
    log = bool(positive) and max(positive) > LOG_SPREAD * min(positive)
    if log:
        floor = min(positive) / 1.5
        ys = [max(y, floor) for y in ys]
    else:
        floor = 0.0
    # Fitted to the prices shown, however small; 1 credit only when every price is zero.
    top = (max(levels) or 1.0) * 1.15
    supply_from = max(_credits(reserve), floor)
    fig = go.Figure()
    fig.add_trace(
        go.Scatter(
            x=xs or [0],
            y=ys or [max(floor, 0.0) or 0],
            mode="lines",
            name="Demand the clearing saw (a multi-tier bid split over its tiers; share caps applied)",
            line={"width": 3},
        )
    )
    fig.add_trace(
        go.Scatter(
            x=[0, capacity, capacity],
            y=[supply_from, supply_from, top],
            mode="lines",
            name=f"Supply ({capacity} GPUs from reserve {_credits(reserve):g})",
            line={"dash": "dash", "width": 3},
        )
    )
    if price is not None:
        fig.add_trace(
            go.Scatter(
                x=[0, max(capacity, xs[-1] if xs else 0)],
                y=[max(_credits(price), floor)] * 2,
                mode="lines",
                name=f"Clearing price {_credits(price):g}",
                line={"dash": "dot"},
            )
        )
    yaxis = (
        {
            "type": "log",
            "range": [math.log10(floor), math.log10(top)],
            "title": {"text": "Credits per GPU-hour (log scale)"},
        }
        if log
        else {"range": [0, top], "title": {"text": "Credits per GPU-hour"}}
    )
    fig.update_layout(
        title=f"Supply and demand — {tier}",
        xaxis_title="GPUs",
        yaxis=yaxis,
        # Room right of the capacity line so the vertical part of supply stays visible.
        xaxis_range=[0, max(capacity, xs[-1] if xs else 0, 1) * 1.1],
        **_LAYOUT,
    )
    return fig


def round_utilisation(*, capacities: Mapping[str, int], allocated: Mapping[str, int]) -> go.Figure:
    """GPUs allocated against capacity offered, per tier, for one round."""
    slugs = sorted(set(capacities) | set(allocated))
    fig = go.Figure()
    fig.add_trace(go.Bar(x=slugs, y=[capacities.get(s, 0) for s in slugs], name="Offered"))
    fig.add_trace(go.Bar(x=slugs, y=[allocated.get(s, 0) for s in slugs], name="Allocated"))
    fig.update_layout(
        title="GPUs offered and allocated", barmode="group", yaxis_title="GPUs", **_LAYOUT
    )
    return fig


@dataclass(frozen=True)
class SpendPeriod:
    """A budget period drawn on the spend chart: its spend to date, from ``start``, against
    its cap (milli-credits; None draws the spend alone)."""

    label: str  # "This month"
    cap_label: str  # "Monthly cap"
    start: date
    cap: int | None


# A cap more than this many times the largest spend drawn would flatten the spend to a line
# at zero: it is named in the legend, not drawn, until the reader clicks it.
FAR_ABOVE = 10


def _cap_line(*, name: str, x: list[date], cap: int, top: float, dash: str) -> go.Scatter:
    far = _credits(cap) > FAR_ABOVE * top
    return go.Scatter(
        x=x,
        y=[_credits(cap)] * len(x),
        mode="lines",
        name=f"{name} {_credits(cap):g}" + (" (far above the spend: click to show)" if far else ""),
        line={"dash": dash},
        visible="legendonly" if far else None,
    )


def spend_over_time(
    *,
    days: Sequence[date],
    daily: Sequence[int],
    periods: Sequence[SpendPeriod],
    daily_cap: int | None = None,
) -> go.Figure:
    """Net spend (charges less refunds) per day, and each period's spend to date against that
    period's cap: a week cap against the week's spend, a month cap against the month's.
    ``daily_cap`` is drawn against the daily bars. All amounts in milli-credits."""
    fig = go.Figure()
    fig.add_trace(go.Bar(x=list(days), y=[_credits(a) for a in daily], name="Spent that day"))
    lines = []
    for period in periods:
        x = [d for d in days if d >= period.start]
        running, to_date = 0, []
        for d, amount in zip(days, daily, strict=True):
            if d >= period.start:
                running += amount
                to_date.append(_credits(running))
        fig.add_trace(go.Scatter(x=x, y=to_date, mode="lines+markers", name=period.label))
        lines.append((period, x))
    top = max([_credits(a) for a in daily] + [t for tr in fig.data[1:] for t in tr.y], default=0)
    for period, x in lines:
        if period.cap is not None and x:
            fig.add_trace(
                _cap_line(
                    name=period.cap_label, x=[x[0], x[-1]], cap=period.cap, top=top, dash="dash"
                )
            )
    if daily_cap is not None and days:
        fig.add_trace(
            _cap_line(
                name="Daily cap", x=[days[0], days[-1]], cap=daily_cap,
                top=max((_credits(a) for a in daily), default=0), dash="dot",
            )
        )  # fmt: skip
    fig.update_layout(
        title="Spend over time", xaxis_title="Day (UTC)", yaxis_title="Credits", **_LAYOUT
    )
    return fig


PRICE_HEADROOM = 1.5


def demand_forecast(
    *,
    tier: str,
    at: Sequence[datetime],
    demand: Sequence[int],
    capacity: Sequence[int | None],
    price: Sequence[int | None],
    future_at: Sequence[datetime],
    forecast: DemandForecast,
    offered: int,
) -> go.Figure:
    """One tier's demand per round (GPUs bid), the forecast for the next rounds (P50) with its
    P10-P90 band, the capacity each round offered (``offered`` now, carried over the forecast)
    and the clearing price (milli-credits/GPU-h, shown in credits) on a second axis."""
    fig = go.Figure()
    fig.add_trace(
        go.Scatter(x=list(at), y=list(demand), mode="lines+markers", name="Demand (GPUs bid)")
    )
    if forecast.p50:
        _forecast_band(fig, at=at, demand=demand, future_at=future_at, forecast=forecast)
    fig.add_trace(
        go.Scatter(
            x=[*at, *future_at],
            y=[*capacity, *([offered] * len(future_at))],
            mode="lines",
            line={"shape": "hv", "dash": "dot"},
            name="Capacity offered",
        )
    )
    fig.add_trace(
        go.Scatter(
            x=list(at),
            y=[None if p is None else _credits(p) for p in price],
            mode="lines",
            line={"shape": "hv", "width": 1},
            name="Clearing price (right axis)",
            yaxis="y2",
        )
    )
    _demand_layout(fig, tier=tier, at=at, future_at=future_at, price=price)
    return fig


def _forecast_band(
    fig: go.Figure,
    *,
    at: Sequence[datetime],
    demand: Sequence[int],
    future_at: Sequence[datetime],
    forecast: DemandForecast,
) -> None:
    # The band is drawn as upper then lower filled to it; joined to the last actual point
    # so the forecast visibly continues the history.
    xs = [at[-1], *future_at] if at else list(future_at)
    start = [float(demand[-1])] if at else []
    fig.add_trace(
        go.Scatter(
            x=xs,
            y=start + list(forecast.p90),
            mode="lines",
            line={"width": 0},
            showlegend=False,
            hoverinfo="skip",
            name="Band upper",
        )
    )
    fig.add_trace(
        go.Scatter(
            x=xs,
            y=start + list(forecast.p10),
            mode="lines",
            line={"width": 0},
            fill="tonexty",
            fillcolor="rgba(99, 110, 250, 0.2)",
            name=f"Likely range ({BAND_SHARE:.0f} % of rounds, P10 to P90)",
        )
    )
    fig.add_trace(
        go.Scatter(
            x=xs,
            y=start + list(forecast.p50),
            mode="lines",
            line={"dash": "dash"},
            name="Forecast",
        )
    )


def _demand_layout(
    fig: go.Figure,
    *,
    tier: str,
    at: Sequence[datetime],
    future_at: Sequence[datetime],
    price: Sequence[int | None],
) -> None:
    top_price = max((_credits(p) for p in price if p is not None), default=0.0)
    # As many forecast rounds in view as rounds of history: a day's forecast after three
    # rounds would squeeze the history into the left edge (the rest is a pan away).
    shown = [at[0], future_at[min(len(at), len(future_at)) - 1]] if at and future_at else None
    fig.update_layout(
        title=f"Demand forecast — {tier}",
        xaxis={
            "title": {"text": "Round window start (UTC)"},
            "type": "date",
            "tickformat": DATE_TICKS,
            **({"range": shown} if shown else {}),
        },
        yaxis={"title": {"text": "GPUs"}, "rangemode": "tozero"},
        yaxis2={
            "title": {"text": "Credits per GPU-hour"},
            "overlaying": "y",
            "side": "right",
            "rangemode": "tozero",
            "showgrid": False,
            # Headroom above the highest price, so a steady price is not drawn on the top edge.
            **({"range": [0, PRICE_HEADROOM * top_price]} if top_price else {}),
        },
        # Room on the right for the price axis; the legend below the axis title, in trace
        # order (plotly reverses it when a trace is filled).
        **(
            _LAYOUT
            | {
                "margin": {**_LAYOUT["margin"], "r": 70},
                "legend": {"orientation": "h", "y": -0.3, "traceorder": "normal"},
            }
        ),
    )
