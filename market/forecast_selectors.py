"""The reads behind the market page's demand forecast: each tier's history from the
database, and its forecast (the maths is in market/forecast.py) kept in the cache."""

from __future__ import annotations

import hashlib
import logging
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime

import numpy as np
from django.core.cache import cache

from core.ratelimit import CACHE_ERRORS
from market.forecast import DemandForecast, demand_forecast, rounds_per_day
from market.models import Bid, BidLimit, Round, Tier

logger = logging.getLogger(__name__)

# A forecast is a function of its history, which changes only when a round settles: the key
# holds the history itself, so a new round is a new key and no entry goes stale. A day keeps
# the entries of markets with rounds of up to a day.
FORECAST_CACHE_SECONDS = 24 * 3600

# Rounds whose bids are final: settlement has run, so no bid can be cancelled or edited any more.
HISTORY_STATUSES = (Round.Status.SETTLED, Round.Status.FINISHED)


@dataclass(frozen=True)
class TierHistory:
    """One tier over the same rounds, oldest first (all lists have one entry per round).

    ``demand``: GPUs asked for on the tier (a multi-tier bid split over its tiers). ``capacity``: GPUs the round
    offered on it, ``price``: its clearing price in milli-credits per GPU-hour (None where the
    round did not offer the tier).
    """

    tier: str
    rounds: list[int]
    starts_at: list[datetime]
    demand: list[float]
    capacity: list[int | None]
    price: list[int | None]


def demand_on_tier(quantity: int, tiers: int) -> float:
    """The one rule for a bid's demand on each tier it accepts, for the supply/demand chart
    and the demand forecast alike: a bid wants its GPUs once, not on every tier, so it counts
    its quantity divided by the number of the round's tiers it accepts on each of them, and
    demand over all tiers adds up to the GPUs asked for."""
    return quantity / max(tiers, 1)


def tier_demand_history(
    *, tier_slugs: Iterable[str] | None = None, rounds: int = 96
) -> dict[str, TierHistory]:
    """Demand, capacity and price per tier over the last ``rounds`` settled or finished rounds.

    Demand of a round on a tier is what the round's bids (cancelled bids excluded) asked for
    there, a bid that accepts several of the round's tiers split evenly over them
    (``demand_on_tier``), so demand summed over tiers is what was asked for. A round with no
    bid on a tier has demand 0 there. ``tier_slugs`` defaults to the active tiers. Two queries.
    """
    if rounds < 1:
        raise ValueError(f"rounds must be at least 1, got {rounds}")
    slugs = sorted(
        tier_slugs
        if tier_slugs is not None
        else Tier.objects.filter(active=True).values_list("slug", flat=True)
    )
    window = list(
        Round.objects.filter(status__in=HISTORY_STATUSES)
        .order_by("-starts_at")
        .values_list("pk", "starts_at", "capacities", "prices")[:rounds]
    )
    window.reverse()
    offered = {round_id: set(capacities or {}) for round_id, _, capacities, _ in window}
    rows = list(
        BidLimit.objects.filter(bid__round_id__in=list(offered))
        .exclude(bid__status=Bid.Status.CANCELLED)
        .values_list("bid_id", "bid__round_id", "tier__slug", "bid__quantity")
    )
    # A round stored before it recorded its capacities counts every tier a bid accepts.
    tiers_of: dict[int, int] = defaultdict(int)
    for bid_id, round_id, slug, _ in rows:
        if not offered[round_id] or slug in offered[round_id]:
            tiers_of[bid_id] += 1
    asked: dict[tuple[int, str], float] = defaultdict(float)
    for bid_id, round_id, slug, quantity in rows:
        if not offered[round_id] or slug in offered[round_id]:
            asked[round_id, slug] += demand_on_tier(quantity, tiers_of[bid_id])
    return {
        slug: TierHistory(
            tier=slug,
            rounds=[round_id for round_id, *_ in window],
            starts_at=[starts_at for _, starts_at, _, _ in window],
            demand=[asked.get((round_id, slug), 0) for round_id, *_ in window],
            capacity=[_int_or_none(capacities.get(slug)) for _, _, capacities, _ in window],
            price=[_int_or_none(prices.get(slug)) for _, _, _, prices in window],
        )
        for slug in slugs
    }


def _int_or_none(value: object) -> int | None:
    return None if value is None else int(value)


# The page's forecast: fitted on up to 21 days of rounds (at most 1,152 of them), shown with
# the last 4 days, one day ahead (6 to 48 rounds); none before a day of rounds has settled.
FORECAST_FIT_DAYS = 21
FORECAST_MAX_HISTORY = 1152
FORECAST_SHOWN_DAYS = 4
FORECAST_HORIZON = (6, 48)
FORECAST_MIN_ROUNDS = 3


@dataclass(frozen=True)
class ForecastSetup:
    """What the market page forecasts: the settled history per tier and the shape of it."""

    rounds_per_day: int
    horizon: int  # rounds ahead
    needed: int  # rounds of history before any forecast
    history: dict[str, TierHistory]

    @property
    def rounds(self) -> int:
        return len(next(iter(self.history.values())).rounds) if self.history else 0


def forecast_setup(round_minutes: int) -> ForecastSetup:
    day = rounds_per_day(round_minutes)
    return ForecastSetup(
        rounds_per_day=day,
        horizon=min(max(day, FORECAST_HORIZON[0]), FORECAST_HORIZON[1]),
        needed=max(day, FORECAST_MIN_ROUNDS),
        history=tier_demand_history(rounds=min(FORECAST_FIT_DAYS * day, FORECAST_MAX_HISTORY)),
    )


def demand_forecasts_warm(round_minutes: int) -> int:
    """Make and keep every tier's forecast the market page will ask for (a worker runs this
    after a round settles, so the page's first reader does not wait for the fits); returns
    how many tiers were forecast."""
    setup = forecast_setup(round_minutes)
    if setup.rounds < setup.needed:
        return 0
    for past in setup.history.values():
        tier_forecast(past.demand, horizon=setup.horizon, rounds_per_day=setup.rounds_per_day)
    return len(setup.history)


def tier_forecast(history: Sequence[float], *, horizon: int, rounds_per_day: int) -> DemandForecast:
    """``market.forecast.demand_forecast`` of one tier's ``history``, computed once per history:
    its fits and backtest take about a second a tier, and the page is read far more often than
    a round settles. Kept in the shared cache; when the cache cannot be reached the forecast is
    computed and the page still shows it."""
    y = np.asarray(history, dtype=float)
    digest = hashlib.sha256(y.tobytes()).hexdigest()
    key = f"market:demand-forecast:{horizon}:{rounds_per_day}:{digest}"
    try:
        forecast = cache.get(key)
    except CACHE_ERRORS as error:
        logger.warning("demand forecast not cached: cache unreachable (%s)", error)
        return demand_forecast(y, horizon=horizon, rounds_per_day=rounds_per_day)
    if forecast is None:
        forecast = demand_forecast(y, horizon=horizon, rounds_per_day=rounds_per_day)
        try:
            cache.set(key, forecast, FORECAST_CACHE_SECONDS)
        except CACHE_ERRORS as error:
            logger.warning("demand forecast not cached: cache unreachable (%s)", error)
    return forecast
