"""The time-fraction polytope of Gavel's policies, and one call into HiGHS.

Variables X[m, j] >= 0: the fraction of time job m's whole gang runs on GPU type j.
  sum_j X[m, j] <= 1               a gang runs in one place at a time
  sum_m s_m X[m, j] <= C_j         type j has C_j GPUs; job m's gang needs s_m of them
Column k = m * J + j. Policies add their own columns and rows after these.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp

from market.clearing import ClearingError
from market.clearing.solvers import highs
from market.simulator.errors import SimulationError
from market.simulator.policies.base import Fractions, Tiers
from market.simulator.trace import Job


@dataclass(frozen=True)
class Polytope:
    jobs: tuple[Job, ...]
    types: tuple[str, ...]
    throughput: np.ndarray  # (M, J) steps/s of each job's whole gang on each type
    scale: np.ndarray  # (M,) GPUs per gang
    capacity: np.ndarray  # (J,) GPUs
    rows: sp.csr_matrix  # (M + J, M * J) the two blocks above
    row_hi: np.ndarray  # (M + J,)

    @property
    def shape(self) -> tuple[int, int]:
        return len(self.jobs), len(self.types)

    def fractions(self, x: np.ndarray) -> Fractions:
        """Column values back to {job id: {type: fraction}}, dropping solver dust."""
        m, n = self.shape
        grid = np.clip(x[: m * n].reshape(m, n), 0.0, 1.0)
        grid[grid < 1e-9] = 0.0
        return {
            job.id: {t: float(grid[i, j]) for j, t in enumerate(self.types) if grid[i, j] > 0}
            for i, job in enumerate(self.jobs)
        }


def polytope(jobs: tuple[Job, ...], tiers: Tiers) -> Polytope:
    types = tuple(tiers)
    m, n = len(jobs), len(types)
    throughput = np.array([[job.throughput[t] for t in types] for job in jobs], dtype=float)
    scale = np.array([job.scale for job in jobs], dtype=float)
    # Row i (job i): ones over its n columns. Row m + j (type j): s_i in column i * n + j.
    columns = np.arange(m * n)
    rows = sp.csr_matrix(
        (
            np.concatenate([np.ones(m * n), np.repeat(scale, n)]),
            (np.concatenate([columns // n, m + columns % n]), np.concatenate([columns, columns])),
        ),
        shape=(m + n, m * n),
    )
    capacity = np.array([tiers[t] for t in types], dtype=float)
    return Polytope(
        jobs=jobs,
        types=types,
        throughput=throughput,
        scale=scale,
        capacity=capacity,
        rows=rows,
        row_hi=np.concatenate([np.ones(m), capacity]),
    )


def maximise(
    *,
    cost: np.ndarray,
    matrix: sp.spmatrix,
    row_lo: np.ndarray,
    row_hi: np.ndarray,
    col_hi: np.ndarray,
    what: str,
) -> np.ndarray:
    """Maximise cost @ x subject to row_lo <= matrix @ x <= row_hi, 0 <= x <= col_hi, through
    the clearing package's one door to HiGHS."""
    try:
        sol = highs.solve(
            cost=cost,
            matrix=matrix,
            row_lo=row_lo,
            row_hi=row_hi,
            col_lo=np.zeros(matrix.shape[1]),
            col_hi=col_hi,
            what=what,
        )
    except ClearingError as exc:
        raise SimulationError(str(exc)) from exc
    return sol.x
