"""Queue baselines: whole gangs, no preemption, a priority order.

Each round, gangs already running keep their GPUs until they finish (as in Slurm without
preemption, and Gavel's FIFO); then the waiting jobs, in priority order, each take their
whole gang on the fastest GPU type with that many free GPUs. A job that fits nowhere is
skipped and a later one may start (first fit, a simple stand-in for backfill). The plan is
0/1 time fractions, so realising it places exactly these gangs.

- FIFO: priority = arrival order.
- fair-share (Slurm's multifactor plugin, classic fair-share factor): priority =
  2^(-U_i / S_i) of the job's tenant i, with U_i its share of all decayed past usage
  (GPU-seconds, halved every ``half_life_hours``, Slurm's PriorityDecayHalfLife, 7 days by
  default) and S_i its normalised share (weight / total weight). Ties go to the older job.
"""

from __future__ import annotations

from collections.abc import Callable

from market.simulator.policies.base import Fractions, Plan, View, reserve_prices
from market.simulator.trace import Job

DEFAULT_HALF_LIFE_HOURS = 7 * 24.0


def _queue(view: View, order: Callable[[Job], tuple[float, ...]]) -> Plan:
    free = dict(view.tiers)
    fractions: Fractions = {}
    waiting: list[Job] = []
    for job in view.jobs:
        placed = view.running.get(job.id)
        if placed is not None and free[placed] >= job.scale:
            fractions[job.id] = {placed: 1.0}
            free[placed] -= job.scale
        else:
            waiting.append(job)
    for job in sorted(waiting, key=order):
        for gpu_type in sorted(view.tiers, key=lambda t: (-job.throughput[t], t)):
            if job.throughput[gpu_type] > 0 and free[gpu_type] >= job.scale:
                fractions[job.id] = {gpu_type: 1.0}
                free[gpu_type] -= job.scale
                break
    return Plan(fractions=fractions, prices=reserve_prices(view))


def fifo(view: View) -> Plan:
    return _queue(view, lambda job: (job.arrival, job.id))


def fair_share_factor(view: View) -> dict[int, float]:
    """Slurm's classic fair-share factor 2^(-U/S) for each tenant with a job in the system
    (1 for a tenant with no usage)."""
    total_usage = sum(view.usage.values())
    total_weight = float(sum(view.weights))
    factors: dict[int, float] = {}
    for tenant in {job.tenant for job in view.jobs}:
        used = view.usage.get(tenant, 0.0) / total_usage if total_usage > 0 else 0.0
        factors[tenant] = 2.0 ** (-used / (view.weights[tenant] / total_weight))
    return factors


def fair_share(view: View) -> Plan:
    factors = fair_share_factor(view)
    return _queue(view, lambda job: (-factors[job.tenant], job.arrival, job.id))
