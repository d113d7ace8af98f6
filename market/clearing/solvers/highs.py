"""One door to HiGHS for the linear and mixed-integer problems."""

from __future__ import annotations

import ctypes
import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass

import highspy
import numpy as np
import scipy.sparse as sp

from market.clearing.errors import SolverError

IPM_ROWS = 2000  # rows above which an LP is solved by interior point + crossover
PRIMAL_SIMPLEX = 4  # HiGHS's simplex_strategy for the primal simplex method
# Of an LP's time limit, what a start may take (crossover and simplex); the rest is kept for
# the LP solved whole should the start not end optimal.
START_SHARE = 0.5
# A start's columns whose reduced cost is below -PRICED_OUT x max(1, |cost|) wait outside the
# LP (_from_start); one whose reduced cost at the simplex method's duals is above DUAL_TOL x
# max(1, |cost|) joins it, for at most PRICING_ROUNDS rounds. At 1e-4 instead of 1e-2 the
# LP left at 100k bids was infeasible (the interior point's duals are that rough).
PRICED_OUT = 1e-2
OUT_MASS = 1e-3  # ... and on which the start puts no more than this
DUAL_TOL = 1e-7  # HiGHS's own dual feasibility tolerance
PRICING_ROUNDS = 20


def banner_silence() -> None:
    """HiGHS writes a two-line banner straight to the process's standard output (file
    descriptor 1, below Python) the first time a solver object is made. A command whose
    standard output is its result (`gpumarket clear`, which prints JSON) calls this first:
    the first object is made with descriptor 1 pointed at /dev/null, so no later one prints."""
    sys.stdout.flush()
    saved, devnull = os.dup(1), os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, 1)
        highspy.Highs()
        ctypes.CDLL(None).fflush(None)  # what the C++ side buffered goes to /dev/null too
    finally:
        os.dup2(saved, 1)
        os.close(saved)
        os.close(devnull)


@dataclass(frozen=True)
class LpSolution:
    x: np.ndarray  # (n,) column values
    row_dual: np.ndarray  # (m,) marginal objective per unit of row bound (maximisation)
    status: str  # "optimal", "time_limit" (feasible incumbent) or "no_solution"
    seconds: float  # wall time of the solver run alone
    # An optimal basis of the LP, given seconds to find it: the one the solve ended at, or by
    # crossover from its interior point (``vertex=False``); None when there is none (a MIP).
    basis: Callable[[float], highspy.HighsBasis | None] | None = None


