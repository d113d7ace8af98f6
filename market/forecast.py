"""Demand forecast per tier: statsmodels models picked per tier by a rolling-origin
backtest, with P10/P50/P90. Pure, no Django; the one forecasting entry point
(``demand_forecast``), used by the market page (``/market/``), planning's scenario runs and
``gpumarket forecast``. It sits in the market, to the left of planning, so both may import it.

History is one number per past round (GPUs, or GPU-hours per hour), oldest first, evenly
spaced; ``rounds_per_day`` rounds make a day and seven days a week. The candidates:

- ``seasonal_naive``: the same round a week earlier (a day earlier while the history is
  shorter than a week). The baseline every other model has to beat.
- ``ets``: statsmodels' exponential smoothing with an additive damped trend and an additive
  weekly season (ETS(A,Ad,A)); needs two weeks.
- ``mstl``: statsmodels' MSTL, daily and weekly seasons taken out by STL, the rest forecast
  with a damped trend and the last season of each added back; needs two weeks.
- ``combined``: the mean of the three forecasts above (each clipped at 0), an equal-weight
  forecast combination: no fit of its own, and steadier than any one of them where they
  are close.

With less than two weeks the weekly models use a daily season (needs two days), and a
warning says the weekly pattern cannot be seen. The backtest (``backtest_scores``) fits each
candidate on the history up to a few origins and scores it at 1 day, 1 week and 4 weeks
ahead: WAPE (sum of absolute errors over sum of demand) and MASE (mean absolute error over
the in-sample mean absolute error of the seasonal-naive rule). A 4-week origin needs four
weeks behind it: fitted on two or three, MSTL cannot yet see the weekly season well and its
4-week score says little about its fit on the whole history. The model with the least WAPE
averaged over the planning horizons (1 week and 4 weeks, those scored for every candidate;
the 1-day score only when neither is) is chosen; a tie goes to the simpler.
P10 and P90 are the chosen model's forecast plus the 10th and 90th percentiles of its own
backtest errors at the same lead (up to a day, up to a week, beyond); without a backtest, of
the seasonal-naive rule's in-sample errors. Demand is never negative: every quantile is
clipped at 0.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

SEASONAL_NAIVE = "seasonal_naive"
ETS = "ets"
MSTL = "mstl"
COMBINED = "combined"
FITTED = (SEASONAL_NAIVE, ETS, MSTL)  # the candidates fitted on their own; COMBINED averages them
MODELS = (*FITTED, COMBINED)  # simplest first: ties go to the earlier
LABELS = {
    SEASONAL_NAIVE: "seasonal naive",
    ETS: "ETS, damped trend",
    MSTL: "MSTL, daily + weekly",
    COMBINED: "mean of seasonal naive, ETS and MSTL",
}
# Backtest horizons in days, and how many rolling origins score each (a week apart).
HORIZON_DAYS = {"1 day": 1, "1 week": 7, "4 weeks": 28}
# The horizons the choice is made on (plans look a week to months ahead); "1 day" is scored
# and shown, and decides only when neither of these could be scored.
CHOICE_HORIZONS = ("1 week", "4 weeks")
# Days of history a 4-week backtest origin needs behind it (see the module docstring).
LONG_FIT_DAYS = 28
ORIGINS = 3
QUANTILES = (0.1, 0.9)


@dataclass(frozen=True)
class Score:
    """One model's backtest at one horizon: ``origins`` fits, each scored on the next
    ``rounds`` rounds it did not see. ``wape_pct`` is None when the scored demand was all 0."""

    model: str
    horizon: str
    rounds: int
    origins: int
    wape_pct: float | None
    mase: float | None


@dataclass(frozen=True)
class DemandForecast:
    """The next ``len(p50)`` rounds. ``model`` is the chosen candidate ("" with no history);
    ``scores`` the backtest of every candidate; ``warning`` says when the history is too
    short to trust (empty: fine)."""

    model: str
    season: str  # "weekly", "daily" or "none": the longest season the history can show
    p10: tuple[float, ...]
    p50: tuple[float, ...]
    p90: tuple[float, ...]
    scores: tuple[Score, ...] = ()
    history: int = 0
    warning: str = ""

    @property
    def label(self) -> str:
        return LABELS.get(self.model, "no forecast")

    def score(self, model: str, horizon: str) -> Score | None:
        return next((s for s in self.scores if s.model == model and s.horizon == horizon), None)

    def beside_baseline(self) -> list[tuple[Score, Score]]:
        """(the chosen model's score, the seasonal-naive rule's) at each backtest horizon
        where both have a WAPE, shortest first: whether the model beats the simplest rule."""
        pairs = []
        for label in HORIZON_DAYS:
            mine, base = self.score(self.model, label), self.score(SEASONAL_NAIVE, label)
            if mine and mine.wape_pct is not None and base and base.wape_pct is not None:
                pairs.append((mine, base))
        return pairs


def rounds_per_day(round_minutes: int) -> int:
    """The rounds in one day of a market with rounds of ``round_minutes`` (the daily season)."""
    if round_minutes < 1:
        raise ValueError(f"round length must be at least 1 minute, got {round_minutes}")
    return max(1, (24 * 60) // round_minutes)


def _season(n: int, day: int) -> tuple[str, int]:
    """The season the models use on ``n`` rounds: weekly with two weeks, else daily with two
    days, else none (period 1)."""
    if n >= 14 * day:
        return "weekly", 7 * day
    if n >= 2 * day and day > 1:
        return "daily", day
    return "none", 1


def _naive(y: np.ndarray, horizon: int, period: int) -> np.ndarray:
    """The last ``period`` rounds repeated; the last round when the history is shorter."""
    if not len(y):
        return np.zeros(horizon)
    last = y[-period:] if len(y) >= period else y[-1:]
    return np.resize(last, horizon)


def _damped(y: np.ndarray, horizon: int) -> np.ndarray:
    from statsmodels.tsa.holtwinters import ExponentialSmoothing

    if len(y) < 10:
        return np.full(horizon, float(y[-1]) if len(y) else 0.0)
    fit = ExponentialSmoothing(
        y, trend="add", damped_trend=True, initialization_method="estimated"
    ).fit(use_brute=False)
    return np.asarray(fit.forecast(horizon), dtype=float)


def _ets(y: np.ndarray, horizon: int, day: int) -> np.ndarray:
    from statsmodels.tsa.holtwinters import ExponentialSmoothing

    _, period = _season(len(y), day)
    # statsmodels' heuristic start needs 10 + 2 * (period // 2) rounds besides two seasons:
    # fewer, with long rounds, and the season cannot be started.
    if period == 1 or len(y) < 10 + 2 * (period // 2):
        return _damped(y, horizon)
    # The heuristic start (from the first seasons) instead of fitting a weekly season's 168
    # starting values, and no brute-force grid before the optimiser: ten times faster, the
    # same fit on our data (the smoothing washes the start out).
    fit = ExponentialSmoothing(
        y,
        trend="add",
        damped_trend=True,
        seasonal="add",
        seasonal_periods=period,
        initialization_method="heuristic",
    ).fit(use_brute=False)
    return np.asarray(fit.forecast(horizon), dtype=float)


def _mstl(y: np.ndarray, horizon: int, day: int) -> np.ndarray:
    from statsmodels.tsa.seasonal import MSTL as MSTLModel

    name, period = _season(len(y), day)
    wanted = (day, 7 * day) if name == "weekly" and day > 1 else (period,)
    # STL needs more than two of a period's cycles: a period that long is left out.
    periods = tuple(p for p in wanted if p > 1 and 2 * p < len(y))
    if not periods:
        return _damped(y, horizon)
    # STL's jumps (smooth every 7th point, interpolate between): seven times faster, and
    # the same fit to within noise on hourly data.
    jumps = {"seasonal_jump": 7, "trend_jump": 7, "low_pass_jump": 7}
    fit = MSTLModel(y, periods=periods, stl_kwargs=jumps).fit()
    seasonal = np.asarray(fit.seasonal, dtype=float).reshape(len(y), -1)
    ahead = _damped(np.asarray(fit.trend + fit.resid, dtype=float), horizon)
    for column, p in enumerate(periods):
        ahead = ahead + _naive(seasonal[:, column], horizon, p)
    return ahead


def model_forecast(model: str, history: Sequence[float], *, horizon: int, day: int) -> np.ndarray:
    """P50 of one candidate for the next ``horizon`` rounds (not clipped)."""
    y = np.asarray(history, dtype=float)
    if not len(y):
        return np.zeros(horizon)
    if model == COMBINED:
        members = [np.maximum(model_forecast(m, y, horizon=horizon, day=day), 0.0) for m in FITTED]
        return np.mean(members, axis=0)
    with warnings.catch_warnings():
        # statsmodels warns when an optimiser stops at its iteration limit; the backtest,
        # not the warning, says whether the fit is any good.
        warnings.simplefilter("ignore")
        if model == SEASONAL_NAIVE:
            return _naive(y, horizon, 7 * day if len(y) >= 7 * day else day)
        if model == ETS:
            return _ets(y, horizon, day)
        if model == MSTL:
            return _mstl(y, horizon, day)
    raise ValueError(f"unknown forecast model {model!r}; one of {', '.join(MODELS)}")


def _origins(n: int, *, day: int, rounds: int, least: int) -> list[int]:
    return [o for k in range(ORIGINS) if (o := n - rounds - 7 * day * k) >= least]


def _mase_scale(train: np.ndarray, day: int) -> float:
    period = 7 * day if len(train) > 7 * day else day
    if len(train) <= period:
        return 0.0
    return float(np.mean(np.abs(train[period:] - train[:-period])))


@dataclass(frozen=True)
class _Errors:
    """Per model: for each backtest horizon the (actual, predicted, MASE scale) per origin;
    and every error (actual - predicted) with its lead, for the intervals."""

    runs: dict[str, dict[str, list[tuple[np.ndarray, np.ndarray, float]]]]
    leads: dict[str, list[tuple[int, float]]]


def _backtest(y: np.ndarray, *, day: int, models: Sequence[str]) -> _Errors:
    # Every candidate is scored on the same origins: those with two weeks (or two days)
    # behind, and four weeks for the 4-week horizon.
    least = 14 * day if len(y) >= 14 * day + day else 2 * day
    plan: dict[int, int] = {}
    origins_of: dict[str, list[int]] = {}
    for label, days in HORIZON_DAYS.items():
        rounds = days * day
        behind = max(least, LONG_FIT_DAYS * day) if days >= LONG_FIT_DAYS else least
        origins_of[label] = _origins(len(y), day=day, rounds=rounds, least=behind)
        for o in origins_of[label]:
            plan[o] = max(plan.get(o, 0), rounds)
    runs: dict[str, dict[str, list]] = {m: {label: [] for label in HORIZON_DAYS} for m in models}
    leads: dict[str, list[tuple[int, float]]] = {m: [] for m in models}
    fitted = [m for m in FITTED if m in models or COMBINED in models]
    for o, rounds in sorted(plan.items()):
        train, future = y[:o], y[o : o + rounds]
        scale = _mase_scale(train, day)
        # Each fitted model once per origin; the combination is their mean, not a refit.
        ahead = {
            m: np.maximum(model_forecast(m, train, horizon=rounds, day=day), 0.0) for m in fitted
        }
        if COMBINED in models:
            ahead[COMBINED] = np.mean([ahead[m] for m in FITTED], axis=0)
        for m in models:
            predicted = ahead[m]
            leads[m] += list(zip(range(1, rounds + 1), (future - predicted).tolist(), strict=True))
            for label, days in HORIZON_DAYS.items():
                if o in origins_of[label]:
                    h = days * day
                    runs[m][label].append((future[:h], predicted[:h], scale))
    return _Errors(runs=runs, leads=leads)


def _scores(errors: _Errors, day: int) -> list[Score]:
    out = []
    for model, by_horizon in errors.runs.items():
        for label, runs in by_horizon.items():
            if not runs:
                continue
            actual = np.concatenate([a for a, _, _ in runs])
            absolute = np.concatenate([np.abs(a - p) for a, p, _ in runs])
            mases = [float(np.mean(np.abs(a - p))) / s for a, p, s in runs if s > 0]
            total = float(actual.sum())
            out.append(
                Score(
                    model=model,
                    horizon=label,
                    rounds=HORIZON_DAYS[label] * day,
                    origins=len(runs),
                    wape_pct=100 * float(absolute.sum()) / total if total > 0 else None,
                    mase=sum(mases) / len(mases) if mases else None,
                )
            )
    return out


def backtest_scores(
    history: Sequence[float], *, rounds_per_day: int, models: Sequence[str] = MODELS
) -> list[Score]:
    """Every candidate's rolling-origin backtest on ``history`` (see the module docstring)."""
    y = np.asarray(history, dtype=float)
    return _scores(_backtest(y, day=rounds_per_day, models=models), rounds_per_day)


