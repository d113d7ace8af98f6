"""Demand per tier per future round: the history's forecast plus the campaigns teams declared;
and a backtest that says how far the history part can be trusted. Pure, no Django.

History is one number per past round (GPUs bid on the tier), oldest first, as
market.forecast_selectors gives it. A declared campaign of G GPU-hours between two times
needs G / (its length in hours) GPUs at once while it runs; that is added to every future
round its span overlaps, in proportion to the overlap, split evenly over its acceptable
tiers (it will run on one of them, and which is not known: the same even split the
supply/demand chart uses for a bid on several tiers).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

from market.forecast import Forecast, demand_forecast


@dataclass(frozen=True)
class CampaignLoad:
    """A declared campaign as planning reads it. ``priority`` 1 (low) to 3 (high)."""

    tenant: str
    name: str
    starts_at: datetime
    ends_at: datetime
    gpu_hours: int
    tiers: tuple[str, ...]
    priority: int = 2

    @property
    def gpus(self) -> float:
        """GPUs needed at once, if the GPU-hours are spread over the whole span."""
        hours = (self.ends_at - self.starts_at).total_seconds() / 3600
        return self.gpu_hours / hours


@dataclass(frozen=True)
class TierDemand:
    """One tier's demand over the future rounds: ``history`` (the forecast's mean) and
    ``campaigns`` (declared, per tenant) per round; ``total`` is their sum."""

    tier: str
    starts_at: tuple[datetime, ...]
    history: tuple[float, ...]
    campaigns: tuple[dict[str, float], ...]
    forecast: Forecast

    @property
    def total(self) -> tuple[float, ...]:
        return tuple(h + sum(c.values()) for h, c in zip(self.history, self.campaigns, strict=True))


def campaign_gpus(
    campaign: CampaignLoad, *, tier: str, start: datetime, round_length: timedelta
) -> float:
    """GPUs ``campaign`` adds on ``tier`` to the round starting at ``start``."""
    if tier not in campaign.tiers:
        return 0.0
    end = start + round_length
    overlap = (min(end, campaign.ends_at) - max(start, campaign.starts_at)).total_seconds()
    if overlap <= 0:
        return 0.0
    return campaign.gpus * overlap / round_length.total_seconds() / len(campaign.tiers)


def tier_demand(
    *,
    tier: str,
    history: Sequence[float],
    starts_at: Sequence[datetime],
    round_length: timedelta,
    season_length: int,
    campaigns: Sequence[CampaignLoad] = (),
) -> TierDemand:
    """The next ``len(starts_at)`` rounds of ``tier``: forecast from ``history`` plus the
    declared campaigns. With too little history the forecast part is 0 (``forecast.reason``
    says why) and only the campaigns count."""
    horizon = len(starts_at)
    forecast = demand_forecast(history, horizon=horizon, season_length=season_length)
    base = forecast.mean if forecast.mean else (0.0,) * horizon
    per_round = tuple(
        {
            c.tenant: gpus
            for c in campaigns
            if (gpus := campaign_gpus(c, tier=tier, start=start, round_length=round_length)) > 0
        }
        for start in starts_at
    )
    return TierDemand(
        tier=tier,
        starts_at=tuple(starts_at),
        history=tuple(float(x) for x in base),
        campaigns=per_round,
        forecast=forecast,
    )


@dataclass(frozen=True)
class Backtest:
    """The forecast scored on rounds it did not see. ``mape_pct`` is over the held-out rounds
    with demand above zero (a percentage error of a zero is undefined); None, with ``reason``,
    when there is nothing to score."""

    holdout: int
    trained_on: int
    actual: tuple[float, ...] = ()
    predicted: tuple[float, ...] = ()
    mape_pct: float | None = None
    mae: float | None = None
    reason: str = ""


def backtest(history: Sequence[float], *, season_length: int, holdout: int) -> Backtest:
    """Fit on all but the last ``holdout`` rounds, forecast those, and score the forecast."""
    if holdout < 1:
        raise ValueError("holdout must be at least 1")
    seen, unseen = list(history[:-holdout]), [float(x) for x in history[-holdout:]]
    if len(history) <= holdout:
        return Backtest(
            holdout=holdout,
            trained_on=0,
            reason=f"needs more than {holdout} rounds of history to hold {holdout} out",
        )
    forecast = demand_forecast(seen, horizon=holdout, season_length=season_length)
    if not forecast.mean:
        return Backtest(holdout=holdout, trained_on=len(seen), reason=forecast.reason)
    predicted = tuple(float(x) for x in forecast.mean)
    errors = [abs(p - a) for p, a in zip(predicted, unseen, strict=True)]
    scored = [abs(p - a) / a for p, a in zip(predicted, unseen, strict=True) if a > 0]
    return Backtest(
        holdout=holdout,
        trained_on=len(seen),
        actual=tuple(unseen),
        predicted=predicted,
        mape_pct=100 * sum(scored) / len(scored) if scored else None,
        mae=sum(errors) / len(errors),
        reason="" if scored else "every held-out round had zero demand: no percentage error",
    )
