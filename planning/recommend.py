"""The cheapest mix of ways to add GPUs that keeps unmet demand and waits under targets,
compared over the commitments' terms, not only over the horizon.

One small mixed-integer program per tier (tiers do not share GPUs), solved with HiGHS through
cvxpy. A purchase or reservation commits to its whole term (``amortisation_months`` or
``term_months``); a week of planning must not look cheap by charging only the week. So each
tier is costed over a comparison window W: the longest term among its fixed options (at least
the horizon H). The window is the horizon's replayed rounds r (demand D_r, each standing for
h hours) and, for the rest of the window (W - H hours), the recurring demand A_s: one typical
week (``TierNeed.after``; the horizon's demand when not given) weighted by
w = (W - H) / (the week's hours). A shorter-term fixed option is renewed to fill the window.
With base capacity C:

    minimise    sum_k fixed_hourly_k * W * n_k
                + sum_k,r hourly_k / eff_k * y_kr * h  +  w * sum_k,s hourly_k / eff_k * z_ks * h
    subject to  per block (the horizon's rounds with y, the recurring week's with z):
                added = sum_fixed n_k + sum_elastic y_k                 (GPUs working)
                u >= D - C - added,  u >= 0                              (unmet GPUs)
                sum u <= max_unmet_pct / 100 * sum D
                C + added >= D / (1 + max_wait_rounds)                   (wait, see replay.py)
                0 <= y_k <= eff_k n_k,  0 <= n_k <= max_gpus_k,  n_k integer

Purchase and reserved GPUs cost the same used or not: a purchase its price spread over its
amortisation months plus its power at the kWh price (the option's power_kw, else the tier's
metered mean draw) for every hour, a reservation its hourly price for every hour. On-demand
and spot are paid for the GPU-hours used; a spot GPU does ``1 - interruption_rate`` of a
GPU's work (eff_k), so its work costs per_hour / eff_k.

Each plan line shows its cost in the horizon; a fixed line also its whole commitment (hourly
x term hours x GPUs) and its break-even utilisation: the share of hours its GPUs must work
for it to cost less than renting the same work on demand (or the cheapest rental offered).
Spot can be interrupted and leave demand unserved, so each tier says whether its P90 demand
is covered by firm capacity (the tier's, the fixed options' and on-demand up to its
``max_gpus``), and by how many GPU-hours it is not. Money in milli-credits throughout.
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
    """``demand`` GPUs per replayed round of the horizon, each standing for ``hours`` hours;
    ``after`` the recurring demand of one typical week after the horizon, rounds of the same
    length (None: the horizon's demand recurs); ``p90`` per replayed round (empty: the
    demand)."""

    tier: str
    capacity: int
    demand: tuple[float, ...]
    hours: float
    power_kw: float = 0.0  # metered mean draw of one of the tier's GPUs
    after: tuple[float, ...] | None = None
    p90: tuple[float, ...] = ()

    @property
    def horizon_hours(self) -> float:
        return self.hours * len(self.demand)

    @property
    def recurring(self) -> tuple[float, ...]:
        return self.demand if self.after is None else self.after


@dataclass(frozen=True)
class PlanLine:
    """One option bought or rented on a tier. ``cost`` is what falls in the horizon; a
    purchase or reservation also has its whole ``commitment`` over ``term_months`` and the
    ``break_even_pct`` utilisation above which it is cheaper than renting (None: no rental
    offered to compare with)."""

    tier: str
    kind: str
    gpus: int  # bought or reserved; for on-demand and spot, the most rented at once
    gpu_hours: float  # paid GPU-hours over the horizon
    cost: int  # milli-credits over the horizon
    commitment: int | None = None  # milli-credits over the whole term (fixed options)
    term_months: int = 0
    break_even_pct: float | None = None


@dataclass(frozen=True)
class TierOutcome:
    """``window_cost`` is the whole comparison window's (``window_hours``) cost the program
    minimised; ``p90_uncovered_gpu_hours`` the P90 demand firm capacity cannot serve."""

    tier: str
    cost: int
    unmet_pct: float
    worst_wait_rounds: float
    window_hours: float = 0.0
    window_cost: int = 0
    p90_uncovered_gpu_hours: float = 0.0
    spot_gpu_hours: float = 0.0

    @property
    def p90_note(self) -> str:
        """What the plan says about P90 demand and spot's interruption risk."""
        if self.p90_uncovered_gpu_hours <= 0.05:
            return "P90 demand is covered by the tier, purchases, reservations and on-demand"
        risk = " if spot is interrupted" if self.spot_gpu_hours > 0 else ""
        return (
            f"P90 demand is NOT covered by firm capacity: {self.p90_uncovered_gpu_hours:,.0f} "
            f"GPU-hours would go unserved{risk}; raise on-demand's max_gpus or reserve more"
        )