def solve(
    *,
    cost: np.ndarray,
    matrix: sp.spmatrix,
    row_lo: np.ndarray,
    row_hi: np.ndarray,
    col_lo: np.ndarray,
    col_hi: np.ndarray,
    integer: np.ndarray | None = None,
    time_limit: float = 10.0,
    what: str = "clearing problem",
    start: tuple[np.ndarray, np.ndarray] | None = None,
    vertex: bool = True,
    basis: highspy.HighsBasis | None = None,
) -> LpSolution:
    """Maximise cost @ x subject to row_lo <= matrix @ x <= row_hi, col_lo <= x <= col_hi.

    Plain LPs end at a vertex (simplex, or interior point followed by crossover): the network
    problems built here have integral vertices, which is what makes whole GPUs free of
    rounding. Past a few thousand rows the interior point method is used, because these
    problems are very degenerate and the simplex method stalls on them (seconds instead of
    tenths of a second at 10k rows).

    ``start`` (plain LPs): (column values, row duals) of a point near the optimum, such as
    an interior point of the same LP (eg.interior), duals in this function's sign (a
    binding upper row of a maximisation has a non-negative dual). Crossover from that point
    finds a basis and the primal simplex method ends from it (6 steps at 10k bids, about
    1,000 at 100k, on the columns the start's duals do not price out: _from_start); the
    answer is then an optimal vertex as without a start. When that does not
    end optimal within START_SHARE of the time limit, the LP is solved again as without a
    start, in what is left of the time limit, and its seconds count both.

    ``vertex=False`` (plain LPs, for a caller that needs the optimal value and not a vertex,
    such as maxmin's stage 1, whose answer is tau*): past IPM_ROWS rows the interior point's
    answer is returned without crossover, which took 0.7 s of 1.6 s on a 30k-bid stage 1. Its
    columns meet the rows to the solver's tolerance and its objective is within the interior
    point's gap (1e-8 relative) of the optimum. If the interior point alone does not end
    optimal, the LP is solved again with crossover in what is left of the time limit.

    ``basis`` (plain LPs): a basis of an LP with the same rows and columns, such as the
    optimal basis of the stage before (``LpSolution.basis``) whose answer is kept by a bound.
    It is primal feasible when that answer meets the bounds changed since, and the primal
    simplex method goes on from it (2.5 s where the interior point took 15 s, maxmin's stage 2
    of 1,000 tenants at 100k bids); when that does not end optimal within START_SHARE of the
    time limit, the LP is solved as without it. Past IPM_ROWS rows only, where the interior
    point would run: below, the simplex method from nothing is as quick.
    """
    A = sp.csc_matrix(matrix)
    if A.shape[1] == 0:  # nothing to decide: feasible exactly when every row admits 0
        return _without_columns(A, row_lo, row_hi, what)
    mip = integer is not None and bool(np.any(integer))
    lp = _Lp.of(cost, A, row_lo, row_hi, col_lo, col_hi, integer if mip else None)
    deadline = time.perf_counter() + float(time_limit)
    if not mip:
        found = _warm_started(lp, basis=basis, start=start, time_limit=float(time_limit))
        if found is not None:
            return found
    began = time.perf_counter() if start is None or mip else deadline - float(time_limit)
    ipm = not mip and A.shape[0] > IPM_ROWS
    h, model_status = _run_to_an_end(lp, mip=mip, ipm=ipm, vertex=vertex, deadline=deadline)
    seconds = time.perf_counter() - began
    status = _status_of(h, model_status, mip=mip, what=what)
    if status == "no_solution":
        return LpSolution(np.zeros(A.shape[1]), np.zeros(A.shape[0]), status, seconds)
    sol = h.getSolution()
    row_dual = np.array(sol.row_dual) if sol.dual_valid else np.zeros(A.shape[0])
    return LpSolution(
        np.array(sol.col_value), row_dual, status, seconds, None if mip else _basis_of(h)
    )


def _without_columns(
    A: sp.csc_matrix, row_lo: np.ndarray, row_hi: np.ndarray, what: str
) -> LpSolution:
    """The answer of an LP with no column: optimal when every row admits 0, else infeasible."""
    if np.any(np.asarray(row_lo) > 0) or np.any(np.asarray(row_hi) < 0):
        raise SolverError(f"{what}: the solver stopped with status 'Infeasible'")
    return LpSolution(np.zeros(0), np.zeros(A.shape[0]), "optimal", 0.0)


def _warm_started(
    lp: _Lp,
    *,
    basis: highspy.HighsBasis | None,
    start: tuple[np.ndarray, np.ndarray] | None,
    time_limit: float,
) -> LpSolution | None:
    """A plain LP's optimal vertex from ``basis`` (past IPM_ROWS rows) or else from
    ``start``, each in START_SHARE of the time limit; None when neither is given or ends
    optimal."""
    if basis is not None and lp.A.shape[0] > IPM_ROWS:
        found = _from_basis(lp, basis, time_limit=START_SHARE * time_limit)
        if found is not None:
            return found
    if start is not None:
        found = _from_start(lp, start, time_limit=START_SHARE * time_limit)
        if found is not None:
            return found
    return None


def _run_to_an_end(
    lp: _Lp, *, mip: bool, ipm: bool, vertex: bool, deadline: float
) -> tuple[highspy.Highs, highspy.HighsModelStatus]:
    """(the solver, its model status) once ``lp`` has run from nothing: for an interior
    point without crossover that proves nothing, then crossover from its point (or a run
    with crossover)."""
    h = _run(lp, mip=mip, ipm=ipm, crossover=vertex, deadline=deadline)
    model_status = h.getModelStatus()
    settled = (
        highspy.HighsModelStatus.kOptimal,
        highspy.HighsModelStatus.kInfeasible,
        highspy.HighsModelStatus.kTimeLimit,
    )
    if ipm and not vertex and model_status not in settled:
        # Not proven optimal (its duals just past the tolerance, say): crossover from its own
        # point and the simplex method from there, in the same solver (1.6 s where solving
        # again with crossover took 15 s, maxmin's stage 1 of 1,000 tenants at 100k bids).
        if not _vertex_from(h, deadline):
            h = _run(lp, mip=mip, ipm=ipm, crossover=True, deadline=deadline)
        model_status = h.getModelStatus()
    return h, model_status


