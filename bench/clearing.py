"""Clearing benchmark (not a test): build / solve / rounding / total seconds per policy and
size, and the bare solver call on the same problem; ``unmet``: the tenants left below their
guarantee (0 unless something is wrong or a time limit forced a fallback).

    .venv/bin/python bench/clearing.py                       # every size and policy
    .venv/bin/python bench/clearing.py --sizes 100,1000,5 --policies welfare
    .venv/bin/python bench/clearing.py --parts 4 --workers 2 \
        --sizes 10000,100000,8 100000,1000000,8               # partitioned (POP) clearing
    .venv/bin/python bench/clearing.py --arrays-only --envy --repeat 2 \
        --sizes 100000,1000000,8 --policies welfare           # envy_count's share of a clear

Values are heterogeneous: a bid is a job type from the Gavel data
(shared/data/gavel/simulation_throughputs.json) and values a tier by its measured
throughput on the tier's GPU type, so tiers rank differently for different bids.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from functools import partial
from pathlib import Path

import cvxpy as cp
import msgpack
import numpy as np
import scipy.sparse as sp
from ortools.graph.python import min_cost_flow

# The checkout this script is in, ahead of the installed one: run from another worktree (the
# code before a change, say), it measures that worktree's code, not the editable install's.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import market.clearing  # noqa: E402
from market.clearing import Bid, Instance, SolverError, Tenant, Tier, clear, clear_arrays
from market.clearing.instance.columns import arrays_from_json, arrays_to_json  # noqa: E402
from market.clearing.instance.inputs import instance_arrays  # noqa: E402
from market.clearing.mechanisms.rules import build_market, open_market  # noqa: E402
from market.clearing.parts.partition import clear_part, clear_partitioned  # noqa: E402
from market.clearing.solvers import eg, highs

DATA = Path(__file__).resolve().parents[2] / "shared" / "data" / "gavel"
GPU_TYPES = ("k80", "p100", "v100")
SIZES = ((100, 1_000, 5), (1_000, 10_000, 5), (10_000, 100_000, 8))


def throughputs() -> np.ndarray:
    """(jobs, 3) steps/s of each single-GPU job type alone on k80, p100, v100."""
    raw = json.loads((DATA / "simulation_throughputs.json").read_text())
    jobs = sorted(k for k in raw["k80"] if k.endswith(", 1)") and k in raw["v100"])
    rows = [[raw[g][j]["null"] for g in GPU_TYPES] for j in jobs]
    table = np.array(rows)
    return table[(table > 0).all(axis=1)]


def instance(
    tenants: int,
    bids: int,
    tiers: int,
    *,
    seed: int = 0,
    gang_share: float = 0.0,
    weight: float = 1.0,
) -> Instance:
    rng = np.random.default_rng(seed)
    speed = throughputs()
    speed = speed / speed[:, :1]  # relative to k80
    gpu = np.arange(tiers) % 3
    premium = 1.0 + 0.15 * (np.arange(tiers) // 3)  # e.g. a second v100 pool with NVLink
    quantity = rng.choice([1, 2, 4, 8], size=bids, p=[0.55, 0.2, 0.15, 0.1])
    demand = quantity.sum()
    tier_list = tuple(
        Tier(
            name=f"t{t}-{GPU_TYPES[gpu[t]]}",
            capacity=int(0.6 * demand / tiers),
            reserve_price=1,
            max_share=0.5 if t == tiers - 1 else 1.0,
        )
        for t in range(tiers)
    )
    job = rng.integers(0, speed.shape[0], size=bids)
    level = rng.lognormal(mean=2.0, sigma=0.5, size=bids)  # credits per GPU-hour on a k80
    owner = rng.integers(0, tenants, size=bids)
    bid_list = []
    for b in range(bids):
        accept = rng.choice(tiers, size=rng.integers(1, 4), replace=False)
        limits = {
            tier_list[t].name: max(1, round(float(level[b] * speed[job[b], gpu[t]] * premium[t])))
            for t in sorted(accept)
        }
        gang = rng.random() < gang_share
        bid_list.append(
            Bid(
                id=f"b{b:06d}",
                tenant=f"n{owner[b]:05d}",
                quantity=int(quantity[b]),
                limits=limits,
                min_quantity=int(quantity[b]) if gang else 0,
            )
        )
    tenant_list = tuple(Tenant(name=f"n{i:05d}", weight=weight) for i in range(tenants))
    return Instance(tiers=tier_list, tenants=tenant_list, bids=tuple(bid_list))


def bare_welfare(inst: Instance, limit: float) -> float:
    """One direct HiGHS LP of the same welfare problem (floors fixed, as the policy does)."""
    market = build_market(instance_arrays(inst), divisible=False)
    om = open_market(market)
    E, B, T = om.arc_bid.size, om.bid_room.size, om.tier_room.size
    capped = om.arc_capped >= 0
    G = om.group_room.size
    rows = np.concatenate([om.arc_bid, B + om.arc_tier, B + T + om.arc_capped[capped]])
    cols = np.concatenate([np.arange(E), np.arange(E), np.flatnonzero(capped)])
    A = sp.csc_matrix((np.ones(rows.size), (rows, cols)), shape=(B + T + G, E))
    sol = highs.solve(
        cost=om.arc_price,
        matrix=A,
        row_lo=np.full(B + T + G, -np.inf),
        row_hi=np.concatenate([om.bid_room, om.tier_room, om.group_room]),
        col_lo=np.zeros(E),
        col_hi=np.full(E, np.inf),
        time_limit=limit,
    )
    return sol.seconds


def bare_min_cost_flow(inst: Instance) -> float:
    """One plain min-cost flow (OR-Tools) of the welfare problem without the guarantee:
    source -> bid -> [capped group] -> tier -> sink, a node per bid, costs in milli-credits,
    a bypass arc; what a plain market without fairness would solve. Seconds to build the
    arrays and solve."""
    a = instance_arrays(inst)
    om = open_market(
        build_market(a, divisible=False), arc_price=a.arc_price - a.reserve[a.arc_tier]
    )
    start = time.perf_counter()
    B, T = om.bid_room.size, om.tier_room.size
    use = np.flatnonzero(om.arc_price > 0)
    capped = om.arc_capped[use]
    groups, row = np.unique(capped[capped >= 0], return_inverse=True)
    group_node = np.full(om.group_room.size, -1)
    group_node[groups] = B + np.arange(groups.size)
    group_tier = np.zeros(groups.size, dtype=np.int64)
    group_tier[row] = om.arc_tier[use][capped >= 0]
    tier0, sink = B + groups.size, B + groups.size + T
    source = sink + 1
    supply = int(om.bid_room.sum())
    head = np.where(capped >= 0, group_node[np.maximum(capped, 0)], tier0 + om.arc_tier[use])
    solver = min_cost_flow.SimpleMinCostFlow()
    solver.add_arcs_with_capacity_and_unit_cost(
        np.concatenate(
            [
                om.arc_bid[use],
                B + np.arange(groups.size),
                tier0 + np.arange(T),
                np.full(B + 1, source),
            ]
        ).astype(np.int32),
        np.concatenate([head, tier0 + group_tier, np.full(T, sink), np.arange(B), [sink]]).astype(
            np.int32
        ),
        np.rint(
            np.concatenate(
                [
                    om.bid_room[om.arc_bid[use]],
                    om.group_room[groups],
                    om.tier_room,
                    om.bid_room,
                    [supply],
                ]
            )
        ).astype(np.int64),
        np.concatenate(
            [-np.rint(om.arc_price[use] * 1000), np.zeros(groups.size + T + B + 1)]
        ).astype(np.int64),
    )
    supplies = np.zeros(source + 1, dtype=np.int64)
    supplies[source], supplies[sink] = supply, -supply
    solver.set_nodes_supplies(np.arange(source + 1, dtype=np.int32), supplies)
    if solver.solve() != solver.OPTIMAL:
        raise SolverError("the plain min-cost flow did not solve")
    return time.perf_counter() - start


def recorded_calls(inst: Instance, policy: str, params: dict | None) -> list:
    """Clear once more while recording every solver call the policy makes."""
    calls: list = []
    if policy == "fisher":
        original, original_eg = cp.Problem.solve, eg.solve

        def spy(problem: cp.Problem, *args: object, **kwargs: object) -> object:
            calls.append((problem, kwargs))
            return original(problem, *args, **kwargs)

        def spy_eg(program: eg.Program, **kwargs: object) -> eg.Solution | None:
            calls.append((program, kwargs))
            return original_eg(program, **kwargs)

        cp.Problem.solve, eg.solve = spy, spy_eg
        try:
            clear(inst, mechanism=policy, params=params)
        finally:
            cp.Problem.solve, eg.solve = original, original_eg
    else:
        original = highs.solve

        def spy_highs(**kwargs: object) -> highs.LpSolution:
            calls.append(kwargs)
            return original(**kwargs)

        highs.solve = spy_highs
        try:
            clear(inst, mechanism=policy, params=params)
        finally:
            highs.solve = original
    return calls


def bare_same_problem(inst: Instance, policy: str, params: dict | None) -> float:
    """The policy's own solver calls run bare, from a fresh model each: for fisher its
    structured interior point (eg.solve) on the same program, or a new cvxpy Problem over
    the same expressions (canonicalisation + Clarabel); the same HiGHS model for maxmin."""
    total = 0.0
    for call in recorded_calls(inst, policy, params):
        start = time.perf_counter()
        if policy == "fisher" and isinstance(call[0], eg.Program):
            eg.solve(call[0], **call[1])
        elif policy == "fisher":
            problem, kwargs = call
            cp.Problem(problem.objective, problem.constraints).solve(**kwargs)
        else:
            highs.solve(**call)
        total += time.perf_counter() - start
    return total


def _clear_wire(payload: bytes) -> bytes:
    """A worker's side of a part, as the market.clear_part task does it: the columns in as
    MessagePack, checked, cleared, the result out as MessagePack."""
    arrays, mechanism, params, reserved_quotas = arrays_from_json(msgpack.unpackb(payload))
    return msgpack.packb(
        clear_part(arrays, mechanism=mechanism, params=params, reserved_quotas=reserved_quotas)
    )


def _on_pool(pool: ProcessPoolExecutor, policy: str, params: dict | None):
    """map_parts that sends each part to the pool as the platform sends it to a Celery worker
    (the columns as MessagePack, the result back the same way), so the encoding is in the
    figures."""

    def map_parts(_clear: object, subs) -> list[dict]:
        payloads = [
            msgpack.packb(arrays_to_json(s, mechanism=policy, params=params, packed=True))
            for s in subs
        ]
        return [msgpack.unpackb(r) for r in pool.map(_clear_wire, payloads)]

    return map_parts


def objective(inst: Instance, result, policy: str) -> float:
    """The figure each policy maximises, read off a result: total value for welfare, the
    worst tenant's share ratio for maxmin, Nash welfare (sum of weight x log value) for
    fisher. Values are the bids' limits, as the mechanisms use them."""
    if policy == "welfare":
        return result.diagnostics["welfare"]
    if policy == "maxmin":
        return result.diagnostics["min_share_ratio"] or 0.0
    limits = {b.id: (b.tenant, b.limits) for b in inst.bids}
    value: dict[str, float] = {}
    for a in result.allocations:
        tenant, lim = limits[a.bid]
        value[tenant] = value.get(tenant, 0.0) + a.gpus * lim[a.tier]
    weight = {t.name: max(t.weight, 1e-9) for t in inst.tenants}
    return sum(weight[t] * math.log(v) for t, v in value.items() if v > 0)


