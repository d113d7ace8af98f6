"""fisher's program by its structured interior point (eg.py) against the conic program, its
proof (the exact dual function), and fisher's use of it."""

from __future__ import annotations

import dataclasses

import cvxpy as cp
import numpy as np
import pytest

from market.clearing import Bid, Instance, Tenant, Tier, clear
from market.clearing.mechanisms import fisher, maxmin
from market.clearing.solvers import eg, lp


def _program(seed: int, *, tenants: int = 40, tiers: int = 4, guarantee: float = 0.0):
    """A random program: values per (tenant, tier) from a few levels (ties are common), bids
    on 1-3 tiers, weights of different sizes, some value held already, and guarantees."""
    rng = np.random.default_rng(seed)
    value = rng.choice([0.25, 0.5, 0.75, 1.0], size=(tenants, tiers))
    value[np.arange(tenants), rng.integers(0, tiers, size=tenants)] = 1.0  # own scale
    bid_tenant = np.sort(rng.integers(0, tenants, size=4 * tenants))
    bid_tenant[:tenants] = np.arange(tenants)  # every tenant bids
    bid_tenant.sort()
    arc_bid, arc_tier = [], []
    for b in range(bid_tenant.size):
        for t in np.sort(rng.choice(tiers, size=rng.integers(1, 4), replace=False)):
            arc_bid.append(b)
            arc_tier.append(t)
    arc_bid, arc_tier = np.array(arc_bid), np.array(arc_tier)
    room = rng.choice([1.0, 2.0, 4.0, 8.0], size=bid_tenant.size)
    demand = np.bincount(arc_tier, weights=room[arc_bid] / 2, minlength=tiers)
    capacity = np.maximum(np.floor(0.6 * demand), 1.0)
    weight = rng.choice([1.0, 2.0, 5.0], size=tenants)
    weight /= weight.sum()
    held = np.where(rng.random(tenants) < 0.2, rng.random(tenants), 0.0)
    arc_value = value[bid_tenant[arc_bid], arc_tier]
    # Guarantees that hold together: ``guarantee`` times each tenant's value of one feasible
    # allocation (every bid spread over its tiers, then every tier scaled to its capacity).
    x = room[arc_bid] / np.bincount(arc_bid)[arc_bid]
    x *= np.minimum(1.0, capacity / np.bincount(arc_tier, weights=x, minlength=tiers))[arc_tier]
    fair = held + np.bincount(bid_tenant[arc_bid], weights=arc_value * x, minlength=tenants)
    floor = guarantee * fair
    return eg.Program(
        arc_bid=arc_bid,
        arc_tier=arc_tier,
        value=arc_value,
        bid_room=room,
        bid_buyer=bid_tenant,
        weight=weight,
        held=held,
        floor=np.where(floor > held, floor, 0.0),
        capacity=capacity,
    )


def _conic(p: eg.Program) -> tuple[float, np.ndarray]:
    """The optimum and the tier duals, by Clarabel at tight settings."""
    n, T = p.weight.size, p.capacity.size
    x = cp.Variable(p.arc_bid.size, nonneg=True)
    u = p.held + lp.incidence(p.bid_buyer[p.arc_bid], n, p.value) @ x
    tiers = lp.incidence(p.arc_tier, T) @ x <= p.capacity
    rows = [lp.incidence(p.arc_bid, p.bid_room.size) @ x <= p.bid_room, tiers]
    need = np.flatnonzero(p.floor > 0)
    if need.size:
        rows.append(u[need] >= p.floor[need])
    problem = cp.Problem(cp.Maximize(p.weight @ cp.log(u)), rows)
    problem.solve(solver=cp.CLARABEL, tol_gap_abs=1e-10, tol_gap_rel=1e-10)
    assert problem.status == cp.OPTIMAL
    return float(problem.value), np.asarray(tiers.dual_value).ravel()


def _holds(p: eg.Program, x: np.ndarray, tol: float = 0.0) -> None:
    """Every row of the program holds at x (``tol``: more slack on each, for a solver that
    meets its rows to a tolerance of its own)."""
    assert (x >= -tol).all()
    bids = np.bincount(p.arc_bid, weights=x, minlength=p.bid_room.size)
    assert (bids <= p.bid_room + 1e-9 + tol).all()
    assert (
        np.bincount(p.arc_tier, weights=x, minlength=p.capacity.size) <= p.capacity + 1e-9 + tol
    ).all()
    u = p.held + np.bincount(p.bid_buyer[p.arc_bid], weights=p.value * x, minlength=p.weight.size)
    assert (u >= p.floor * (1 - eg.SHORT) - 1e-12 - tol).all()