def _status_of(
    h: highspy.Highs, model_status: highspy.HighsModelStatus, *, mip: bool, what: str
) -> str:
    """The answer's status: optimal, or for a MIP out of time time_limit / no_solution.
    Raises SolverError naming the solver's status otherwise."""
    has_solution = h.getInfo().primal_solution_status == 2  # 2 = feasible point held
    if model_status == highspy.HighsModelStatus.kOptimal:
        return "optimal"
    if model_status == highspy.HighsModelStatus.kTimeLimit and mip:
        return "time_limit" if has_solution else "no_solution"
    raise SolverError(
        f"{what}: the solver stopped with status {h.modelStatusToString(model_status)!r}"
        + (
            "; raise params.time_limit or simplify the instance"
            if "Time" in h.modelStatusToString(model_status)
            else ""
        )
    )


def _basis_of(h: highspy.Highs) -> Callable[[float], highspy.HighsBasis | None]:
    """``LpSolution.basis`` of the LP ``h`` has solved (the solver is kept for it)."""

    def basis(time_limit: float) -> highspy.HighsBasis | None:
        if h.getBasis().valid or _vertex_from(h, time.perf_counter() + time_limit):
            return h.getBasis()
        return None

    return basis


def _from_basis(lp: _Lp, basis: highspy.HighsBasis, *, time_limit: float) -> LpSolution | None:
    """The LP's optimal vertex by the primal simplex method from ``basis`` (see ``solve``), or
    None when that does not end optimal within ``time_limit`` seconds."""
    began = time.perf_counter()
    h = highspy.Highs()
    h.setOptionValue("output_flag", False)
    h.setOptionValue("time_limit", time_limit)
    h.setOptionValue("solver", "simplex")
    h.setOptionValue("simplex_strategy", PRIMAL_SIMPLEX)
    lp.into(h)
    if h.setBasis(basis) == highspy.HighsStatus.kError:
        return None
    h.run()
    if h.getModelStatus() != highspy.HighsModelStatus.kOptimal:
        return None
    sol = h.getSolution()
    return LpSolution(
        np.array(sol.col_value),
        np.array(sol.row_dual),
        "optimal",
        time.perf_counter() - began,
        _basis_of(h),
    )


def _run(lp: _Lp, *, mip: bool, ipm: bool, crossover: bool, deadline: float):
    """A solver object that has run ``lp`` in what is left before ``deadline``: branch and
    bound, or the interior point (with crossover or without), or the simplex method."""
    h = highspy.Highs()
    h.setOptionValue("output_flag", False)
    h.setOptionValue("time_limit", max(0.0, deadline - time.perf_counter()))
    if not mip:
        h.setOptionValue("solver", "ipm" if ipm else "simplex")
        h.setOptionValue("run_crossover", "on" if crossover else "off")
    lp.into(h)
    h.run()
    return h


def _vertex_from(h: highspy.Highs, deadline: float) -> bool:
    """Whether crossover from the feasible point the run of ``h`` ended with, then the primal
    simplex method from the basis it gives, ends optimal in what is left before ``deadline``
    (``h`` then holds that vertex)."""
    if h.getInfo().primal_solution_status != 2:  # 2 = feasible point held
        return False
    h.setOptionValue("time_limit", max(0.0, deadline - time.perf_counter()))
    h.crossover(h.getSolution())
    if not h.getBasis().valid:
        return False
    h.setOptionValue("solver", "simplex")
    h.setOptionValue("simplex_strategy", PRIMAL_SIMPLEX)
    h.setOptionValue("time_limit", max(0.0, deadline - time.perf_counter()))
    h.run()
    return h.getModelStatus() == highspy.HighsModelStatus.kOptimal