def loss(policy: str, exact: float, split: float, inst: Instance) -> float:
    """Relative loss of the partitioned clear; for fisher, of the weighted geometric mean."""
    if policy == "fisher":
        total_weight = sum(max(t.weight, 1e-9) for t in inst.tenants)
        return 1.0 - math.exp((split - exact) / total_weight)
    return 1.0 - split / exact if exact else 0.0


def partitioned(args, sizes) -> None:
    print(
        f"{'policy':8} {'tenants':>7} {'bids':>8} {'tiers':>5} {'parts':>5} {'workers':>7} "
        f"{'exact':>8} {'split':>8} {'divide':>7} {'slowest':>8} {'loss':>7} {'arrays':>8} "
        f"{'unmet':>6}"
    )
    with ProcessPoolExecutor(max_workers=args.workers) as pool:
        # The platform's Celery workers are long-lived: their imports and first calls are
        # paid once, not in a round. So are the pool's here, on a small round of each policy
        # in as many parts as there are processes, twice over (the first policy measured
        # cold took 6 s more of a million-bid clear than the same policy warm).
        small = instance_arrays(instance(200, 2_000, 4, seed=args.seed + 1))
        for policy in args.policies.split(","):
            for _ in range(2):
                clear_partitioned(
                    small,
                    parts=2 * args.workers,
                    clear_part=partial(clear_part, mechanism=policy, params=None),
                    map_parts=_on_pool(pool, policy, None),
                )
        for tenants, bids, tiers in sizes:
            inst = instance(
                tenants,
                bids,
                tiers,
                seed=args.seed,
                gang_share=args.gang_share,
                weight=args.weight,
            )
            for policy in args.policies.split(","):
                params = {"time_limit": args.time_limit}
                start = time.perf_counter()
                arrays = instance_arrays(inst)
                divide = build = time.perf_counter() - start
                r = clear_partitioned(
                    arrays,
                    parts=args.parts,
                    # What each worker runs on its part; _on_pool sends it there as MessagePack.
                    clear_part=partial(clear_part, mechanism=policy, params=params),
                    map_parts=_on_pool(pool, policy, params),
                )
                split_seconds = time.perf_counter() - start
                divide += r.diagnostics["split_seconds"]
                exact_text, loss_text = "-", "-"
                if bids <= args.max_exact_bids:
                    try:
                        e = clear(inst, mechanism=policy, params=params)
                    except SolverError:  # the exact clear hit --time-limit
                        exact_text = f">{args.time_limit:g}s"
                    else:
                        exact_text = f"{e.diagnostics['total_seconds']:8.2f}"
                        lost = loss(
                            policy, objective(inst, e, policy), objective(inst, r, policy), inst
                        )
                        loss_text = f"{100 * lost:6.2f}%"
                print(
                    f"{policy:8} {tenants:7} {bids:8} {tiers:5} {args.parts:5} {args.workers:7} "
                    f"{exact_text:>8} {split_seconds:8.2f} {divide:7.2f} "
                    f"{max(r.diagnostics['part_seconds']):8.2f} {loss_text:>7} "
                    f"{split_seconds - build:8.2f} {r.diagnostics['guarantees_unmet']:6d}",
                    flush=True,
                )


