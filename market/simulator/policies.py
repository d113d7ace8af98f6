"""Who gets which GPUs in one simulated round: the market's own clearing, or a FCFS baseline.

Every policy is a function with the same keyword arguments returning a ``RoundAllocation``;
``POLICIES`` maps the names the CLI accepts to them.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from market import clearing
from market.clearing import inputs
from market.simulator.errors import SimulationError
from market.simulator.trace import Job

Tiers = dict[str, int]  # GPU type -> GPUs offered
MILLI = 1000


@dataclass(frozen=True)
class Demand:
    """A job's bid for one round: its whole gang, at a limit per GPU type."""

    job: Job
    limits: dict[str, int]  # milli-credits per GPU-hour
    weight: int = 1


@dataclass(frozen=True)
class RoundAllocation:
    gpus: dict[int, dict[str, float]]  # job id -> {GPU type: GPUs}
    prices: dict[str, float]  # milli-credits per GPU-hour
    charges: dict[int, int]  # job id -> milli-credits for the round
    notes: tuple[str, ...] = field(default=())


def fcfs(
    *,
    demands: list[Demand],
    tiers: Tiers,
    hours: float,
    reserve: Mapping[str, int],
    **_: Any,
) -> RoundAllocation:
    """First come, first served: in arrival order each job takes what it needs (up to its
    gang) from the free GPUs, fastest type first. No auction: a job pays the reserve price."""
    free = {t: float(n) for t, n in tiers.items()}
    gpus: dict[int, dict[str, float]] = {}
    charges: dict[int, int] = {}
    for demand in sorted(demands, key=lambda d: (d.job.arrival, d.job.id)):
        job = demand.job
        want = float(job.scale)
        got: dict[str, float] = {}
        for gpu_type in sorted(tiers, key=lambda t: (-job.throughput[t], t)):
            take = min(want, free[gpu_type])
            if take > 0:
                got[gpu_type] = take
                free[gpu_type] -= take
                want -= take
            if want <= 0:
                break
        if got:
            gpus[job.id] = got
            charge = round(sum(reserve.get(t, 0) * x * hours for t, x in got.items()))
            if charge:
                charges[job.id] = charge
    return RoundAllocation(
        gpus=gpus, prices={t: float(reserve.get(t, 0)) for t in tiers}, charges=charges
    )


def _instance(
    *,
    demands: list[Demand],
    tiers: Tiers,
    tenants: int,
    weights: tuple[int, ...],
    reserve: Mapping[str, int],
    max_share_pct: Mapping[str, int],
    divisible: bool,
) -> inputs.Instance:
    """The round as the clearing package's instance; money in credits (its unit)."""
    return inputs.Instance(
        tiers=tuple(
            inputs.Tier(
                name=t,
                capacity=int(n),
                reserve_price=reserve.get(t, 0) / MILLI,
                max_share=max_share_pct.get(t, 100) / 100,
            )
            for t, n in tiers.items()
        ),
        # No budget: unlimited for the welfare policy, equal incomes for the Fisher market.
        tenants=tuple(
            inputs.Tenant(name=f"t{i}", weight=float(weights[i])) for i in range(tenants)
        ),
        bids=tuple(
            inputs.Bid(
                id=f"j{d.job.id:07d}",
                tenant=f"t{d.job.tenant}",
                quantity=float(d.job.scale),
                limits={t: p / MILLI for t, p in d.limits.items()},
                min_quantity=0.0 if divisible else float(d.job.scale),
            )
            for d in demands
        ),
    )


def _from_result(result: Any, *, hours: float) -> RoundAllocation:
    gpus: dict[int, dict[str, float]] = {}
    for allocation in result.allocations:
        if allocation.gpus > 0:
            gpus.setdefault(int(allocation.bid[1:]), {})[allocation.tier] = float(allocation.gpus)
    return RoundAllocation(
        gpus=gpus,
        prices={t: float(p) * MILLI for t, p in result.prices.items()},
        # The clearing charges credits per hour of the window; the round lasts ``hours``.
        charges={
            int(bid[1:]): round(float(c) * MILLI * hours) for bid, c in result.charges.items()
        },
    )


def _solver(mechanism: str) -> Callable[..., RoundAllocation]:
    def allocate(
        *,
        demands: list[Demand],
        tiers: Tiers,
        hours: float,
        tenants: int,
        weights: tuple[int, ...],
        reserve: Mapping[str, int],
        max_share_pct: Mapping[str, int],
        params: Mapping[str, Any],
        divisible: bool,
    ) -> RoundAllocation:
        instance = _instance(
            demands=demands,
            tiers=tiers,
            tenants=tenants,
            weights=weights,
            reserve=reserve,
            max_share_pct=max_share_pct,
            divisible=divisible,
        )
        try:
            result = clearing.clear(
                instance, policy=mechanism, params=dict(params) or None, divisible=divisible
            )
        except clearing.ClearingError as exc:
            raise SimulationError(
                f"{mechanism}: the clearing refused a simulated round: {exc}"
            ) from exc
        return _from_result(result, hours=hours)

    allocate.__name__ = mechanism
    allocate.__doc__ = f"The market's own clearing under the {mechanism!r} policy."
    return allocate


POLICIES: dict[str, Callable[..., RoundAllocation]] = {
    "welfare": _solver("welfare"),
    "fisher": _solver("fisher"),
    "maxmin": _solver("maxmin"),
    "fcfs": fcfs,
}