@pytest.mark.parametrize("guarantee", [0.0, 0.8, 1.0])
@pytest.mark.parametrize("seed", range(6))
def test_the_structured_interior_point_reaches_the_conic_optimum_and_proves_it(seed, guarantee):
    p = _program(seed, guarantee=guarantee)
    found = eg.solve(p, time_limit=60)
    assert found is not None
    _holds(p, found.x)
    best, duals = _conic(p)
    value = eg.objective(p, found.x)
    assert abs(value - best) <= 2 * max(eg.GAP_ABS, eg.GAP_REL * abs(best))
    # The proof is real: the dual function at its prices bounds the optimum from above
    # and is within the gap of what it returned.
    bound = eg.dual_bound(p, np.maximum(found.prices, 0.0))
    assert best <= bound + 1e-9
    assert bound - value == pytest.approx(found.gap)
    assert found.gap <= max(eg.GAP_ABS, eg.GAP_REL * abs(value))
    # The tier prices are close to the conic program's duals: what the proof fixes is D at
    # them, and D is flat near its minimum, so they agree less closely than the objectives.
    assert np.allclose(found.prices, duals, rtol=1e-2, atol=1e-3 * duals.max())


@pytest.mark.parametrize("seed", range(8))
def test_the_dual_function_bounds_every_allocation_at_every_price(seed):
    """Weak duality, which the proof rests on: D(pi) >= sum w log u(x) for any feasible x and
    any pi >= 0, guarantees included."""
    p = _program(seed, guarantee=0.8)
    rng = np.random.default_rng(100 + seed)
    found = eg.solve(p, time_limit=60)
    assert found is not None
    for _ in range(20):
        pi = found.prices * rng.uniform(0.0, 3.0, size=found.prices.size)
        x = found.x * rng.uniform(0.9, 1.0, size=found.x.size)  # feasible: less of each arc
        u = p.held + np.bincount(
            p.bid_buyer[p.arc_bid], weights=p.value * x, minlength=p.weight.size
        )
        if (u < p.floor).any():
            continue
        assert eg.dual_bound(p, pi) >= eg.objective(p, x) - 1e-12


def test_guarantees_that_leave_no_interior_are_met():
    """Equal weights and values, one tier, each tenant guaranteed half of it: the equal split
    is the only allocation that meets both guarantees, so the rows have no interior; the
    elastic slack lets the method start, and the proof checks the guarantees hold."""
    p = eg.Program(
        arc_bid=np.array([0, 1]),
        arc_tier=np.array([0, 0]),
        value=np.array([1.0, 1.0]),
        bid_room=np.array([10.0, 10.0]),
        bid_buyer=np.array([0, 1]),
        weight=np.array([0.99, 0.01]),
        held=np.zeros(2),
        floor=np.array([5.0, 5.0]),
        capacity=np.array([10.0]),
    )
    found = eg.solve(p, time_limit=60)
    assert found is not None
    assert found.x == pytest.approx([5.0, 5.0], abs=1e-6)
    _holds(p, found.x)


