"""A small LP/MILP builder over HiGHS: named variable blocks, named constraint blocks.

    p = Program("maxmin problem")
    x = p.variables("x", n_arcs, integer=whole)
    tau = p.variables("tau", 1)
    p.constrain("capacity", [(x, tier_of_arc)], hi=capacity)
    p.constrain("guarantee", [(x, value_by_tenant), (tau, -guarantee[:, None])], lo=0)
    sol = p.maximise([(tau, 1.0)])
    sol["x"], sol.dual("capacity")

Each term is (block, matrix): the matrix has one row per constraint of the block and one
column per variable of the block (a scipy sparse matrix, a dense array, or a scalar for a
one-variable block). Duals are "marginal objective per unit of the row bound", so a binding
capacity row of a maximisation has a non-negative dual.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import highspy
import numpy as np
import scipy.sparse as sp

from market.clearing.solvers import highs

Term = tuple["Block", "sp.spmatrix | np.ndarray | float"]


@dataclass(frozen=True)
class Block:
    name: str
    start: int  # first column
    size: int


def incidence(rows: np.ndarray, n_rows: int, weights: np.ndarray | None = None) -> sp.csr_matrix:
    """(n_rows, len(rows)) matrix with weights[k] (default 1) at (rows[k], k); a row of -1
    leaves column k empty."""
    data = np.ones(rows.size) if weights is None else np.asarray(weights, dtype=float)
    keep = rows >= 0
    return sp.csr_matrix(
        (data[keep], (rows[keep], np.flatnonzero(keep))), shape=(n_rows, rows.size)
    )


@dataclass(frozen=True)
class Start:
    """A point to begin from: values per variable block and duals per constraint block (the
    sign of ``Solution.dual``); what it leaves out is taken at a lower bound or 0."""

    values: Mapping[str, np.ndarray]
    duals: Mapping[str, np.ndarray]


@dataclass(frozen=True)
class Solution:
    values: dict[str, np.ndarray]
    duals: dict[str, np.ndarray]
    status: str  # "optimal", "time_limit" (feasible incumbent) or "no_solution"
    seconds: float
    # An optimal basis, given seconds to find it (highs.LpSolution.basis); None for a MIP.
    basis: Callable[[float], highspy.HighsBasis | None] | None = None

    def __getitem__(self, name: str) -> np.ndarray:
        return self.values[name]

    def dual(self, name: str) -> np.ndarray:
        return self.duals[name]


class Program:
    def __init__(self, what: str) -> None:
        self.what = what
        self.blocks: dict[str, Block] = {}
        self._lo: list[np.ndarray] = []
        self._hi: list[np.ndarray] = []
        self._int: list[np.ndarray] = []
        self._rows: dict[str, tuple[list[tuple[Block, sp.csr_matrix]], np.ndarray, np.ndarray]] = {}
        self.n_cols = 0

    def variables(
        self,
        name: str,
        size: int,
        *,
        lo: float | np.ndarray = 0.0,
        hi: float | np.ndarray = np.inf,
        integer: bool | np.ndarray = False,
    ) -> Block:
        block = Block(name, self.n_cols, int(size))
        self.blocks[name] = block
        self._lo.append(np.broadcast_to(np.asarray(lo, dtype=float), (size,)).copy())
        self._hi.append(np.broadcast_to(np.asarray(hi, dtype=float), (size,)).copy())
        self._int.append(np.broadcast_to(np.asarray(integer, dtype=bool), (size,)).copy())
        self.n_cols += block.size
        return block

    def bounds(
        self,
        block: Block,
        *,
        lo: float | np.ndarray | None = None,
        hi: float | np.ndarray | None = None,
    ) -> None:
        """Change a block's bounds (e.g. fix a stage's optimum before the next stage)."""
        index = list(self.blocks).index(block.name)
        if lo is not None:
            self._lo[index][:] = lo
        if hi is not None:
            self._hi[index][:] = hi

    def constrain(
        self,
        name: str,
        terms: Sequence[Term],
        *,
        lo: float | np.ndarray = -np.inf,
        hi: float | np.ndarray = np.inf,
    ) -> None:
        parts = []
        for block, coef in terms:
            m = sp.csr_matrix(np.full((1, block.size), coef) if np.isscalar(coef) else coef)
            if m.shape[1] != block.size:
                raise ValueError(f"{name}: a term on {block.name} has {m.shape[1]} columns")
            parts.append((block, m))
        n_rows = {m.shape[0] for _, m in parts}
        if len(n_rows) != 1:
            raise ValueError(f"{name}: the terms disagree on the number of rows")
        n = n_rows.pop()
        lo_v = np.broadcast_to(np.asarray(lo, dtype=float), (n,)).copy()
        hi_v = np.broadcast_to(np.asarray(hi, dtype=float), (n,)).copy()
        self._rows[name] = (parts, lo_v, hi_v)

    def _matrix(self, parts: list[tuple[Block, sp.csr_matrix]]) -> sp.csr_matrix:
        n = parts[0][1].shape[0]
        out = sp.csr_matrix((n, self.n_cols))
        for block, m in parts:
            coo = m.tocoo()
            out = out + sp.csr_matrix(
                (coo.data, (coo.row, coo.col + block.start)), shape=(n, self.n_cols)
            )
        return out

    def _start(self, start: Start, n_rows: int, names: list[str]) -> tuple[np.ndarray, np.ndarray]:
        """(column values, row duals) of ``start``: a block it leaves out at its lower bound
        (or 0), a constraint block's duals at 0."""
        x = np.concatenate(self._lo) if self._lo else np.zeros(0)
        x = np.where(np.isfinite(x), x, 0.0)
        for name, values in start.values.items():
            block = self.blocks[name]
            x[block.start : block.start + block.size] = values
        y, at = np.zeros(n_rows), 0
        for name in names:
            n = self._rows[name][1].size
            if name in start.duals:
                y[at : at + n] = start.duals[name]
            at += n
        return x, y

    def maximise(
        self,
        objective: Sequence[Term],
        *,
        time_limit: float = 10.0,
        relax: bool = False,
        start: Start | None = None,
        vertex: bool = True,
        basis: highspy.HighsBasis | None = None,
    ) -> Solution:
        """Solve; ``relax`` drops integrality (the LP relaxation). ``start``: a point near
        the optimum to begin from (highs.solve's start; an LP only). ``vertex=False``: the
        optimal value is what is wanted, and a large LP's answer may be an interior point
        (highs.solve). ``basis``: a basis of this program (its rows and blocks unchanged
        since, bounds and objective may differ) to begin from (highs.solve's basis)."""
        cost = np.zeros(self.n_cols)
        for block, coef in objective:
            cost[block.start : block.start + block.size] += coef
        names = list(self._rows)
        matrices = [self._matrix(self._rows[name][0]) for name in names]
        matrix = sp.vstack(matrices) if matrices else sp.csr_matrix((0, self.n_cols))
        integer = np.concatenate(self._int) if self._int else np.zeros(0, dtype=bool)
        sol = highs.solve(
            cost=cost,
            matrix=matrix,
            row_lo=np.concatenate([self._rows[n][1] for n in names]) if names else np.zeros(0),
            row_hi=np.concatenate([self._rows[n][2] for n in names]) if names else np.zeros(0),
            col_lo=np.concatenate(self._lo),
            col_hi=np.concatenate(self._hi),
            integer=integer if integer.any() and not relax else None,
            time_limit=time_limit,
            what=self.what,
            start=None if start is None else self._start(start, matrix.shape[0], names),
            vertex=vertex,
            basis=basis,
        )
        values = {name: sol.x[b.start : b.start + b.size] for name, b in self.blocks.items()}
        duals, at = {}, 0
        for name in names:
            n = self._rows[name][1].size
            duals[name] = sol.row_dual[at : at + n]
            at += n
        return Solution(
            values=values, duals=duals, status=sol.status, seconds=sol.seconds, basis=sol.basis
        )
