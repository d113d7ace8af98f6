"""Baselines from Gavel (Narayanan et al., OSDI'20), written from the paper's formulations.

Both are linear programs over the time-fraction polytope of ``lp.py``; throughput(m, X) =
sum_j T[m, j] X[m, j] is job m's steps/s under allocation X (heterogeneity-aware: a job
that is 4x faster on v100 values v100 time 4x).

- max-min fairness: maximise min_m throughput(m, X) / (w_m * E_m), where E_m is job m's
  throughput on an equal 1/M share of every type (M jobs in the system). No second stage:
  the LP's leftover capacity is what the round realisation fills with other jobs, as in
  Gavel's own round scheduler.
- max-sum throughput: maximise sum_m throughput(m, X) (steps/s, unnormalised).
"""

from __future__ import annotations

import numpy as np
import scipy.sparse as sp

from market.simulator.policies.base import Plan, View, equal_share_rate, reserve_prices
from market.simulator.policies.lp import maximise, polytope

INF = float("inf")


def max_min_fairness(view: View) -> Plan:
    if not view.jobs:
        return Plan(fractions={}, prices=reserve_prices(view))
    p = polytope(view.jobs, view.tiers)
    m, n = p.shape
    fair = np.array(
        [view.weights[j.tenant] * equal_share_rate(j, view.tiers, m) for j in view.jobs]
    )
    # share_m(X) - z >= 0 for every job, with share_m = throughput(m, X) / (w_m E_m).
    share = sp.csr_matrix(
        (
            (p.throughput / fair[:, None]).ravel(),
            (np.repeat(np.arange(m), n), np.arange(m * n)),
        ),
        shape=(m, m * n),
    )
    z = sp.csr_matrix(np.vstack([np.zeros((m + n, 1)), -np.ones((m, 1))]))
    matrix = sp.hstack([sp.vstack([p.rows, share]), z])
    x = maximise(
        cost=np.concatenate([np.zeros(m * n), [1.0]]),
        matrix=matrix,
        row_lo=np.concatenate([np.full(m + n, -INF), np.zeros(m)]),
        row_hi=np.concatenate([p.row_hi, np.full(m, INF)]),
        col_hi=np.concatenate([np.ones(m * n), [INF]]),
        what="Gavel max-min fairness",
    )
    return Plan(fractions=p.fractions(x), prices=reserve_prices(view))


def max_sum_throughput(view: View) -> Plan:
    if not view.jobs:
        return Plan(fractions={}, prices=reserve_prices(view))
    p = polytope(view.jobs, view.tiers)
    m, n = p.shape
    x = maximise(
        cost=p.throughput.ravel(),
        matrix=p.rows,
        row_lo=np.full(m + n, -INF),
        row_hi=p.row_hi,
        col_hi=np.ones(m * n),
        what="Gavel max-sum throughput",
    )
    return Plan(fractions=p.fractions(x), prices=reserve_prices(view))
