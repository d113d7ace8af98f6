"""An LP begun from an interior point (highs.solve's start): eg.interior on linear programs,
crossover and the simplex method from it, and maxmin's stage 2 that way."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from market.clearing import Bid, Instance, Tenant, Tier, clear
from market.clearing.instance.inputs import instance_arrays
from market.clearing.mechanisms import fisher, maxmin
from market.clearing.solvers import eg, highs, lp

from .test_eg import _holds, _instance, _program


def _linear(seed: int, guarantee: float = 0.8) -> eg.Program:
    return dataclasses.replace(_program(seed, tenants=60, guarantee=guarantee), linear=True)


def _lp(p: eg.Program) -> tuple[lp.Program, lp.Block]:
    """p as an LP: max sum_i w_i u_i over the bid, tier and floor rows."""
    n, T = p.weight.size, p.capacity.size
    prog = lp.Program("test problem")
    x = prog.variables("x", p.arc_bid.size)
    prog.constrain("tiers", [(x, lp.incidence(p.arc_tier, T))], hi=p.capacity)
    prog.constrain("bids", [(x, lp.incidence(p.arc_bid, p.bid_room.size))], hi=p.bid_room)
    need = np.flatnonzero(p.floor > 0)
    values = lp.incidence(p.bid_buyer[p.arc_bid], n, p.value)
    prog.constrain("floors", [(x, values[need])], lo=p.floor[need] - p.held[need])
    return prog, x


def _objective(p: eg.Program) -> np.ndarray:
    return p.weight[p.bid_buyer[p.arc_bid]] * p.value


def _start(p: eg.Program, point: eg.Point) -> lp.Start:
    need = p.floor > 0
    return lp.Start(
        values={"x": point.x},
        duals={"tiers": point.pi, "bids": point.mu, "floors": -point.lam[need]},
    )


def _returns(monkeypatch, owner, name: str) -> list:
    """What ``owner.name`` returns, call by call, once patched to record it."""
    seen: list = []
    original = getattr(owner, name)

    def spy(*args, **kwargs):
        found = original(*args, **kwargs)
        seen.append(found)
        return found

    monkeypatch.setattr(owner, name, spy)
    return seen


@pytest.mark.parametrize("guarantee", [0.0, 0.8, 1.0])
@pytest.mark.parametrize("seed", range(4))
def test_the_interior_point_of_a_linear_program_is_near_its_optimum(seed, guarantee):
    p = _linear(seed, guarantee)
    prog, x = _lp(p)
    best = prog.maximise([(x, _objective(p))])
    point = eg.interior(p, time_limit=60)
    assert point is not None
    optimum = float(_objective(p) @ best["x"])
    assert float(_objective(p) @ point.x) == pytest.approx(optimum, rel=1e-5)
    assert (point.x >= 0).all() and (point.nu >= 0).all() and (point.pi >= 0).all()
    tiers = np.bincount(p.arc_tier, weights=point.x, minlength=p.capacity.size)
    assert (tiers <= p.capacity + 1e-6).all()


def test_interior_is_for_linear_programs():
    with pytest.raises(ValueError, match="linear"):
        eg.interior(_program(0), time_limit=10)


@pytest.mark.parametrize("seed", range(4))
def test_an_lp_begun_from_its_interior_point_ends_at_the_same_optimum(monkeypatch, seed):
    """The start is taken (crossover and simplex end optimal, no second solve) and ends
    where the LP solved from nothing does, at a vertex (as few arcs used as there are
    rows that bind)."""
    p = _linear(seed)
    prog, x = _lp(p)
    plain = prog.maximise([(x, _objective(p))])
    ended = _returns(monkeypatch, highs, "_from_start")
    started = prog.maximise([(x, _objective(p))], start=_start(p, eg.interior(p, time_limit=60)))
    assert len(ended) == 1 and ended[0] is not None
    assert started.status == "optimal"
    c = _objective(p)
    assert float(c @ started["x"]) == pytest.approx(float(c @ plain["x"]), rel=1e-9)
    fractional = np.abs(started["x"] - np.rint(started["x"])) > 1e-7
    rows = p.capacity.size + p.bid_room.size + int((p.floor > 0).sum())
    assert int((started["x"] > 1e-9).sum()) <= rows
    assert int(fractional.sum()) <= p.capacity.size + int((p.floor > 0).sum())


def test_a_start_far_from_the_optimum_still_ends_at_it():
    p = _linear(1)
    prog, x = _lp(p)
    plain = prog.maximise([(x, _objective(p))])
    rng = np.random.default_rng(0)
    bad = lp.Start(
        values={"x": rng.random(p.arc_bid.size) * 5},
        duals={"tiers": -rng.random(p.capacity.size), "bids": rng.random(p.bid_room.size)},
    )
    started = prog.maximise([(x, _objective(p))], start=bad)
    c = _objective(p)
    assert started.status == "optimal"
    assert float(c @ started["x"]) == pytest.approx(float(c @ plain["x"]), rel=1e-9)


def test_crossover_as_the_first_solve_of_a_process():
    """HiGHS's crossover alone does not start its task scheduler, which a run does; called
    first in a process it crashed it (a segmentation fault). _from_start starts it first."""
    code = textwrap.dedent(
        """
        import numpy as np, scipy.sparse as sp
        from market.clearing.solvers import highs
        A = sp.csr_matrix(np.array([[1.0, 1.0, 0.0], [0.0, 1.0, 1.0]]))
        sol = highs.solve(cost=np.array([1.0, 2.0, 1.0]), matrix=A, row_lo=np.full(2, -np.inf),
                          row_hi=np.array([1.0, 1.0]), col_lo=np.zeros(3), col_hi=np.full(3, np.inf),
                          start=(np.array([0.5, 0.5, 0.5]), np.array([1.0, 1.0])))
        print(round(float(np.array([1.0, 2.0, 1.0]) @ sol.x), 9))
        """
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip().splitlines()[-1] == "2.0"


def _stage_two_values(monkeypatch) -> list[float]:
    """The value (sum_i u_i) of each stage-2 allocation maxmin's ``_stages`` returns."""
    values: list[float] = []
    original = maxmin._stages

    def spy(sk, **kwargs):
        found = original(sk, **kwargs)
        values.append(float(kwargs["v"][sk.cols] @ found[0]))
        return found

    monkeypatch.setattr(maxmin, "_stages", spy)
    return values


