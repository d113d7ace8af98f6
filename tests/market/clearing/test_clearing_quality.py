"""Allocation quality: the guarantee inside each mechanism, heterogeneity-aware max-min,
Pareto efficiency, envy, and the clearing defects found on hand-made instances."""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path

import numpy as np
import pytest
from scipy.optimize import linprog

from market.clearing import MECHANISMS, Bid, ClearingError, Instance, Tenant, Tier, clear

# The Gavel throughputs (k80/p100/v100 entries of shared/data/gavel, kept with the tests).
GAVEL = Path(__file__).resolve().parents[2] / "simulator" / "data"
GPU_TYPES = ("k80", "p100", "v100")


def golden(weight: float) -> Instance:
    """Gavel's max-min instance: the 26 single-GPU job types, one tenant and one bid each,
    values = throughput alone (steps/s) per GPU type, 6 GPUs of each type."""
    raw = json.loads((GAVEL / "simulation_throughputs.json").read_text())
    jobs = sorted(k for k in raw["k80"] if k.endswith(", 1)"))
    assert len(jobs) == 26
    return Instance(
        tiers=tuple(Tier(t, 6) for t in GPU_TYPES),
        tenants=tuple(Tenant(f"j{i:02d}", weight=weight) for i in range(26)),
        bids=tuple(
            Bid(f"b{i:02d}", f"j{i:02d}", 1, {t: raw[t][job]["null"] for t in GPU_TYPES})
            for i, job in enumerate(jobs)
        ),
    )


def tenant_values(inst: Instance) -> dict[tuple[str, str], float]:
    """fisher and maxmin value a tier at the tenant's best limit on it."""
    best: dict[tuple[str, str], float] = defaultdict(float)
    for b in inst.bids:
        for tier, p in b.limits.items():
            best[b.tenant, tier] = max(best[b.tenant, tier], p)
    return best


def value(inst: Instance, mechanism: str, bid: Bid, tier: str) -> float:
    """A GPU's value to the bid's tenant: welfare counts each bid's own limit."""
    return bid.limits[tier] if mechanism == "welfare" else tenant_values(inst)[bid.tenant, tier]


def utilities(inst: Instance, result, mechanism: str = "welfare") -> dict[str, float]:
    """Each tenant's value of what it won, in its own values."""
    bids = {b.id: b for b in inst.bids}
    out: dict[str, float] = defaultdict(float)
    for a in result.allocations:
        bid = bids[a.bid]
        out[bid.tenant] += a.gpus * value(inst, mechanism, bid, a.tier)
    return out


def equal_split(inst: Instance) -> dict[str, float]:
    """Value of 1/N of every tier (the golden instance's demand never binds: 18/26 < 1 GPU)."""
    n = len(inst.tenants)
    tiers = {t.name: t.capacity for t in inst.tiers}
    return {b.tenant: sum(p * tiers[t] / n for t, p in b.limits.items()) for b in inst.bids}


def test_golden_maxmin_gives_every_job_its_heterogeneity_aware_share():
    inst = golden(1.0)
    r = clear(inst, mechanism="maxmin", divisible=True)
    got, fair = utilities(inst, r), equal_split(inst)
    ratios = [got[t] / fair[t] for t in fair]
    assert min(ratios) == pytest.approx(1.2426, abs=1e-4)
    assert r.diagnostics["min_share_ratio"] == pytest.approx(1.2426, abs=1e-4)


def test_golden_welfare_without_weights_reaches_max_sum_throughput():
    r = clear(golden(0.0), mechanism="welfare", divisible=True)
    assert r.diagnostics["welfare"] == pytest.approx(560.566, abs=1e-3)


@pytest.mark.parametrize("mechanism", sorted(MECHANISMS))
def test_golden_every_mechanism_gives_every_tenant_its_equal_split(mechanism):
    inst = golden(1.0)
    r = clear(inst, mechanism=mechanism, divisible=True)
    got, fair = utilities(inst, r), equal_split(inst)
    for tenant, value in fair.items():
        assert got[tenant] >= value * (1 - 1e-6), tenant
    assert r.diagnostics["guarantees_unmet"] == 0


def _random(seed: int, *, tenants: int = 5, bids: int = 9, demand: tuple[int, int] = (1, 6)):
    rng = np.random.default_rng(seed)
    tiers = tuple(Tier(f"t{i}", int(rng.integers(2, 9))) for i in range(3))
    return Instance(
        tiers=tiers,
        tenants=tuple(Tenant(f"n{i}", weight=float(rng.choice([1, 1, 2]))) for i in range(tenants)),
        bids=tuple(
            Bid(
                f"b{k}",
                f"n{k % tenants}",
                int(rng.integers(*demand)),
                {t.name: float(rng.integers(1, 20)) for t in tiers if rng.random() < 0.8}
                or {tiers[0].name: 5.0},
            )
            for k in range(bids)
        ),
    )


