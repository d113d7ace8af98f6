"""The cheapest mix of ways to add GPUs that keeps unmet demand and waits under targets.

One small mixed-integer program per tier (tiers do not share GPUs), solved with HiGHS through
cvxpy. For a tier with base capacity C and demand D_r GPUs in replayed round r (standing for
h_r hours):

    minimise    sum_k fixed_cost_k * n_k + sum_k,r hourly_k / eff_k * y_kr * h_r
    subject to  added_r = sum_fixed n_k + sum_elastic y_kr          (GPUs working in round r)
                u_r >= D_r - C - added_r,  u_r >= 0                  (unmet GPUs)
                sum_r u_r h_r <= max_unmet_pct / 100 * sum_r D_r h_r
                C + added_r >= D_r / (1 + max_wait_rounds)           (wait, see replay.py)
                0 <= y_kr <= eff_k n_k,  0 <= n_k <= max_gpus_k,  n_k integer

Purchase and reserved GPUs are there in every round and cost the same used or not: a purchase
costs its price spread over its amortisation months plus its power at the kWh price (the
option's power_kw, else the tier's metered mean draw) for every hour of the horizon; reserved
costs its hourly price for every hour of the horizon (the part of the term the horizon
covers). On-demand and spot are paid only for the GPU-hours used, and a spot GPU does
``1 - interruption_rate`` of a GPU's work (eff_k), so its work costs per_hour / eff_k.
Money in milli-credits throughout.
"""

from __future__ import annotations

import csv
import io
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import cvxpy as cp
import numpy as np

from planning.scenario import Option, Targets

HOURS_PER_MONTH = 730.0
FIXED = ("purchase", "reserved")


class RecommendError(ValueError):
    """No mix of the options meets the targets on a tier; the message says what to change."""


@dataclass(frozen=True)
class TierNeed:
    """``demand`` GPUs per replayed round, each standing for ``hours`` hours."""

    tier: str
    capacity: int
    demand: tuple[float, ...]
    hours: float
    power_kw: float = 0.0  # metered mean draw of one of the tier's GPUs

    @property
    def horizon_hours(self) -> float:
        return self.hours * len(self.demand)


@dataclass(frozen=True)
class PlanLine:
    tier: str
    kind: str
    gpus: int  # bought or reserved; for on-demand and spot, the most rented at once
    gpu_hours: float  # paid GPU-hours over the horizon
    cost: int  # milli-credits over the horizon


@dataclass(frozen=True)
class TierOutcome:
    tier: str
    cost: int
    unmet_pct: float
    worst_wait_rounds: float


@dataclass(frozen=True)
class Plan:
    lines: tuple[PlanLine, ...]
    tiers: tuple[TierOutcome, ...]
    targets: Targets

    @property
    def cost(self) -> int:
        return sum(line.cost for line in self.lines)


def _fixed_hourly(option: Option, *, kwh_price: int, power_kw: float) -> float:
    """Milli-credits per GPU per hour of the horizon for a purchase or reservation."""
    if option.kind == "purchase":
        power = option.power_kw if option.power_kw is not None else power_kw
        return option.price / (option.amortisation_months * HOURS_PER_MONTH) + power * kwh_price
    return float(option.per_hour)


def _efficiency(option: Option) -> float:
    return 1.0 - option.interruption_rate if option.kind == "spot" else 1.0