def _from_start(
    lp: _Lp,
    start: tuple[np.ndarray, np.ndarray],
    *,
    time_limit: float,
) -> LpSolution | None:
    """The LP's optimal vertex by crossover from ``start`` and the simplex method from the
    basis it gives (see ``solve``), or None when that does not end optimal.

    The columns whose reduced cost at the start's duals is far below zero (PRICED_OUT) and
    that the start barely uses (OUT_MASS) are left out while it runs (at 100k bids two arcs
    in three, so that each simplex step costs a third), and so are the rows they alone
    touch. Once it ends, the columns left out are priced at its duals; any that would raise
    the objective (above DUAL_TOL) join, and the simplex method goes on from its basis, until
    none does. Every column left out is then at its bound 0 with a reduced cost that does not
    ask to enter: the answer is an optimal vertex of the whole LP."""
    began = time.perf_counter()
    A = lp.A
    x = np.clip(np.asarray(start[0], dtype=float), lp.col_lo, lp.col_hi)
    y = np.asarray(start[1], dtype=float)
    cost = lp.cost
    weight = np.maximum(1.0, np.abs(cost))
    out = _priced_out(lp, x, y, weight)
    cols = np.flatnonzero(~out)
    rows, at = _rows_touched(lp, cols)
    h = _crossed_over(lp, x, y, rows, cols, time_limit=time_limit)
    if h is None:
        return None
    # The basis crossover leaves is primal feasible (the start meets every row) and far from
    # dual feasible: the primal simplex method ends from it in a few steps where the dual
    # took thousands (6 against 1,069 at 10k bids; 1,570 against 5,569 at 100k).
    h.setOptionValue("solver", "simplex")
    h.setOptionValue("simplex_strategy", PRIMAL_SIMPLEX)
    for _ in range(PRICING_ROUNDS):
        h.setOptionValue("time_limit", max(0.0, time_limit - (time.perf_counter() - began)))
        h.run()
        optimal = h.getModelStatus() == highspy.HighsModelStatus.kOptimal
        if optimal:
            sol = h.getSolution()
            y = np.zeros(A.shape[0])  # a row outside holds at 0 without binding: dual 0
            y[rows] = sol.row_dual
            enter = np.flatnonzero(out & (cost - A.T @ y > DUAL_TOL * weight))
        elif out.any() and h.getModelStatus() == highspy.HighsModelStatus.kInfeasible:
            # The columns kept cannot meet the rows: every column joins, and the simplex
            # method goes on from where it stopped.
            enter = np.flatnonzero(out)
        else:
            return None
        if optimal and enter.size == 0:
            values = np.zeros(A.shape[1])
            values[cols] = sol.col_value
            return LpSolution(values, y, "optimal", time.perf_counter() - began)
        rows = _join(h, lp, enter, rows, at)
        cols, out[enter] = np.r_[cols, enter], False
    return None


def _priced_out(lp: _Lp, x: np.ndarray, y: np.ndarray, weight: np.ndarray) -> np.ndarray:
    """The columns left out while the simplex method runs from the start (x, y)."""
    A, cost, lower = lp.A, lp.cost, lp.col_lo
    # Out: a column at bound 0 that the start's duals price far out and that the start itself
    # barely uses. (Without the second condition, a start nearer the optimum, at 3e-7 of the
    # objective, priced out arcs carrying GPUs whose terms dwarf their value: crossover left
    # 6,008 rows unmet and the simplex method ran out of time at 100k bids.)
    return (lower == 0.0) & (cost - A.T @ y < -PRICED_OUT * weight) & (x <= OUT_MASS)


