"""Demand per tier per future round: the history's forecast (market/forecast.py, with its
backtest and P10/P50/P90) plus the campaigns teams declared, as known future demand. Pure, no
Django.

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

from market.forecast import DemandForecast, demand_forecast


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
    """One tier's demand over the future rounds: ``history`` (the forecast's P50) and
    ``campaigns`` (declared, per tenant) per round; ``total`` is their sum. The campaigns are
    known, so they add to every quantile: ``p10`` and ``p90`` of the total."""

    tier: str
    starts_at: tuple[datetime, ...]
    history: tuple[float, ...]
    campaigns: tuple[dict[str, float], ...]
    forecast: DemandForecast

    @property
    def total(self) -> tuple[float, ...]:
        return tuple(h + sum(c.values()) for h, c in zip(self.history, self.campaigns, strict=True))

    @property
    def p10(self) -> tuple[float, ...]:
        return self._with_campaigns(self.forecast.p10)

    @property
    def p90(self) -> tuple[float, ...]:
        return self._with_campaigns(self.forecast.p90)

    def _with_campaigns(self, base: Sequence[float]) -> tuple[float, ...]:
        return tuple(b + sum(c.values()) for b, c in zip(base, self.campaigns, strict=True))


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
    rounds_per_day: int,
    campaigns: Sequence[CampaignLoad] = (),
) -> TierDemand:
    """The next ``len(starts_at)`` rounds of ``tier``: forecast from ``history`` plus the
    declared campaigns. With no history the forecast part is 0 (``forecast.warning`` says
    so) and only the campaigns count."""
    horizon = len(starts_at)
    forecast = demand_forecast(history, horizon=horizon, rounds_per_day=rounds_per_day)
    base = forecast.p50
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