def tier_plan(
    need: TierNeed, options: Sequence[Option], *, targets: Targets, kwh_price: int
) -> tuple[list[PlanLine], TierOutcome]:
    """The cheapest mix for one tier; RecommendError if none meets the targets."""
    demand = np.asarray(need.demand, dtype=float)
    rounds = demand.size
    if rounds == 0:
        return [], TierOutcome(need.tier, 0, 0.0, 0.0)
    ours = [o for o in options if o.tier == need.tier]
    elastic = [o for o in ours if o.kind not in FIXED]
    most = [o.max_gpus if o.max_gpus is not None else 100_000 for o in ours]
    n = cp.Variable(len(ours), integer=True) if ours else None
    y = cp.Variable((len(elastic), rounds), nonneg=True) if elastic else None
    unmet = cp.Variable(rounds, nonneg=True)
    added = cp.Constant(np.zeros(rounds))
    cost = cp.Constant(0.0)
    constraints = []
    if n is not None:
        constraints += [n >= 0, n <= np.array(most, dtype=float)]
        for i, option in enumerate(ours):
            if option.kind in FIXED:
                hourly = _fixed_hourly(option, kwh_price=kwh_price, power_kw=need.power_kw)
                added = added + n[i]
                cost = cost + hourly * need.horizon_hours * n[i]
        for j, option in enumerate(elastic):
            i = ours.index(option)
            constraints.append(y[j, :] <= _efficiency(option) * n[i])
            added = added + y[j, :]
            cost = cost + option.per_hour / _efficiency(option) * need.hours * cp.sum(y[j, :])
    served = need.capacity + added
    constraints += [
        unmet >= demand - served,
        cp.sum(unmet) <= targets.max_unmet_pct / 100 * float(demand.sum()),
        served >= demand / (1 + targets.max_wait_rounds),
    ]
    problem = cp.Problem(cp.Minimize(cost / 1000), constraints)
    problem.solve(solver=cp.HIGHS)
    if problem.status not in (cp.OPTIMAL, cp.OPTIMAL_INACCURATE):
        offered = ", ".join(sorted({o.kind for o in ours})) or "none"
        raise RecommendError(
            f"tier {need.tier}: no mix of the options ({offered}) keeps unmet demand under "
            f"{targets.max_unmet_pct:g} % and waits under {targets.max_wait_rounds:g} rounds; "
            f"peak demand is {demand.max():.0f} GPUs against {need.capacity} — add an option "
            "for this tier, raise its max_gpus, or loosen the targets"
        )
    lines = []
    gpus_working = np.full(rounds, float(need.capacity))
    for i, option in enumerate(ours):
        count = int(round(float(n.value[i])))
        if option.kind in FIXED:
            hourly = _fixed_hourly(option, kwh_price=kwh_price, power_kw=need.power_kw)
            paid_hours = count * need.horizon_hours
            line_cost = int(round(hourly * paid_hours))
            gpus_working += count
        else:
            used = np.maximum(np.asarray(y.value[elastic.index(option)]), 0.0)
            gpus_working += used
            paid_hours = float(used.sum()) * need.hours / _efficiency(option)
            line_cost = int(round(option.per_hour * paid_hours))
            count = int(np.ceil(used.max() / _efficiency(option) - 1e-6)) if used.size else 0
        if count > 0 or paid_hours > 1e-6:
            lines.append(PlanLine(need.tier, option.kind, count, round(paid_hours, 1), line_cost))
    short = np.maximum(demand - gpus_working, 0.0)
    waits = np.where(demand > gpus_working, demand / np.maximum(gpus_working, 1e-9) - 1, 0.0)
    outcome = TierOutcome(
        tier=need.tier,
        cost=sum(line.cost for line in lines),
        unmet_pct=float(100 * short.sum() / demand.sum()) if demand.sum() > 0 else 0.0,
        worst_wait_rounds=float(waits.max()),
    )
    return lines, outcome


def recommend(
    needs: Sequence[TierNeed],
    options: Sequence[Option],
    *,
    targets: Targets,
    kwh_price: int,
) -> Plan:
    """The cheapest plan over every tier; RecommendError names the first tier that cannot
    meet the targets."""
    lines: list[PlanLine] = []
    outcomes: list[TierOutcome] = []
    for need in needs:
        tier_lines, outcome = tier_plan(need, options, targets=targets, kwh_price=kwh_price)
        lines += tier_lines
        outcomes.append(outcome)
    return Plan(lines=tuple(lines), tiers=tuple(outcomes), targets=targets)


def tradeoff_curve(
    needs: Sequence[TierNeed],
    options: Sequence[Option],
    *,
    targets: Targets,
    kwh_price: int,
    unmet_grid: Sequence[float] = (0, 1, 2, 5, 10, 20, 35, 50),
) -> list[tuple[float, int | None]]:
    """(allowed unmet %, cheapest cost) for each allowed share, the wait target kept; None
    where no mix meets it."""
    points: list[tuple[float, int | None]] = []
    for pct in unmet_grid:
        relaxed = Targets(max_unmet_pct=float(pct), max_wait_rounds=targets.max_wait_rounds)
        try:
            plan = recommend(needs, options, targets=relaxed, kwh_price=kwh_price)
        except RecommendError:
            points.append((float(pct), None))
        else:
            points.append((float(pct), plan.cost))
    return points


def plan_csv(plan: Plan, *, tier_names: Mapping[str, str] | None = None) -> str:
    """The plan as CSV: one line per option bought or rented, then the total; money in
    credits with three decimals."""
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(["tier", "option", "gpus", "gpu_hours", "cost_credits"])
    names = tier_names or {}
    for line in plan.lines:
        writer.writerow(
            [
                names.get(line.tier, line.tier),
                line.kind,
                line.gpus,
                f"{line.gpu_hours:.1f}",
                f"{line.cost / 1000:.3f}",
            ]
        )
    writer.writerow(["total", "", "", "", f"{plan.cost / 1000:.3f}"])
    return out.getvalue()