@dataclass(frozen=True)
class Plan:
    lines: tuple[PlanLine, ...]
    tiers: tuple[TierOutcome, ...]
    targets: Targets

    @property
    def cost(self) -> int:
        return sum(line.cost for line in self.lines)

    @property
    def commitment(self) -> int:
        """Every purchase's and reservation's whole commitment, plus the horizon's rentals."""
        return sum(line.cost if line.commitment is None else line.commitment for line in self.lines)


def _fixed_hourly(option: Option, *, kwh_price: int, power_kw: float) -> float:
    """Milli-credits per GPU per hour of the term for a purchase or reservation."""
    if option.kind == "purchase":
        power = option.power_kw if option.power_kw is not None else power_kw
        return option.price / (option.amortisation_months * HOURS_PER_MONTH) + power * kwh_price
    return float(option.per_hour)


def _term_months(option: Option) -> int:
    return option.amortisation_months if option.kind == "purchase" else option.term_months


def _efficiency(option: Option) -> float:
    return 1.0 - option.interruption_rate if option.kind == "spot" else 1.0


def _break_even(hourly: float, elastic: Sequence[Option]) -> float | None:
    """Utilisation (%) above which a fixed GPU at ``hourly`` costs less than renting its work:
    on demand when offered, else the cheapest rental per GPU-hour of work."""
    on_demand = [o.per_hour for o in elastic if o.kind == "on_demand"]
    rates = on_demand or [o.per_hour / _efficiency(o) for o in elastic]
    return round(100 * hourly / min(rates), 1) if rates and min(rates) > 0 else None


@dataclass
class _Program:
    """The tier's program as it is built: variables, cost terms and constraints."""

    ours: list[Option]
    elastic: list[Option]
    n: cp.Variable | None
    cost: cp.Expression
    constraints: list


def _block(
    program: _Program,
    need: TierNeed,
    demand: np.ndarray,
    *,
    targets: Targets,
    weight: float,
) -> cp.Variable | None:
    """Add one block of rounds (the horizon, or the recurring week weighted ``weight`` times)
    and return its elastic use per option and round."""
    rounds = demand.size
    y = cp.Variable((len(program.elastic), rounds), nonneg=True) if program.elastic else None
    unmet = cp.Variable(rounds, nonneg=True)
    added = cp.Constant(np.zeros(rounds))
    n = program.n
    if n is not None:
        for i, option in enumerate(program.ours):
            if option.kind in FIXED:
                added = added + n[i]
        for j, option in enumerate(program.elastic):
            i = program.ours.index(option)
            program.constraints.append(y[j, :] <= _efficiency(option) * n[i])
            added = added + y[j, :]
            per_work = option.per_hour / _efficiency(option) * need.hours * weight
            program.cost = program.cost + per_work * cp.sum(y[j, :])
    served = need.capacity + added
    program.constraints += [
        unmet >= demand - served,
        cp.sum(unmet) <= targets.max_unmet_pct / 100 * float(demand.sum()),
        served >= demand / (1 + targets.max_wait_rounds),
    ]
    return y


def _window(need: TierNeed, ours: Sequence[Option]) -> float:
    """Hours the options are compared over: the longest fixed term, at least the horizon."""
    terms = [_term_months(o) * HOURS_PER_MONTH for o in ours if o.kind in FIXED]
    return max([need.horizon_hours, *terms])


def _infeasible(need: TierNeed, ours: Sequence[Option], targets: Targets) -> RecommendError:
    offered = ", ".join(sorted({o.kind for o in ours})) or "none"
    return RecommendError(
        f"tier {need.tier}: no mix of the options ({offered}) keeps unmet demand under "
        f"{targets.max_unmet_pct:g} % and waits under {targets.max_wait_rounds:g} rounds; "
        f"peak demand is {max(need.demand):.0f} GPUs against {need.capacity} — add an option "
        "for this tier, raise its max_gpus, or loosen the targets"
    )