@pytest.mark.parametrize("divisible", [True, False])
@pytest.mark.parametrize("seed", range(3))
def test_maxmin_stage_two_from_the_interior_point_is_the_same_optimum(monkeypatch, seed, divisible):
    """maxmin with its threshold lowered to take this instance: stage 2's LP is begun from
    eg's interior point, solved on the bids that point leaves unsettled (taken: crossover
    and simplex end optimal, the settled bids' prices hold) and ends at the optimum the LP
    solved from nothing reaches, with the same worst share ratio in divisible mode."""
    inst = _instance(seed, bids=600, tenants=40)
    values = _stage_two_values(monkeypatch)
    ended = _returns(monkeypatch, highs, "_from_start")
    settled = _returns(monkeypatch, maxmin, "_settled_first")
    monkeypatch.setattr(maxmin, "STRUCTURED_ARCS", 0)
    started = clear(inst, mechanism="maxmin", divisible=divisible)
    assert ended and all(found is not None for found in ended)
    assert settled and all(found is not None for found in settled)
    monkeypatch.setattr(maxmin, "STRUCTURED_ARCS", 10**9)
    plain = clear(inst, mechanism="maxmin", divisible=divisible)
    assert values[-2] == pytest.approx(values[-1], rel=1e-9)
    if divisible:  # (whole GPUs round the vertex each reached, which may differ)
        assert started.diagnostics["min_share_ratio"] == pytest.approx(
            plain.diagnostics["min_share_ratio"], rel=1e-6
        )


@pytest.mark.parametrize("seed", [0, 3])
def test_a_settled_bid_its_prices_move_is_solved_again_and_the_optimum_is_the_same(
    monkeypatch, seed
):
    """On these instances a few bids the interior point puts on one arc, full, are priced
    otherwise by the duals of the rest (its tier's price above what the bid gains there, or
    another arc of it better): they join the rest, which is solved a second time, and stage
    2 ends at the optimum the LP solved whole reaches."""
    inst = _instance(seed, bids=3000, tenants=200)
    values = _stage_two_values(monkeypatch)
    rests = []
    original = maxmin.market_program

    def spy(market, om, **kwargs):
        if kwargs["what"] == "maxmin problem (unsettled bids)":
            rests.append(int(np.count_nonzero(om.bid_room > 0)))
        return original(market, om, **kwargs)

    monkeypatch.setattr(maxmin, "market_program", spy)
    monkeypatch.setattr(maxmin, "STRUCTURED_ARCS", 0)
    clear(inst, mechanism="maxmin", divisible=True)
    assert len(rests) == 2 and rests[1] > rests[0]
    monkeypatch.setattr(maxmin, "STRUCTURED_ARCS", 10**9)
    clear(inst, mechanism="maxmin", divisible=True)
    assert values[-2] == pytest.approx(values[-1], rel=1e-9)