def _instance(seed: int, *, bids: int = 300, tenants: int = 30) -> Instance:
    rng = np.random.default_rng(seed)
    tiers = tuple(
        Tier(name=f"t{t}", capacity=(40 + 10 * t) * bids // 300, reserve_price=1) for t in range(4)
    )
    names = tuple(
        Tenant(name=f"n{i:02d}", weight=float(rng.choice([1, 2]))) for i in range(tenants)
    )
    out = []
    for b in range(bids):
        on = rng.choice(4, size=rng.integers(1, 4), replace=False)
        out.append(
            Bid(
                id=f"b{b:04d}",
                tenant=f"n{int(rng.integers(0, tenants)):02d}",
                quantity=int(rng.choice([1, 2, 4])),
                limits={f"t{t}": int(rng.integers(2, 30)) for t in sorted(on)},
            )
        )
    return Instance(tiers=tiers, tenants=names, bids=tuple(out))


def _utilities(result, inst: Instance) -> np.ndarray:
    best = {}
    for bid in inst.bids:
        for tier, limit in bid.limits.items():
            best[(bid.tenant, tier)] = max(best.get((bid.tenant, tier), 0), limit)
    owner = {bid.id: bid.tenant for bid in inst.bids}
    u = {t.name: 0.0 for t in inst.tenants}
    for a in result.allocations:
        u[owner[a.bid]] += a.gpus * best[(owner[a.bid], a.tier)]
    return np.array([u[t.name] for t in inst.tenants])


@pytest.mark.parametrize("seed", range(3))
def test_fisher_clears_the_same_by_either_solver(monkeypatch, seed):
    """fisher through eg.py (its threshold lowered to take this instance) and through the
    conic solver: the same utilities in divisible mode, and the same prices."""
    inst = _instance(seed)
    calls = []
    original = eg.solve

    def spy(program, **kwargs):
        found = original(program, **kwargs)
        calls.append(found)
        return found

    monkeypatch.setattr(eg, "solve", spy)
    monkeypatch.setattr(fisher, "STRUCTURED_ARCS", 0)
    structured = clear(inst, mechanism="fisher", divisible=True)
    assert calls and calls[0] is not None
    monkeypatch.setattr(fisher, "STRUCTURED_ARCS", 10**9)
    conic = clear(inst, mechanism="fisher", divisible=True)
    assert len(calls) == 1
    assert _utilities(structured, inst) == pytest.approx(
        _utilities(conic, inst), rel=1e-3, abs=1e-3
    )
    assert structured.prices == pytest.approx(conic.prices, rel=1e-3)


def test_fisher_solves_the_conic_program_when_no_proof_comes(monkeypatch):
    inst = _instance(0)
    monkeypatch.setattr(fisher, "STRUCTURED_ARCS", 0)
    monkeypatch.setattr(eg, "solve", lambda program, **kwargs: None)
    solved = []
    original = cp.Problem.solve

    def spy(problem, *args, **kwargs):
        solved.append(kwargs.get("solver"))
        return original(problem, *args, **kwargs)

    monkeypatch.setattr(cp.Problem, "solve", spy)
    result = clear(inst, mechanism="fisher", divisible=True)
    assert solved and solved[0] == cp.CLARABEL
    assert result.diagnostics["status"] == "optimal"


@pytest.mark.parametrize("mechanism", ["fisher", "maxmin"])
def test_reserved_quotas_that_fill_tiers_clear_through_the_interior_point(monkeypatch, mechanism):
    """Quotas by weight leave two tiers with no room (0 and 4e-14 GPUs of float dust): their
    arcs can carry nothing. eg.py's start scaled every arc to nothing and its system was
    singular (LinAlgError out of ``clear``); now those arcs and tiers are left out of its
    program, which answers as the solver without it does."""
    inst = dataclasses.replace(_instance(0, bids=600, tenants=40), reserved_quotas="by_weight")
    module = fisher if mechanism == "fisher" else maxmin
    used = []
    for name in ("solve", "interior"):
        original = getattr(eg, name)

        def spy(program, _original=original, **kwargs):
            found = _original(program, **kwargs)
            used.append(found is not None)
            return found

        monkeypatch.setattr(eg, name, spy)
    monkeypatch.setattr(module, "STRUCTURED_ARCS", 0)
    structured = clear(inst, mechanism=mechanism, divisible=True)
    # maxmin may ask twice: at tau*'s upper bound first (maxmin._tau_bound), then at tau*.
    assert used and all(used)
    monkeypatch.setattr(module, "STRUCTURED_ARCS", 10**9)
    plain = clear(inst, mechanism=mechanism, divisible=True)
    assert structured.diagnostics["status"] == plain.diagnostics["status"] == "optimal"
    if mechanism == "fisher":  # one optimum; maxmin's LP may end at another vertex of it
        assert _utilities(structured, inst) == pytest.approx(
            _utilities(plain, inst), rel=1e-3, abs=1e-3
        )
    else:
        assert structured.diagnostics["min_share_ratio"] == pytest.approx(
            plain.diagnostics["min_share_ratio"], rel=1e-6
        )
        assert _utilities(structured, inst).sum() == pytest.approx(
            _utilities(plain, inst).sum(), rel=1e-6
        )


def test_conjugate_gradients_stop_once_they_stop_gaining_and_keep_the_least_residual(monkeypatch):
    """A system asked for more than rounding allows (tolerance 0) ends after CG_STALL
    products without halving the least residual, not after CG_STEPS, and answers the x of
    the least residual seen."""
    seen: list[eg._System] = []
    real = eg._System.__init__

    def keep(self, *args, **kwargs):
        real(self, *args, **kwargs)
        seen.append(self)

    monkeypatch.setattr(eg._System, "__init__", keep)
    p = _program(3, guarantee=0.5)
    assert eg.solve(p, time_limit=60) is not None
    system = seen[-1]  # the last step's: near the optimum, the worst conditioned
    rhs = np.random.default_rng(0).standard_normal(system.d.size)
    calls = []
    times = system._times

    def counted(y):
        calls.append(1)
        return times(y)

    system.tol = 0.0
    system._times = counted
    x = system.solve(rhs)
    products = len(calls)
    assert products < 2 + eg.CG_STEPS  # it stopped before the cap ...
    assert products >= 1 + eg.CG_STALL  # ... once CG_STALL products gained nothing
    # Its answer is the best it saw: no iterate has a smaller true residual.
    size = np.linalg.norm(rhs - times(x))
    system.tol = 1e-300  # each earlier stopping point, by capping the steps
    for steps in range(products - 2):
        monkeypatch.setattr(eg, "CG_STEPS", steps)
        assert size <= 1.0001 * np.linalg.norm(rhs - times(system.solve(rhs)))