def pareto_gain(inst: Instance, result, mechanism: str) -> float:
    """max sum_i u_i - sum_i u*_i over divisible allocations with every u_i >= u*_i: 0 when
    no reallocation raises one tenant's value without lowering another's."""
    bids, tiers, tenants = inst.bids, inst.tiers, [t.name for t in inst.tenants]
    arcs = [
        (b, t, value(inst, mechanism, bid, tier.name))
        for b, bid in enumerate(bids)
        for t, tier in enumerate(tiers)
        if tier.name in bid.limits
    ]
    now = utilities(inst, result, mechanism)
    A, rhs = [], []
    for b, bid in enumerate(bids):
        A.append([1.0 if a[0] == b else 0.0 for a in arcs])
        rhs.append(bid.quantity)
    for t, tier in enumerate(tiers):
        A.append([1.0 if a[1] == t else 0.0 for a in arcs])
        rhs.append(tier.capacity)
    for name in tenants:  # -u_i <= -u*_i
        A.append([-a[2] if bids[a[0]].tenant == name else 0.0 for a in arcs])
        rhs.append(-now.get(name, 0.0) * (1 - 1e-7))
    res = linprog(
        -np.array([a[2] for a in arcs]),
        A_ub=np.array(A),
        b_ub=np.array(rhs),
        bounds=(0, None),
        method="highs",
    )
    assert res.status == 0
    return -res.fun - sum(now.values())


@pytest.mark.parametrize("mechanism", sorted(MECHANISMS))
@pytest.mark.parametrize("seed", range(8))
def test_no_pareto_improvement_after_any_mechanism(mechanism, seed):
    inst = _random(seed)
    r = clear(inst, mechanism=mechanism, divisible=True)
    total = sum(utilities(inst, r, mechanism).values())
    assert pareto_gain(inst, r, mechanism) <= 1e-4 * (1 + total)


@pytest.mark.parametrize("seed", range(8))
def test_fisher_at_equal_budgets_has_no_envy(seed):
    # Demands larger than the market, so no quantity cap binds: the textbook setting.
    inst = _random(seed, demand=(30, 40))
    inst = Instance(
        tiers=inst.tiers,
        tenants=tuple(Tenant(t.name, weight=1.0) for t in inst.tenants),
        bids=inst.bids,
    )
    r = clear(inst, mechanism="fisher", divisible=True)
    assert r.diagnostics["envy_violations"] == 0


def test_welfare_with_reserves_trades_on_surplus_not_on_limits():
    # Worth 10 on t0 (reserve 8) and 9 on t1 (reserve 0): the surplus is 2 against 9, so the
    # bidder gets t1 and pays its reserve, 0, instead of t0 at 8 with t1 idle.
    inst = Instance(
        tiers=(Tier("t0", 1, reserve_price=8), Tier("t1", 1, reserve_price=0)),
        tenants=(Tenant("a", weight=0),),
        bids=(Bid("b", "a", 1, {"t0": 10, "t1": 9}),),
    )
    r = clear(inst)
    assert [(a.tier, a.gpus) for a in r.allocations] == [("t1", 1)]
    assert r.charges == {"b": 0.0}
    assert r.prices == {"t0": 8.0, "t1": 0.0}
    # Hiding t0 gains nothing: truthful bidding already gets the best payoff, 9 - 0.
    liar = Instance(inst.tiers, inst.tenants, (Bid("b", "a", 1, {"t1": 9}),))
    told = clear(liar)
    assert 9 - told.charges["b"] <= 9 - r.charges["b"]


# Three GPUs, three tenants: before, the GPUs freed by flooring went to the largest
# fractional parts, and one tenant got none (found by a random search on the old code).
ROUNDING_CASES = {
    "fisher": (
        {"b": 2, "c": 1},
        [("x", 1, {"b": 3, "c": 5}), ("y", 2, {"b": 1, "c": 1}), ("z", 3, {"b": 10, "c": 6})],
    ),
    "maxmin": (
        {"b": 1, "c": 2},
        [("x", 2, {"b": 7, "c": 2}), ("y", 1, {"b": 9, "c": 2}), ("z", 3, {"b": 9, "c": 2})],
    ),
}