def _platform_shaped(seed: int, bids: int, tenants: int) -> Instance:
    """A round drawn as bench/round_read.py draws the platform's: 1, 2, 4 or 8 GPUs (55/20/
    15/10 %), 1-3 of 8 tiers a bid, limits in milli-credits from a lognormal price level and a
    tier factor, tiers holding 32 % of demand (a million bids' share)."""
    rng = np.random.default_rng(seed)
    quantity = rng.choice([1, 2, 4, 8], size=bids, p=[0.55, 0.2, 0.15, 0.1])
    level, count = rng.standard_normal(bids), rng.integers(1, 4, size=bids)
    owner, ident = rng.integers(0, tenants, size=bids), rng.integers(1, 10**6, size=bids)
    out = []
    for b in range(bids):
        limits = {
            f"t{(ident[b] * 7 + 3 * k) % 8}": max(
                1000, round(1000 * np.exp(2 + 0.5 * level[b]) * (1 + 0.15 * ((ident[b] + k) % 3)))
            )
            for k in range(count[b])
        }
        out.append(Bid(f"b{b:06d}", f"n{owner[b]:05d}", int(quantity[b]), limits))
    capacity = int(bids * 2.35 * 0.32 / 8)
    return Instance(
        tiers=tuple(Tier(f"t{t}", capacity, reserve_price=1000) for t in range(8)),
        tenants=tuple(Tenant(f"n{i:05d}") for i in range(tenants)),
        bids=tuple(out),
    )


@pytest.mark.parametrize("seed", [17, 18])
def test_the_interior_point_gets_past_a_slow_start_on_a_platform_shaped_round(monkeypatch, seed):
    """On these rounds the interior point's first steps are short (0.5 % to 4 % of the way),
    so its complementarity falls by less than a tenth for three steps, and then once more for
    three steps halfway: counted as a stall, the method gave up and stage 2 went to HiGHS
    from nothing (2.6-2.8 s on two of 34 parts of the platform's million-bid round, against
    0.4 s). Now the method waits STALL steps, reaches its gap, and stage 2 ends at the
    optimum of the LP solved whole."""
    inst = _platform_shaped(seed, bids=10_000, tenants=1_000)
    values = _stage_two_values(monkeypatch)
    starts = _returns(monkeypatch, maxmin, "_interior_start")
    clear(inst, mechanism="maxmin")
    assert starts and starts[-1] is not None
    monkeypatch.setattr(maxmin, "STRUCTURED_ARCS", 10**9)
    clear(inst, mechanism="maxmin")
    assert values[-2] == pytest.approx(values[-1], rel=1e-9)


@pytest.mark.parametrize("mechanism", ["fisher", "maxmin"])
def test_equal_splits_that_leave_no_interior_clear_through_the_interior_point(
    monkeypatch, mechanism
):
    """Three tenants, one bid each on one tier of 3 GPUs: every guarantee (and maxmin's
    floor) is exactly the split, so the only feasible point is 1 GPU each and there is no
    interior. Through eg.py (thresholds lowered) the conjugate gradients reached a direction
    of no curvature and divided by zero (ZeroDivisionError out of ``clear``)."""
    inst = Instance(
        tiers=(Tier("a100", 3),),
        tenants=(Tenant("x"), Tenant("y"), Tenant("z")),
        bids=tuple(Bid(b, t, 2, {"a100": 1}) for b, t in zip("abc", "xyz", strict=True)),
    )
    monkeypatch.setattr(fisher, "STRUCTURED_ARCS", 0)
    monkeypatch.setattr(maxmin, "STRUCTURED_ARCS", 0)
    result = clear(inst, mechanism=mechanism, divisible=True)
    assert [a.gpus for a in result.allocations] == pytest.approx([1.0, 1.0, 1.0], abs=1e-6)


