"""The platform's own mechanisms (welfare, fisher, maxmin) through ``market.clearing.clear``.

Each job is a standing order: its bid comes from ``market.orders.order_bid``, as the
platform's round opener makes it, for its whole gang (scale GPUs) with a value per GPU type
proportional to its throughput there, no spend limit, and the restart cost; a job whose gang
ran on a type in the previous round bids that type with the incumbency restart value added,
so the clearing moves it only for a larger gain. The simulator clears divisibly (time
fractions), so the gang minimum is left to the realisation: the bid enters with no minimum.
Its tenant is the job's tenant, with the tenant's weight. Only tenants with a job in the system take part, so an entitlement is a
share of the tenants contending, as on the platform (a tenant that does not bid in a round
is not in it). The round is cleared divisibly and the GPUs each job wins, divided by its
gang size, are its time fractions; the engine realises them into whole gangs the same way
as for Gavel's policies, so a comparison isolates the allocation policy.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from market import clearing
from market.clearing.instance import inputs
from market.orders import OrderBid, OrderState, order_bid
from market.simulator.errors import SimulationError
from market.simulator.policies.base import Fractions, Plan, View, limit_prices
from market.simulator.trace import Job

MILLI = 1000
NO_CEILING = 10**15  # milli-credits: jobs in the simulator have no spend limit


def job_bid(job: Job, view: View) -> OrderBid:
    """The standing order's bid for ``job`` this round (milli-credits per GPU-hour)."""
    running = view.running.get(job.id)
    bid = order_bid(
        OrderState(
            gpus=job.scale,
            min_gpus=job.scale,
            values=limit_prices(job, view.tiers),
            # Remaining work is steps, whose GPU-seconds depend on the type it runs on.
            gpu_seconds_wanted=None,
            gpu_seconds=0,
            ceiling=NO_CEILING,
            committed=0,
            restart_seconds=view.restart_seconds,
            incumbent={running: job.scale} if running is not None else {},
            reserves=dict(view.reserve),
        ),
        window_seconds=round(view.round_seconds),
    )
    if not isinstance(bid, OrderBid):
        raise SimulationError(f"job {job.id} made no bid: {bid.reason}")
    return bid


def _instance(view: View) -> inputs.Instance:
    """The round as the clearing package's instance; money in credits (its unit)."""
    tenants = sorted({job.tenant for job in view.jobs})
    bids = {job.id: job_bid(job, view) for job in view.jobs}
    return inputs.Instance(
        tiers=tuple(
            inputs.Tier(
                name=t,
                capacity=int(n),
                reserve_price=view.reserve.get(t, 0) / MILLI,
                max_share=view.max_share_pct.get(t, 100) / 100,
            )
            for t, n in view.tiers.items()
        ),
        # No budget: unlimited for the welfare policy, equal incomes for the Fisher market.
        tenants=tuple(inputs.Tenant(name=f"t{i}", weight=float(view.weights[i])) for i in tenants),
        bids=tuple(
            inputs.Bid(
                id=f"j{job.id:07d}",
                tenant=f"t{job.tenant}",
                quantity=float(bids[job.id].quantity),
                limits={t: p / MILLI for t, p in bids[job.id].limits.items()},
            )
            for job in view.jobs
        ),
    )


def mechanism(name: str) -> Callable[[View], Plan]:
    def plan(view: View) -> Plan:
        if not view.jobs:
            return Plan(fractions={}, prices={t: 0.0 for t in view.tiers})
        try:
            result: Any = clearing.clear(
                _instance(view),
                mechanism=name,
                params=dict(view.params) or None,
                divisible=True,
            )
        except clearing.ClearingError as exc:
            raise SimulationError(f"{name}: the clearing refused a simulated round: {exc}") from exc
        scale = {job.id: job.scale for job in view.jobs}
        fractions: Fractions = {}
        for allocation in result.allocations:
            job_id = int(allocation.bid[1:])
            if allocation.gpus > 0:
                fractions.setdefault(job_id, {})[allocation.tier] = (
                    float(allocation.gpus) / scale[job_id]
                )
        return Plan(
            fractions=fractions,
            prices={t: float(p) * MILLI for t, p in result.prices.items()},
        )

    plan.__name__ = name
    return plan