@pytest.mark.parametrize("mechanism", sorted(ROUNDING_CASES))
def test_whole_gpu_rounding_gives_everyone_one_when_everyone_can_have_one(mechanism):
    tiers, bids = ROUNDING_CASES[mechanism]
    inst = Instance(
        tiers=tuple(Tier(name, capacity) for name, capacity in tiers.items()),
        tenants=tuple(Tenant(tenant) for tenant, *_ in bids),
        bids=tuple(Bid(f"b{tenant}", tenant, q, limits) for tenant, q, limits in bids),
    )
    r = clear(inst, mechanism=mechanism)
    assert sorted({a.bid for a in r.allocations}) == ["bx", "by", "bz"]


def test_fisher_never_charges_above_a_budget():
    inst = Instance(
        tiers=(Tier("a100", 4, reserve_price=10),),
        tenants=(Tenant("poor", weight=1, budget=1), Tenant("rich", weight=1)),
        bids=(Bid("p", "poor", 2, {"a100": 50}), Bid("r", "rich", 4, {"a100": 60})),
    )
    r = clear(inst, mechanism="fisher")
    assert r.spend["poor"] <= 1 + 1e-9
    assert r.charges.get("p", 0.0) <= 1 + 1e-9


def test_fisher_prices_an_unsold_tier_at_its_reserve():
    inst = Instance(
        tiers=(Tier("a", 4, reserve_price=2), Tier("b", 4, reserve_price=3)),
        tenants=(Tenant("x"), Tenant("y")),
        bids=(Bid("bx", "x", 2, {"a": 10}), Bid("by", "y", 2, {"a": 8})),
    )
    r = clear(inst, mechanism="fisher")
    assert r.prices["b"] == 3.0


def test_maxmin_reports_what_rounding_lost():
    # One GPU, two equal tenants: the fractional max-min gives each half; whole GPUs give
    # one of them nothing, so the minimum share ratio falls from 1 to 0.
    inst = Instance(
        tiers=(Tier("a", 1),),
        tenants=(Tenant("x"), Tenant("y")),
        bids=(Bid("bx", "x", 1, {"a": 5}), Bid("by", "y", 1, {"a": 5})),
    )
    r = clear(inst, mechanism="maxmin")
    assert r.diagnostics["rounding_loss"] == pytest.approx(1.0)


@pytest.mark.parametrize("mechanism", sorted(MECHANISMS))
def test_order_of_tenants_and_bids_changes_nothing(mechanism):
    # Equal limits under a share cap: a tie the documented rule (bid id) must break.
    tiers = (Tier("a", 4, max_share=0.5),)
    tenants = (Tenant("x", weight=0), Tenant("y", weight=0), Tenant("z", weight=0))
    bids = tuple(Bid(f"b{i}", t.name, 4, {"a": 7}) for i, t in enumerate(tenants))
    first = clear(Instance(tiers, tenants, bids), mechanism=mechanism).to_json()
    again = clear(Instance(tiers, tenants[::-1], bids[::-1]), mechanism=mechanism).to_json()
    for out in (first, again):
        for key in ("build_seconds", "solve_seconds", "rounding_seconds", "total_seconds"):
            out["diagnostics"].pop(key)
    assert first == again


def test_whole_gpu_mode_refuses_fractional_quantities():
    inst = Instance(
        tiers=(Tier("a", 4),),
        tenants=(Tenant("x"),),
        bids=(Bid("b", "x", 1.5, {"a": 5}),),
    )
    with pytest.raises(ClearingError, match=r"bid 'b'\.quantity: 1\.5 is not a whole number"):
        clear(inst)
    assert clear(inst, divisible=True).allocations[0].gpus == 1.5


def test_the_first_fractional_bid_by_id_is_named_whatever_the_order_of_the_list():
    bids = (
        Bid("c", "x", 2.5, {"a": 5}),
        Bid("a", "x", 1, {"a": 5}),
        Bid("b", "x", 2, {"a": 5}, min_quantity=1.5),
    )
    inst = Instance(tiers=(Tier("a", 4),), tenants=(Tenant("x"),), bids=bids)
    with pytest.raises(ClearingError, match=r"bid 'b'\.min_quantity: 1\.5 is not a whole"):
        clear(inst)


