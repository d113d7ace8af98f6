"""Finish-time fairness (Themis, Mahajan et al., NSDI'20), as Gavel's policy formulates it.

rho_m(X) = (t_m + R_m / throughput(m, X)) / (I_m + R_m / E_m): the time job m will have
spent in the system if it keeps allocation X (t_m so far, R_m steps left) over the time it
would take on an equal 1/M share of the cluster (E_m steps/s; I_m is the isolated time its
completed steps would have taken, accumulated across recomputations as the share changed).
Minimise max_m rho_m(X) over the time-fraction polytope: convex, since R_m / throughput is
an inverse of an affine function; solved with cvxpy and Clarabel.
"""

from __future__ import annotations

import cvxpy as cp
import numpy as np

from market.simulator.errors import SimulationError
from market.simulator.policies.base import Plan, View, equal_share_rate, reserve_prices
from market.simulator.policies.lp import polytope


class FinishTimeFairness:
    """A planner with memory: the isolated time each job has accumulated so far."""

    def __init__(self) -> None:
        self._isolated_seconds: dict[int, float] = {}
        self._last: dict[int, tuple[float, float]] = {}  # job -> (steps left, isolated rate)

    def __call__(self, view: View) -> Plan:
        if not view.jobs:
            return Plan(fractions={}, prices=reserve_prices(view))
        p = polytope(view.jobs, view.tiers)
        m, n = p.shape
        isolated_rate = np.array([equal_share_rate(j, view.tiers, m) for j in view.jobs])
        remaining = np.array([view.remaining[j.id] for j in view.jobs])
        for job, rate in zip(view.jobs, isolated_rate, strict=True):
            before = self._last.get(job.id)
            if before is not None:
                done = before[0] - view.remaining[job.id]
                self._isolated_seconds[job.id] = (
                    self._isolated_seconds.get(job.id, 0.0) + done / before[1]
                )
            self._last[job.id] = (view.remaining[job.id], float(rate))
        elapsed = np.array([view.now - j.arrival for j in view.jobs])
        isolated = np.array([self._isolated_seconds.get(j.id, 0.0) for j in view.jobs])
        denominator = isolated + remaining / isolated_rate

        x = cp.Variable((m, n), nonneg=True)
        rates = cp.sum(cp.multiply(p.throughput, x), axis=1)
        rho = elapsed / denominator + cp.multiply(remaining / denominator, cp.inv_pos(rates))
        problem = cp.Problem(
            cp.Minimize(cp.max(rho)),
            [
                cp.sum(x, axis=1) <= 1,
                p.scale @ x <= p.capacity,
            ],
        )
        try:
            problem.solve(solver=cp.CLARABEL)
        except cp.SolverError as exc:
            raise SimulationError(f"finish-time fairness: the solver failed: {exc}") from exc
        if problem.status not in (cp.OPTIMAL, cp.OPTIMAL_INACCURATE) or x.value is None:
            raise SimulationError(f"finish-time fairness: solver status {problem.status!r}")
        return Plan(fractions=p.fractions(np.asarray(x.value).ravel()), prices=reserve_prices(view))
