"""fisher's program by its structured interior point (market/clearing/solvers/eg.py) beside Clarabel.

    .venv/bin/python bench/fisher_structure.py                       # 1k, 10k and 100k bids
    .venv/bin/python bench/fisher_structure.py --sizes 1000,10000,5

For `bench/clearing.py`'s instances, builds the Eisenberg-Gale program as `fisher` does (the
guarantee rows included) and solves it twice, each from the arrays: by Clarabel through
cvxpy with fisher's settings, and by `eg.solve`. It prints both times, the interior point's
steps, its proven gap (the exact dual function at its prices, less the objective of its
allocation) and how far its tier prices are from Clarabel's duals. docs/clearing.md gives
the figures."""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import cvxpy as cp
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from clearing import instance  # noqa: E402  (bench/clearing.py's instances)

from market.clearing.instance.inputs import instance_arrays  # noqa: E402
from market.clearing.mechanisms.fisher import CLARABEL_OPTIONS, buyer_budgets, program_arcs  # noqa: E402
from market.clearing.mechanisms.guarantee import guarantee_bundles  # noqa: E402
from market.clearing.mechanisms.rules import EPS, build_market, open_market  # noqa: E402
from market.clearing.mechanisms.values import tenant_values  # noqa: E402
from market.clearing.solvers import eg, lp


def program(tenants: int, bids: int, tiers: int) -> eg.Program:
    """The program fisher._solve_eg states for bench/clearing.py's instance (whole GPUs)."""
    market = build_market(instance_arrays(instance(tenants, bids, tiers)), divisible=False)
    a = market.arrays
    N = a.n_tenants
    v = tenant_values(market, None)[a.arc_tenant, a.arc_tier]
    budget, _ = buyer_budgets(market)
    g, _ = guarantee_bundles(market, v)
    held = np.bincount(a.arc_tenant, weights=v * market.floor_x, minlength=N)
    om = open_market(market)
    cols = program_arcs(market, om, v, budget)
    if (om.arc_capped[cols] >= 0).any():
        raise SystemExit("a share cap binds in this instance: not covered by this measurement")
    buyers, t_row = np.unique(a.bid_tenant[om.arc_bid[cols]], return_inverse=True)
    bid_rows, b_row = np.unique(om.arc_bid[cols], return_inverse=True)
    scale = np.zeros(buyers.size)
    np.maximum.at(scale, t_row, v[cols])
    need = g[buyers] - held[buyers] > EPS
    return eg.Program(
        arc_bid=b_row,
        arc_tier=om.arc_tier[cols],
        value=v[cols] / scale[t_row],
        bid_room=om.bid_room[bid_rows],
        bid_buyer=np.searchsorted(buyers, a.bid_tenant[bid_rows]),
        weight=budget[buyers] / budget[buyers].sum(),
        held=held[buyers] / scale,
        floor=np.where(need, g[buyers] / scale, 0.0),
        capacity=om.tier_room,
    )


def by_clarabel(p: eg.Program) -> tuple[np.ndarray, float, float]:
    """Tier duals, seconds, objective: the conic program as fisher._solve_eg states it."""
    n, T = p.weight.size, p.capacity.size
    x = cp.Variable(p.arc_bid.size, nonneg=True)
    u = p.held + lp.incidence(p.bid_buyer[p.arc_bid], n, p.value) @ x
    capacity = lp.incidence(p.arc_tier, T) @ x <= p.capacity
    rows = [lp.incidence(p.arc_bid, p.bid_room.size) @ x <= p.bid_room, capacity]
    need = np.flatnonzero(p.floor > 0)
    if need.size:
        rows.append(u[need] >= p.floor[need])
    problem = cp.Problem(cp.Maximize(p.weight @ cp.log(u)), rows)
    start = time.perf_counter()
    problem.solve(solver=cp.CLARABEL, **CLARABEL_OPTIONS)
    seconds = time.perf_counter() - start
    return np.asarray(capacity.dual_value).ravel(), seconds, float(problem.value)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--sizes",
        nargs="*",
        default=["100,1000,5", "1000,10000,5", "10000,100000,8"],
        help="tenants,bids,tiers triples",
    )
    args = parser.parse_args()
    print(f"# {time.strftime('%Y-%m-%d %H:%M %Z')}  nproc={os.cpu_count()}")
    print(
        f"{'bids':>7} {'arcs':>7} {'clarabel':>9} {'eg':>7} {'steps':>5} {'gap':>9} "
        f"{'obj diff':>9} {'price diff':>10}"
    )
    for size in args.sizes:
        tenants, bids, tiers = (int(s) for s in size.split(","))
        p = program(tenants, bids, tiers)
        duals, conic_seconds, conic_value = by_clarabel(p)
        start = time.perf_counter()
        found = eg.solve(p, time_limit=600)
        seconds = time.perf_counter() - start
        if found is None:
            print(f"{bids:7} {p.arc_bid.size:7} {conic_seconds:9.3f}  eg: no proof")
            continue
        diff = float(np.max(np.abs(found.prices / np.maximum(duals, 1e-300) - 1)))
        print(
            f"{bids:7} {p.arc_bid.size:7} {conic_seconds:9.3f} {seconds:7.3f} {found.steps:5} "
            f"{found.gap:9.2e} {eg.objective(p, found.x) - conic_value:9.2e} {diff:10.2e}",
            flush=True,
        )


if __name__ == "__main__":
    main()
