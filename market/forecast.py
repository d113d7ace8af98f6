"""Demand forecast per tier: additive Holt-Winters fitted by grid search (pure, numpy only).

Input is one number per past round (GPUs asked for on a tier), oldest first. The model is
additive Holt-Winters (level, trend, seasonal with a period of ``season_length`` rounds), its
smoothing parameters picked from a small fixed grid by the smallest sum of squared one-step-ahead
errors. With fewer than two seasons of history the seasonal indices cannot be estimated, so
simple exponential smoothing is fitted instead; with fewer than ``MIN_ROUNDS`` rounds there is
no forecast at all. The method, the reason it was chosen and the fitted parameters are returned
with the numbers so a page can say what it shows. See docs/market.md, "Demand forecast".
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

HOLT_WINTERS = "holt_winters_additive"
SIMPLE = "simple_exponential_smoothing"
NONE = "none"
METHOD_LABELS = {
    HOLT_WINTERS: "Holt-Winters (additive)",
    SIMPLE: "simple exponential smoothing",
    NONE: "no forecast",
}

MIN_ROUNDS = 3
# 1.96 standard deviations: a two-sided 95% band if the one-step errors were normal.
BAND_Z = 1.96

# The search grid. Small on purpose: every combination is run as one vectorised pass, and a
# finer grid mostly fits noise on the few hundred rounds a page looks at.
ALPHAS = (0.05, 0.1, 0.2, 0.3, 0.5, 0.7, 0.9)
BETAS = (0.0, 0.01, 0.05, 0.1, 0.2)
GAMMAS = (0.05, 0.1, 0.2, 0.3, 0.5)


@dataclass(frozen=True)
class Forecast:
    """The next ``len(mean)`` rounds' demand, in GPUs, with a band of +/- BAND_Z x ``sigma``.

    ``method`` is HOLT_WINTERS, SIMPLE or NONE (then ``mean`` is empty and ``reason`` says
    why); ``params`` holds the fitted alpha (and beta, gamma, season_length for Holt-Winters).
    Forecast and band are clipped at 0: demand is never negative.
    """

    method: str
    reason: str
    mean: tuple[float, ...] = ()
    lower: tuple[float, ...] = ()
    upper: tuple[float, ...] = ()
    sigma: float = 0.0
    params: dict[str, float] = field(default_factory=dict)
    history: int = 0

    @property
    def label(self) -> str:
        return METHOD_LABELS[self.method]


def rounds_per_day(round_minutes: int) -> int:
    """The natural season of a market with rounds of ``round_minutes``: rounds in one day."""
    if round_minutes < 1:
        raise ValueError(f"round length must be at least 1 minute, got {round_minutes}")
    return max(1, (24 * 60) // round_minutes)


def demand_forecast(history: Sequence[float], *, horizon: int, season_length: int) -> Forecast:
    """Forecast the next ``horizon`` rounds from ``history`` (oldest first, one value a round).

    Holt-Winters needs two full seasons (``2 * season_length`` rounds, and a season of at least
    2 rounds) to start its seasonal indices and trend; shorter histories get simple exponential
    smoothing, and fewer than MIN_ROUNDS rounds get no forecast. Deterministic: ties in the grid
    search go to the first combination in (alpha, beta, gamma) order.
    """
    if horizon < 1:
        raise ValueError(f"forecast horizon must be at least 1 round, got {horizon}")
    if season_length < 1:
        raise ValueError(f"season length must be at least 1 round, got {season_length}")
    y = np.asarray(history, dtype=float)
    if y.ndim != 1 or not np.all(np.isfinite(y)):
        raise ValueError("demand history must be a flat sequence of finite numbers")
    n = len(y)
    if n < MIN_ROUNDS:
        return Forecast(
            method=NONE,
            reason=f"needs at least {MIN_ROUNDS} settled rounds; there {_were(n)}",
            history=n,
        )
    if season_length < 2:
        return _simple(y, horizon, reason="a season of 1 round has no seasonal pattern")
    if n < 2 * season_length:
        return _simple(
            y,
            horizon,
            reason=(
                f"{n} rounds are fewer than two seasons of {season_length}; "
                "the seasonal pattern needs two"
            ),
        )
    return _holt_winters(y, horizon, season_length)


def _were(n: int) -> str:
    return "was 1" if n == 1 else f"were {n}"


def _band(mean: np.ndarray, sigma: float) -> tuple[tuple[float, ...], ...]:
    mean = np.maximum(mean, 0.0)
    lower = np.maximum(mean - BAND_Z * sigma, 0.0)
    upper = mean + BAND_Z * sigma
    return tuple(map(float, mean)), tuple(map(float, lower)), tuple(map(float, upper))


def _simple(y: np.ndarray, horizon: int, *, reason: str) -> Forecast:
    """Simple exponential smoothing, level started at the first value; errors from round 2."""
    alphas = np.asarray(ALPHAS)
    level = np.full(len(alphas), y[0])
    sse = np.zeros(len(alphas))
    for value in y[1:]:
        error = value - level
        sse += error * error
        level = level + alphas * error
    best = int(np.argmin(sse))
    sigma = math.sqrt(sse[best] / (len(y) - 1))
    mean, lower, upper = _band(np.full(horizon, level[best]), sigma)
    return Forecast(
        method=SIMPLE,
        reason=reason,
        mean=mean,
        lower=lower,
        upper=upper,
        sigma=sigma,
        params={"alpha": ALPHAS[best]},
        history=len(y),
    )


def _holt_winters_start(y: np.ndarray, m: int) -> tuple[float, float, np.ndarray]:
    """Level (at the round before the first), trend and seasonal indices from two seasons.

    Each season's mean sits at its middle, (m - 1) / 2 rounds in; the trend is the step between
    the two means per round, the level is walked back from the first mean to round -1, and the
    indices are what is left of each round once level and trend are taken out, averaged over
    the two seasons and centred so they sum to zero (the level carries the mean).
    """
    first, second = y[:m].mean(), y[m : 2 * m].mean()
    trend = (second - first) / m
    level = first - trend * (m + 1) / 2
    t = np.arange(2 * m)
    detrended = y[: 2 * m] - (level + trend * (t + 1))
    season = detrended.reshape(2, m).mean(axis=0)
    return level, trend, season - season.mean()


def _holt_winters(y: np.ndarray, horizon: int, m: int) -> Forecast:
    grid = np.array(list(itertools.product(ALPHAS, BETAS, GAMMAS)))
    alpha, beta, gamma = grid[:, 0], grid[:, 1], grid[:, 2]
    level0, trend0, season0 = _holt_winters_start(y, m)
    # One row per grid point: all combinations advance together, one round at a time.
    level = np.full(len(grid), level0)
    trend = np.full(len(grid), trend0)
    season = np.tile(season0, (len(grid), 1))
    sse = np.zeros(len(grid))
    for t, value in enumerate(y):
        i = t % m
        error = value - (level + trend + season[:, i])
        sse += error * error
        new_level = alpha * (value - season[:, i]) + (1 - alpha) * (level + trend)
        trend = beta * (new_level - level) + (1 - beta) * trend
        season[:, i] = gamma * (value - new_level) + (1 - gamma) * season[:, i]
        level = new_level
    best = int(np.argmin(sse))
    steps = np.arange(1, horizon + 1)
    ahead = level[best] + steps * trend[best] + season[best, (len(y) + steps - 1) % m]
    # Three smoothing parameters were fitted; the rest of the rounds are degrees of freedom.
    sigma = math.sqrt(sse[best] / max(len(y) - 3, 1))
    mean, lower, upper = _band(ahead, sigma)
    return Forecast(
        method=HOLT_WINTERS,
        reason=f"{len(y)} rounds cover at least two seasons of {m}",
        mean=mean,
        lower=lower,
        upper=upper,
        sigma=sigma,
        params={
            "alpha": float(alpha[best]),
            "beta": float(beta[best]),
            "gamma": float(gamma[best]),
            "season_length": float(m),
        },
        history=len(y),
    )