@pytest.mark.parametrize("seed", range(3))
def test_an_answer_without_a_vertex_has_the_optimal_value(monkeypatch, seed):
    """vertex=False on an LP past IPM_ROWS (lowered to take this one): the interior point's
    answer, no crossover: the same optimal value, every row met, and not a vertex (more
    fractional arcs than a basis can hold: the LP has many optima, as a tenant values a tier
    the same for every bid, and the interior point lies between them)."""
    monkeypatch.setattr(highs, "IPM_ROWS", 0)
    p = _linear(seed)
    prog, x = _lp(p)
    c = _objective(p)
    at_vertex = prog.maximise([(x, c)])
    inside = prog.maximise([(x, c)], vertex=False)
    assert inside.status == "optimal"
    assert float(c @ inside["x"]) == pytest.approx(float(c @ at_vertex["x"]), rel=1e-7)
    _holds(p, inside["x"], tol=1e-6)
    _holds(p, at_vertex["x"], tol=1e-6)
    basis = p.capacity.size + int((p.floor > 0).sum())  # rows besides the bids'

    def fractional(y):
        return int((np.abs(y - np.rint(y)) > 1e-6).sum())

    assert fractional(at_vertex["x"]) <= basis < fractional(inside["x"])


def test_an_interior_point_that_does_not_end_optimal_is_solved_again_with_crossover(monkeypatch):
    """An interior point run without crossover that stops short (here: one iteration allowed)
    is not an answer: the LP is solved again with crossover, to its optimal vertex."""
    monkeypatch.setattr(highs, "IPM_ROWS", 0)
    original_run = highs.highspy.Highs.run
    crossover = []

    def short(self):
        crossover.append(self.getOptionValue("run_crossover")[1])
        if crossover[-1] == "off":
            self.setOptionValue("ipm_iteration_limit", 1)
        return original_run(self)

    monkeypatch.setattr(highs.highspy.Highs, "run", short)
    p = _linear(0)
    prog, x = _lp(p)
    c = _objective(p)
    again = prog.maximise([(x, c)], vertex=False)
    assert crossover == ["off", "on"]
    monkeypatch.setattr(highs.highspy.Highs, "run", original_run)
    assert again.status == "optimal"
    assert float(c @ again["x"]) == pytest.approx(float(c @ prog.maximise([(x, c)])["x"]), rel=1e-9)