def choose_model(scores: Sequence[Score]) -> str:
    """The candidate with the least mean WAPE over the planning horizons (CHOICE_HORIZONS)
    scored for every candidate, or over the 1-day horizon when neither is; a tie goes to the
    simpler. The 1-day score is left out of the choice when a longer one exists: it rests on
    three days and ranks the models by how they follow the last hours, not the weeks ahead."""
    models = {s.model for s in scores}
    wape: dict[tuple[str, str], float] = {
        (s.model, s.horizon): s.wape_pct for s in scores if s.wape_pct is not None
    }

    def complete(horizons: Sequence[str]) -> list[str]:
        return [h for h in horizons if all((m, h) in wape for m in models)]

    horizons = complete(CHOICE_HORIZONS) or complete(list(HORIZON_DAYS))
    if not models or not horizons:
        return SEASONAL_NAIVE
    return min(
        models,
        key=lambda m: (
            round(sum(wape[m, h] for h in horizons) / len(horizons), 6),
            MODELS.index(m),
        ),
    )


def _bucket(lead: int, day: int) -> int:
    return 0 if lead <= day else 1 if lead <= 7 * day else 2


def _bands(
    y: np.ndarray, errors: list[tuple[int, float]], horizon: int, day: int
) -> tuple[np.ndarray, np.ndarray]:
    """(P10 offset, P90 offset) per lead from the backtest's errors at like leads."""
    by_bucket: dict[int, list[float]] = {0: [], 1: [], 2: []}
    for lead, error in errors:
        by_bucket[_bucket(lead, day)].append(error)
    if not any(by_bucket.values()):
        _, period = _season(len(y), day)
        period = min(max(period, 1), max(len(y) - 1, 1))
        fallback = (y[period:] - y[:-period]).tolist() if len(y) > period else [0.0]
        by_bucket = {0: fallback, 1: fallback, 2: fallback}
    low, high = np.zeros(horizon), np.zeros(horizon)
    known = [b for b in (0, 1, 2) if by_bucket[b]]
    for lead in range(1, horizon + 1):
        bucket = _bucket(lead, day)
        # A lead beyond what was scored takes the longest scored lead's spread.
        shorter = [b for b in known if b <= bucket]
        use = shorter[-1] if shorter else known[0]
        q = np.quantile(by_bucket[use], QUANTILES)
        low[lead - 1], high[lead - 1] = min(q[0], 0.0), max(q[1], 0.0)
    return low, high