def _rows_touched(lp: _Lp, cols: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(rows, at): the rows the LP solved keeps, and each row's place in it (-1 while
    outside)."""
    A = lp.A
    # The rows the columns kept do not touch wait outside too, unless they cannot hold at 0.
    row_lo, row_hi = lp.row_lo, lp.row_hi
    touched = np.diff(sp.csr_matrix(A[:, cols]).indptr) > 0
    rows = np.flatnonzero(touched | (row_lo > 0) | (row_hi < 0))
    at = np.full(A.shape[0], -1)  # each row's place in the LP solved, -1 while outside
    at[rows] = np.arange(rows.size)
    return rows, at


def _crossed_over(
    lp: _Lp,
    x: np.ndarray,
    y: np.ndarray,
    rows: np.ndarray,
    cols: np.ndarray,
    *,
    time_limit: float,
) -> highspy.Highs | None:
    """A solver holding the LP of ``rows`` and ``cols`` and the basis crossover finds from
    the start (x, y); None when crossover leaves no valid basis."""
    A, cost = lp.A, lp.cost
    # Crossover on its own does not start HiGHS's task scheduler, which every run starts, and
    # without it crossover crashed the process: a run of a one-column LP starts it.
    tiny = highspy.Highs()
    tiny.setOptionValue("output_flag", False)
    tiny.addVar(0.0, 1.0)
    tiny.run()
    h = highspy.Highs()
    h.setOptionValue("output_flag", False)
    h.setOptionValue("time_limit", time_limit)
    sub = A[rows][:, cols]
    lp.part(sub, rows, cols).into(h)
    point = highspy.HighsSolution()
    point.col_value, point.row_value = list(x[cols]), list(sub @ x[cols])
    point.col_dual, point.row_dual = list(cost[cols] - sub.T @ y[rows]), list(y[rows])
    point.value_valid = point.dual_valid = True
    # Crossover ends with a basis even when it reports no optimum; the simplex goes on from it.
    h.crossover(point)
    if not h.getBasis().valid:
        return None
    return h


def _join(
    h: highspy.Highs, lp: _Lp, enter: np.ndarray, rows: np.ndarray, at: np.ndarray
) -> np.ndarray:
    """Add the columns ``enter`` to the LP ``h`` holds, after the rows they touch that are
    outside (empty); returns the rows it then holds (``at`` updated in place)."""
    A = lp.A
    more = sp.csc_matrix(A[:, enter])
    new = np.unique(more.indices[at[more.indices] < 0])
    if new.size:  # rows the joining columns touch come in first, empty
        h.addRows(
            new.size,
            lp.row_lo[new],
            lp.row_hi[new],
            0,
            np.zeros(new.size, dtype=np.int32),
            np.zeros(0, dtype=np.int32),
            np.zeros(0),
        )
        at[new] = rows.size + np.arange(new.size)
        rows = np.r_[rows, new]
    h.addCols(
        enter.size,
        lp.cost[enter],
        lp.col_lo[enter],
        lp.col_hi[enter],
        more.nnz,
        more.indptr[:-1].astype(np.int32),
        at[more.indices].astype(np.int32),
        more.data,
    )
    return rows


@dataclass(frozen=True)
class _Lp:
    """The maximisation of cost @ x, row_lo <= A x <= row_hi, col_lo <= x <= col_hi (``integer``:
    the integer columns, None for none), kept as numpy arrays and handed to HiGHS whole by its
    array form (``into``). A ``highspy.HighsLp`` filled field by field took 0.15 s for 200k
    columns and 600k entries, its matrix converted entry by entry, and as long to read back."""

    cost: np.ndarray
    A: sp.csc_matrix
    row_lo: np.ndarray
    row_hi: np.ndarray
    col_lo: np.ndarray
    col_hi: np.ndarray
    integer: np.ndarray | None = None

    @classmethod
    def of(cls, cost, A: sp.csc_matrix, row_lo, row_hi, col_lo, col_hi, integer=None) -> _Lp:
        def floats(v) -> np.ndarray:
            return np.ascontiguousarray(v, dtype=float)

        return cls(
            floats(cost),
            A,
            floats(row_lo),
            floats(row_hi),
            floats(col_lo),
            floats(col_hi),
            None if integer is None else np.asarray(integer, dtype=bool),
        )

    def part(self, sub: sp.spmatrix, rows: np.ndarray, cols: np.ndarray) -> _Lp:
        """This LP on the rows ``rows`` and the columns ``cols`` only (``sub``: that part of
        its matrix), all continuous."""
        return _Lp.of(
            self.cost[cols],
            sp.csc_matrix(sub),
            self.row_lo[rows],
            self.row_hi[rows],
            self.col_lo[cols],
            self.col_hi[cols],
        )

    def into(self, h: highspy.Highs) -> None:
        m, n = self.A.shape
        integrality = np.zeros(n, dtype=np.int32)  # 0: continuous, 1: integer
        if self.integer is not None:
            integrality[self.integer] = 1
        status = h.passModel(
            n,
            m,
            self.A.nnz,
            1,  # the matrix by columns
            -1,  # maximise
            0.0,
            self.cost,
            self.col_lo,
            self.col_hi,
            self.row_lo,
            self.row_hi,
            self.A.indptr.astype(np.int32),
            self.A.indices.astype(np.int32),
            np.ascontiguousarray(self.A.data, dtype=float),
            integrality,
        )
        if status == highspy.HighsStatus.kError:
            raise SolverError("the solver refused the problem it was given")