@pytest.mark.parametrize("seed", range(3))
def test_maxmin_stage_one_without_a_vertex_finds_the_same_tau(monkeypatch, seed):
    """A round with so little room that stage 1 runs (every tenant could beat its split):
    its LP, solved by the interior point without crossover (IPM_ROWS lowered to take it),
    gives the worst share ratio that a vertex gives, in divisible mode."""
    base = _instance(seed, bids=600, tenants=40)
    inst = dataclasses.replace(
        base, tiers=tuple(dataclasses.replace(t, capacity=t.capacity // 4) for t in base.tiers)
    )
    monkeypatch.setattr(highs, "IPM_ROWS", 0)
    original = highs.solve
    stage_one = []

    def spy(**kwargs):
        sol = original(**kwargs)
        if kwargs["cost"].sum() == 1.0 and kwargs["cost"][-1] == 1.0:  # max tau
            stage_one.append((kwargs["vertex"], float(sol.x[-1])))
        return sol

    monkeypatch.setattr(highs, "solve", spy)
    inside = clear(inst, mechanism="maxmin", divisible=True)
    original_maximise = lp.Program.maximise
    monkeypatch.setattr(
        lp.Program,
        "maximise",
        lambda self, *a, **k: original_maximise(self, *a, **k | {"vertex": True}),
    )
    at_vertex = clear(inst, mechanism="maxmin", divisible=True)
    assert [v for v, _ in stage_one] == [False, True]
    assert stage_one[0][1] > 1.0  # trading tiers beats the split: stage 1 was needed
    assert stage_one[0][1] == pytest.approx(stage_one[1][1], rel=1e-7)
    assert inside.diagnostics["min_share_ratio"] == pytest.approx(
        at_vertex.diagnostics["min_share_ratio"], rel=1e-6
    )


@pytest.mark.parametrize("guarantee", [0.0, 0.8])
def test_columns_left_out_from_the_start_join_when_they_price_in(monkeypatch, guarantee):
    """A start that puts nothing on two tiers and whose duals there are far too high makes
    every arc on them look unprofitable and unused, so they wait outside the LP (PRICED_OUT,
    OUT_MASS). Without floors the LP left is
    solved and the arcs then price in at its duals; with floors it cannot meet them, and
    the arcs join at once. Either way the answer is the LP's optimum at a vertex, and the
    LP is not solved again from nothing. The bid rows of arcs that were all left out wait
    outside too, and come back (empty) before their arcs join."""
    p = _linear(2, guarantee)
    prog, x = _lp(p)
    c = _objective(p)
    plain = prog.maximise([(x, c)])
    joined, again, rows_back = [], [], []
    original_add, original_run = highs.highspy.Highs.addCols, highs._run
    original_rows = highs.highspy.Highs.addRows

    def spy_rows(self, n, *args):
        rows_back.append(n)
        return original_rows(self, n, *args)

    def spy_add(self, n, *args):
        joined.append(n)
        return original_add(self, n, *args)

    def spy_run(*args, **kwargs):
        again.append(kwargs)
        return original_run(*args, **kwargs)

    monkeypatch.setattr(highs.highspy.Highs, "addCols", spy_add)
    monkeypatch.setattr(highs, "_run", spy_run)
    monkeypatch.setattr(highs.highspy.Highs, "addRows", spy_rows)
    point = eg.interior(p, time_limit=60)
    rough = dataclasses.replace(
        point,
        x=np.where(p.arc_tier < 2, 0.0, point.x),
        pi=point.pi + np.r_[1e3, 1e3, 0, 0] * float(c.max()),
    )
    started = prog.maximise([(x, c)], start=_start(p, rough))
    assert joined and sum(joined) <= p.arc_bid.size and not again
    assert rows_back and sum(rows_back) <= p.bid_room.size
    assert started.status == "optimal"
    assert float(c @ started["x"]) == pytest.approx(float(c @ plain["x"]), rel=1e-9)
    fractional = np.abs(started["x"] - np.rint(started["x"])) > 1e-7
    assert int(fractional.sum()) <= p.capacity.size + int((p.floor > 0).sum())


def test_a_column_the_start_uses_stays_in_however_its_duals_price_it(monkeypatch):
    """The same far too high duals on two tiers, but a start that uses their arcs: none is left
    out (a start near the optimum whose duals' terms dwarf an arc's value priced out arcs
    carrying GPUs, and the LP left could not meet its rows), and the optimum is reached."""
    p = _linear(2, 0.8)
    prog, x = _lp(p)
    c = _objective(p)
    point = eg.interior(p, time_limit=60)
    used = np.where(p.arc_tier < 2, np.maximum(point.x, 2 * highs.OUT_MASS), point.x)
    rough = dataclasses.replace(point, x=used, pi=point.pi + np.r_[1e3, 1e3, 0, 0] * float(c.max()))
    spied = []
    original_part = highs._Lp.part

    def spy_part(lp, sub, rows, cols):
        spied.append(cols)
        return original_part(lp, sub, rows, cols)

    monkeypatch.setattr(highs._Lp, "part", spy_part)
    started = prog.maximise([(x, c)], start=_start(p, rough))
    kept = spied[0]
    assert np.isin(np.flatnonzero(p.arc_tier < 2), kept).all()
    assert started.status == "optimal"
    assert float(c @ started["x"]) == pytest.approx(
        float(c @ prog.maximise([(x, c)])["x"]), rel=1e-9
    )


def test_a_start_that_runs_out_of_its_share_of_the_time_leaves_the_rest_to_the_lp(monkeypatch):
    """A start that does not end optimal within START_SHARE of the time limit (here it is
    given none) is given up, and the LP is solved whole in what is left."""
    monkeypatch.setattr(highs, "START_SHARE", 0.0)
    given = []
    original = highs._from_start

    def spy(*args, time_limit):
        given.append(time_limit)
        return original(*args, time_limit=time_limit)

    monkeypatch.setattr(highs, "_from_start", spy)
    p = _linear(1)
    prog, x = _lp(p)
    c = _objective(p)
    started = prog.maximise([(x, c)], start=_start(p, eg.interior(p, time_limit=60)))
    assert given == [0.0]
    assert started.status == "optimal"
    assert float(c @ started["x"]) == pytest.approx(
        float(c @ prog.maximise([(x, c)])["x"]), rel=1e-9
    )


@pytest.mark.parametrize("seed", range(3))
def test_the_basis_of_an_answer_without_a_vertex_starts_the_next_lp(monkeypatch, seed):
    """An interior point's answer (vertex=False) gives its optimal basis by crossover from its
    own point; the same program with another objective, begun from that basis, ends at the
    optimum it reaches from nothing, by the simplex method from the basis."""
    monkeypatch.setattr(highs, "IPM_ROWS", 0)
    p = _linear(seed)
    prog, x = _lp(p)
    first = prog.maximise([(x, _objective(p))], vertex=False)
    basis = first.basis(10.0)
    assert basis is not None and basis.valid
    other = p.value * np.random.default_rng(seed).uniform(0.5, 1.5, size=p.value.size)
    used = _returns(monkeypatch, highs, "_from_basis")
    begun = prog.maximise([(x, other)], basis=basis)
    assert used and used[0] is not None  # ended from the basis, not solved again
    assert begun.status == "optimal"
    cold = prog.maximise([(x, other)])
    assert float(other @ begun["x"]) == pytest.approx(float(other @ cold["x"]), rel=1e-9)
    _holds(p, begun["x"], tol=1e-6)


@pytest.mark.parametrize("seed", range(2))
def test_maxmin_stage_two_begins_from_stage_ones_basis_without_an_interior_point(monkeypatch, seed):
    """Where eg's interior point gives stage 2 no start (it stalls at tau* on rounds of a few
    large tenants), stage 2 begins from stage 1's optimal basis: the same worst share ratio
    and the same stage-2 value as stage 2 solved from nothing."""
    base = _instance(seed, bids=600, tenants=40)
    inst = dataclasses.replace(
        base, tiers=tuple(dataclasses.replace(t, capacity=t.capacity // 4) for t in base.tiers)
    )
    monkeypatch.setattr(highs, "IPM_ROWS", 0)
    monkeypatch.setattr(maxmin, "_interior_start", lambda *args, **kwargs: None)
    monkeypatch.setattr(maxmin, "_tau_bound", lambda *args, **kwargs: np.inf)  # stage 1 runs
    used = _returns(monkeypatch, highs, "_from_basis")
    begun = clear(inst, mechanism="maxmin", divisible=True)
    assert used and all(found is not None for found in used)
    original = maxmin._stage_two
    monkeypatch.setattr(maxmin, "_stage_two", lambda *a, **k: original(*a, **{**k, "after": None}))
    used.clear()
    cold = clear(inst, mechanism="maxmin", divisible=True)
    assert not used
    assert begun.diagnostics["min_share_ratio"] == pytest.approx(
        cold.diagnostics["min_share_ratio"], rel=1e-7
    )
    assert _stage_two_value(inst, begun) == pytest.approx(_stage_two_value(inst, cold), rel=1e-7)


def _stage_two_value(inst: Instance, result) -> float:
    """sum_i u_i: each GPU at its tenant's best limit on its tier."""
    a = instance_arrays(inst)
    best = np.zeros((a.n_tenants, a.n_tiers))
    np.maximum.at(best, (a.arc_tenant, a.arc_tier), a.arc_price)
    tier = {name: t for t, name in enumerate(a.tier_names)}
    tenant = dict(zip(a.bid_ids, a.bid_tenant.tolist(), strict=True))
    return sum(best[tenant[x.bid], tier[x.tier]] * x.gpus for x in result.allocations)


class _Unproven:
    """A solver that reports its interior point's run as not proven optimal (as HiGHS does
    when the point's duals end just past its tolerance, seen on maxmin's stage 1 of 1,000
    tenants at 100k bids), and is itself again once it is run on."""

    def __init__(self, h):
        self._h, self._unproven = h, True

    def getModelStatus(self):  # noqa: N802 - highspy's name
        if self._unproven:
            return highs.highspy.HighsModelStatus.kUnknown
        return self._h.getModelStatus()

    def run(self):
        self._unproven = False
        return self._h.run()

    def __getattr__(self, name):
        return getattr(self._h, name)


@pytest.mark.parametrize("seed", range(3))
def test_an_interior_point_not_proven_optimal_gets_its_vertex_from_its_own_point(monkeypatch, seed):
    """vertex=False whose interior point is feasible but not proven optimal: crossover from
    that point and the simplex method in the same solver give the optimal vertex; the LP is
    not solved again from nothing."""
    monkeypatch.setattr(highs, "IPM_ROWS", 0)
    p = _linear(seed)
    prog, x = _lp(p)
    c = _objective(p)
    expected = float(c @ prog.maximise([(x, c)])["x"])
    original = highs._run
    runs = []

    def unproven(lp_, **kwargs):
        runs.append(kwargs["crossover"])
        return _Unproven(original(lp_, **kwargs))

    monkeypatch.setattr(highs, "_run", unproven)
    found = prog.maximise([(x, c)], vertex=False)
    assert runs == [False]
    assert found.status == "optimal"
    assert float(c @ found["x"]) == pytest.approx(expected, rel=1e-9)
    _holds(p, found["x"], tol=1e-6)