def _warning(n: int, day: int) -> str:
    if n == 0:
        return (
            "no demand history: the forecast is 0 and only declared campaigns count; "
            "this is not evidence that nothing is needed"
        )
    if n < 14 * day:
        days = n / day
        return (
            f"only {days:.1f} days of history: a weekly pattern needs two weeks and the "
            "4-week backtest eight, so the forecast cannot be checked at the horizons plans use"
        )
    if n < 2 * LONG_FIT_DAYS * day:
        return (
            f"{n / day:.0f} days of history: the 4-week backtest needs eight weeks (four to "
            "fit, four to score)"
        )
    return ""


def demand_forecast(
    history: Sequence[float], *, horizon: int, rounds_per_day: int
) -> DemandForecast:
    """The one forecast: backtest every candidate, keep the best at this horizon, forecast
    with it, and put P10/P90 around it from its own backtest errors."""
    if horizon < 1:
        raise ValueError(f"forecast horizon must be at least 1 round, got {horizon}")
    if rounds_per_day < 1:
        raise ValueError(f"rounds per day must be at least 1, got {rounds_per_day}")
    y = np.asarray(history, dtype=float)
    if y.ndim != 1 or not np.all(np.isfinite(y)):
        raise ValueError("demand history must be a flat sequence of finite numbers")
    day = rounds_per_day
    season, _ = _season(len(y), day)
    if not len(y):
        zeros = (0.0,) * horizon
        return DemandForecast(
            model="", season=season, p10=zeros, p50=zeros, p90=zeros, warning=_warning(0, day)
        )
    errors = _backtest(y, day=day, models=MODELS)
    scores = _scores(errors, day)
    model = choose_model(scores)
    p50 = np.maximum(model_forecast(model, y, horizon=horizon, day=day), 0.0)
    low, high = _bands(y, errors.leads[model], horizon, day)
    return DemandForecast(
        model=model,
        season=season,
        p10=tuple(float(v) for v in np.maximum(p50 + low, 0.0)),
        p50=tuple(float(v) for v in p50),
        p90=tuple(float(v) for v in p50 + high),
        scores=tuple(scores),
        history=len(y),
        warning=_warning(len(y), day),
    )