def _solve(
    need: TierNeed, options: Sequence[Option], *, targets: Targets, kwh_price: int
) -> tuple[_Program, cp.Variable | None, float]:
    """Build and solve the tier's program; (program, horizon's elastic use, window hours)."""
    ours = [o for o in options if o.tier == need.tier]
    elastic = [o for o in ours if o.kind not in FIXED]
    window = _window(need, ours)
    n = cp.Variable(len(ours), integer=True) if ours else None
    program = _Program(ours, elastic, n, cp.Constant(0.0), [])
    if n is not None:
        most = [o.max_gpus if o.max_gpus is not None else 100_000 for o in ours]
        program.constraints += [n >= 0, n <= np.array(most, dtype=float)]
        for i, option in enumerate(ours):
            if option.kind in FIXED:
                hourly = _fixed_hourly(option, kwh_price=kwh_price, power_kw=need.power_kw)
                program.cost = program.cost + hourly * window * n[i]
    y = _block(program, need, np.asarray(need.demand, float), targets=targets, weight=1.0)
    recurring = np.asarray(need.recurring, dtype=float)
    rest = window - need.horizon_hours
    if rest > 0 and recurring.size:
        weight = rest / (recurring.size * need.hours)
        _block(program, need, recurring, targets=targets, weight=weight)
    problem = cp.Problem(cp.Minimize(program.cost / 1000), program.constraints)
    problem.solve(solver=cp.HIGHS)
    if problem.status not in (cp.OPTIMAL, cp.OPTIMAL_INACCURATE):
        raise _infeasible(need, ours, targets)
    return program, y, window


def _line(
    need: TierNeed,
    option: Option,
    program: _Program,
    count: int,
    used: np.ndarray | None,
    *,
    kwh_price: int,
) -> PlanLine:
    if option.kind in FIXED:
        hourly = _fixed_hourly(option, kwh_price=kwh_price, power_kw=need.power_kw)
        term = _term_months(option)
        return PlanLine(
            tier=need.tier,
            kind=option.kind,
            gpus=count,
            gpu_hours=round(count * need.horizon_hours, 1),
            cost=int(round(hourly * count * need.horizon_hours)),
            commitment=int(round(hourly * count * term * HOURS_PER_MONTH)),
            term_months=term,
            break_even_pct=_break_even(hourly, program.elastic),
        )
    assert used is not None
    paid_hours = float(used.sum()) * need.hours / _efficiency(option)
    most = int(np.ceil(used.max() / _efficiency(option) - 1e-6)) if used.size else 0
    return PlanLine(
        tier=need.tier,
        kind=option.kind,
        gpus=most,
        gpu_hours=round(paid_hours, 1),
        cost=int(round(option.per_hour * paid_hours)),
    )


def _p90_uncovered(need: TierNeed, ours: Sequence[Option], fixed_gpus: int) -> float:
    """GPU-hours of P90 demand beyond the tier, its fixed GPUs and on-demand's cap."""
    caps = [o.max_gpus for o in ours if o.kind == "on_demand"]
    if caps and None in caps:
        return 0.0
    firm = need.capacity + fixed_gpus + sum(c or 0 for c in caps)
    p90 = np.asarray(need.p90 or need.demand, dtype=float)
    return float(np.maximum(p90 - firm, 0.0).sum() * need.hours)


def tier_plan(
    need: TierNeed, options: Sequence[Option], *, targets: Targets, kwh_price: int
) -> tuple[list[PlanLine], TierOutcome]:
    """The cheapest mix for one tier over its comparison window; RecommendError if none meets
    the targets."""
    demand = np.asarray(need.demand, dtype=float)
    if demand.size == 0:
        return [], TierOutcome(need.tier, 0, 0.0, 0.0)
    program, y, window = _solve(need, options, targets=targets, kwh_price=kwh_price)
    lines = []
    working = np.full(demand.size, float(need.capacity))
    fixed_gpus = 0
    for i, option in enumerate(program.ours):
        count = int(round(float(program.n.value[i])))
        used = None
        if option.kind in FIXED:
            working += count
            fixed_gpus += count
        else:
            used = np.maximum(np.asarray(y.value[program.elastic.index(option)]), 0.0)
            working += used
        line = _line(need, option, program, count, used, kwh_price=kwh_price)
        if line.gpus > 0 or line.gpu_hours > 1e-6:
            lines.append(line)
    short = np.maximum(demand - working, 0.0)
    waits = np.where(demand > working, demand / np.maximum(working, 1e-9) - 1, 0.0)
    outcome = TierOutcome(
        tier=need.tier,
        cost=sum(line.cost for line in lines),
        unmet_pct=float(100 * short.sum() / demand.sum()) if demand.sum() > 0 else 0.0,
        worst_wait_rounds=float(waits.max()),
        window_hours=window,
        window_cost=int(round(float(program.cost.value))) if program.ours else 0,
        p90_uncovered_gpu_hours=_p90_uncovered(need, program.ours, fixed_gpus),
        spot_gpu_hours=sum(line.gpu_hours for line in lines if line.kind == "spot"),
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