@pytest.mark.parametrize("mechanism", sorted(MECHANISMS))
def test_a_gang_sits_on_one_tier(mechanism):
    inst = Instance(
        tiers=(Tier("k80", 4), Tier("v100", 4)),
        tenants=(Tenant("x", weight=0),),
        bids=(Bid("g", "x", 8, {"k80": 5, "v100": 9}, min_quantity=8),),
    )
    assert clear(inst, mechanism=mechanism).allocations == ()
    mixed = Instance(
        tiers=inst.tiers,
        tenants=inst.tenants,
        bids=(Bid("g", "x", 8, {"k80": 5, "v100": 9}, min_quantity=8, mixed_tiers=True),),
    )
    got = {a.tier: a.gpus for a in clear(mixed, mechanism=mechanism).allocations}
    assert got == {"k80": 4, "v100": 4}


def test_reserved_quotas_by_weight_keep_the_per_tier_split():
    # The old behaviour, one setting away: half of the tier is set aside for each tenant.
    tiers = (Tier("a100", 10, reserve_price=1),)
    tenants = (Tenant("rich", weight=1), Tenant("small", weight=1))
    bids = (Bid("r", "rich", 10, {"a100": 100}), Bid("s", "small", 6, {"a100": 3}))
    r = clear(Instance(tiers, tenants, bids, reserved_quotas="by_weight"))
    got = {a.bid: a.gpus for a in r.allocations}
    assert got == {"r": 5, "s": 5}
    assert r.prices == {"a100": 100.0}
    explicit = clear(Instance(tiers, tenants, bids, reserved_quotas={"small": {"a100": 2}}))
    assert {a.bid: a.gpus for a in explicit.allocations} == {"r": 8, "s": 2}


def test_reserved_quotas_must_name_known_tenants_and_tiers():
    with pytest.raises(ClearingError, match=r"^reserved_quotas\.nobody: unknown tenant"):
        Instance((Tier("a", 1),), (Tenant("x"),), (), reserved_quotas={"nobody": {"a": 1}})
    with pytest.raises(ClearingError, match=r"^reserved_quotas: 'equal' is not a setting"):
        Instance((Tier("a", 1),), (Tenant("x"),), (), reserved_quotas="equal")


def test_large_whole_gpu_welfare_holds_every_guarantee_without_the_milp():
    # 300 bids x 3 tiers is above the MILP size: tenants whose guarantee binds get their
    # guarantee bundles and the rest is cleared exactly around them.
    rng = np.random.default_rng(3)
    tiers = tuple(Tier(f"t{i}", 40) for i in range(3))
    inst = Instance(
        tiers=tiers,
        tenants=tuple(Tenant(f"n{i:03d}") for i in range(15)),
        bids=tuple(
            Bid(
                f"b{k:03d}",
                f"n{k % 15:03d}",
                int(rng.integers(1, 4)),
                # A third of the tenants bid low everywhere: only the guarantee serves them.
                {
                    t.name: float(rng.integers(1, 5) if k % 3 == 0 else rng.integers(20, 50))
                    for t in tiers
                },
            )
            for k in range(300)
        ),
    )
    r = clear(inst)
    assert r.diagnostics["guarantees_unmet"] == 0
    assert r.diagnostics["status"] == "optimal"
    used = defaultdict(int)
    for a in r.allocations:
        used[a.tier] += a.gpus
    assert all(used[t.name] <= t.capacity for t in tiers)
    weightless = clear(
        Instance(tiers, tuple(Tenant(t.name, weight=0) for t in inst.tenants), inst.bids)
    )
    assert weightless.diagnostics["guarantees_unmet"] == 0  # weight 0: nothing owed
    assert weightless.diagnostics["welfare"] > r.diagnostics["welfare"]  # the guarantee costs


def test_guarantee_chunks_when_the_last_tenant_starts_before_the_last_chunk_boundary():
    # A chunk boundary (every CHUNK_ARCS arcs) falls inside the last tenant's arcs. Every arc
    # must land in exactly one chunk of whole tenants (this once indexed past the last tenant).
    from market.clearing.mechanisms.guarantee import CHUNK_ARCS, _chunks

    tenant_of = np.r_[
        np.zeros(CHUNK_ARCS - 100, dtype=np.int64),
        np.repeat(np.arange(1, 4), 3),
        np.full(400, 4, dtype=np.int64),
    ]
    arcs = np.arange(tenant_of.size)
    parts = _chunks(arcs, tenant_of)
    assert np.array_equal(np.sort(np.concatenate(parts)), arcs)
    for part in parts:
        owners = set(tenant_of[part].tolist())
        for other in parts:
            if other is not part:
                assert owners.isdisjoint(tenant_of[other].tolist()), "tenants stay whole"