def timed_envy(seconds: list[float]):
    """envy_count as clear_arrays calls it, adding each call's seconds to ``seconds``."""
    original = market.clearing.envy_count

    def envy_count(*args: object) -> int:
        start = time.perf_counter()
        try:
            return original(*args)
        finally:
            seconds.append(time.perf_counter() - start)

    return original, envy_count


def arrays_only(args, sizes) -> None:
    """Each exact clear from the instance's arrays, --repeat times, every run's seconds and
    the least: the figure the platform's path gives, without the bare solves around it. With
    --envy, each run's seconds in envy_count follow it (the metric, inside the clear)."""
    print(
        f"{'policy':8} {'tenants':>7} {'bids':>7} {'tiers':>5}  {'least':>6}  "
        f"{'worst':>6} {'unmet':>5}  runs" + ("  (envy_count s, share)" if args.envy else "")
    )
    for tenants, bids, tiers in sizes:
        arrays = instance_arrays(
            instance(
                tenants, bids, tiers, seed=args.seed, gang_share=args.gang_share, weight=args.weight
            )
        )
        for policy in args.policies.split(","):
            params = {"time_limit": args.time_limit}
            envy: list[float] = []
            original, spy = timed_envy(envy)
            if args.envy:
                market.clearing.envy_count = spy
            try:
                results = [
                    clear_arrays(arrays, mechanism=policy, params=params).diagnostics
                    for _ in range(args.repeat)
                ]
            finally:
                market.clearing.envy_count = original
            runs = [d["total_seconds"] for d in results]
            d = results[-1]  # the worst share ratio and the guarantees left unmet
            text = " ".join(f"{r:.2f}" for r in runs)
            if args.envy:
                text += (
                    "  ("
                    + ", ".join(
                        f"{e:.3f} s {100 * e / r:.1f} %" for e, r in zip(envy, runs, strict=True)
                    )
                    + f"; {d['envy_violations']} envious)"
                )
            print(
                f"{policy:8} {tenants:7} {bids:7} {tiers:5}  {min(runs):6.2f}  "
                f"{d['min_share_ratio']:6.4f} {d['guarantees_unmet']:5d}  " + text,
                flush=True,
            )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--sizes", nargs="*", help="tenants,bids,tiers triples (default: all three)"
    )
    parser.add_argument("--policies", default="welfare,fisher,maxmin")
    parser.add_argument("--bare-limit", type=float, default=60.0, help="time limit of a bare LP, s")
    parser.add_argument(
        "--max-fair-bids", type=int, default=10_000, help="skip fisher/maxmin above this many bids"
    )
    parser.add_argument("--gang-share", type=float, default=0.0, help="fraction of gang bids")
    parser.add_argument("--seed", type=int, default=0, help="seed of the random instances")
    parser.add_argument(
        "--repeat",
        type=int,
        default=3,
        help="the arrays and mcf columns are the least of this many runs (the machines here "
        "vary 10-30 %% run to run)",
    )
    parser.add_argument(
        "--weight", type=float, default=1.0, help="every tenant's weight (0: no guarantee)"
    )
    parser.add_argument("--time-limit", type=float, default=10.0, help="params.time_limit, s")
    parser.add_argument(
        "--parts", type=int, default=0, help="clear partitioned into this many parts (POP)"
    )
    parser.add_argument("--workers", type=int, default=2, help="processes for the parts")
    parser.add_argument(
        "--max-exact-bids",
        type=int,
        default=100_000,
        help="with --parts: also clear exactly (for the loss) up to this many bids",
    )
    parser.add_argument(
        "--arrays-only",
        action="store_true",
        help="only the clear from arrays, each of --repeat runs (no bare or object figures)",
    )
    parser.add_argument(
        "--envy",
        action="store_true",
        help="with --arrays-only: each run's seconds in envy_count and its share of the clear",
    )
    args = parser.parse_args()
    highs.banner_silence()
    sizes = [tuple(int(v) for v in s.split(",")) for s in args.sizes] if args.sizes else SIZES
    cpu = next(
        (
            ln.split(":", 1)[1].strip()
            for ln in Path("/proc/cpuinfo").read_text().splitlines()
            if ln.startswith("model name")
        ),
        platform.processor(),
    )
    load = os.getloadavg()[0]
    print(
        f"# {time.strftime('%Y-%m-%d %H:%M %Z')}  nproc={os.cpu_count()}  cpu={cpu}  load={load:.1f}"
    )
    if args.parts:
        partitioned(args, sizes)
        return
    # As in a long-lived worker, imports and first calls (numba loading the compiled path
    # search: 0.1-0.2 s from its cache, about 3 s the first time it compiles) are paid once,
    # before the figures, and said here.
    start = time.perf_counter()
    small = instance_arrays(instance(200, 2_000, 4, seed=args.seed + 1))
    for policy in args.policies.split(","):
        clear_arrays(small, mechanism=policy, params={"time_limit": args.time_limit})
    print(f"# warm-up (a 2,000-bid clear of each policy): {time.perf_counter() - start:.2f} s")
    if args.arrays_only:
        arrays_only(args, sizes)
        return
    print(
        f"{'policy':8} {'tenants':>7} {'bids':>7} {'tiers':>5} {'build':>7} {'solve':>7} "
        f"{'round':>7} {'total':>7} {'bare':>8} {'ratio':>6} {'mcf':>7} {'x mcf':>6}  "
        f"{'arrays':>7} {'a/mcf':>6}  {'unmet':>5}  status"
    )
    for tenants, bids, tiers in sizes:
        inst = instance(
            tenants, bids, tiers, seed=args.seed, gang_share=args.gang_share, weight=args.weight
        )
        for policy in args.policies.split(","):
            if policy != "welfare" and bids > args.max_fair_bids:
                print(f"{policy:8} {tenants:7} {bids:7} {tiers:5}  skipped (> --max-fair-bids)")
                continue
            params = {"time_limit": args.time_limit}
            start = time.perf_counter()
            try:
                r = clear(inst, mechanism=policy, params=params)
            except SolverError as exc:  # e.g. the time limit: the row says so, the rest runs
                seconds = time.perf_counter() - start
                print(
                    f"{policy:8} {tenants:7} {bids:7} {tiers:5}  failed after {seconds:.1f} s: {exc}"
                )
                continue
            d = r.diagnostics
            # The same clear from the instance's arrays, what the platform calls (its rounds
            # are read into arrays, never into an Instance): it starts once the instance has
            # been read, like the bare flow's figure.
            arrays = instance_arrays(inst)
            seconds = min(
                clear_arrays(arrays, mechanism=policy, params=params).diagnostics["total_seconds"]
                for _ in range(args.repeat)
            )
            mcf_text = f"{'-':>7} {'-':>6}  {seconds:7.3f} {'-':>6}"
            if policy == "welfare":
                try:
                    bare = bare_welfare(inst, args.bare_limit)
                except SolverError:  # the direct LP hit --bare-limit
                    bare = math.inf
                mcf = min(bare_min_cost_flow(inst) for _ in range(args.repeat))
                mcf_text = f"{mcf:7.3f} {d['total_seconds'] / mcf:6.2f}  {seconds:7.3f} {seconds / mcf:6.2f}"
            else:
                bare = bare_same_problem(inst, policy, params)
            bare_text = f"{bare:8.3f}" if bare < args.bare_limit else f">{args.bare_limit:7.0f}"
            print(
                f"{policy:8} {tenants:7} {bids:7} {tiers:5} {d['build_seconds']:7.3f} "
                f"{d['solve_seconds']:7.3f} {d['rounding_seconds']:7.3f} "
                f"{d['total_seconds']:7.3f} {bare_text} {d['total_seconds'] / bare:6.2f} "
                f"{mcf_text}  {d['guarantees_unmet']:5d}  {d['status']}",
                flush=True,
            )


if __name__ == "__main__":
    main()
