"""Partitioned clearing: every hard constraint of the exact clear still holds after the parts
are combined, a failed part fails the whole clear, the loss on a mid-size round is small, and a
part travels to a worker as checked columns."""

from __future__ import annotations

import json
from collections import Counter, defaultdict

import numpy as np
import pytest

from market.clearing import (
    Bid,
    ClearingError,
    Instance,
    Result,
    Tenant,
    Tier,
    clear,
    clear_arrays,
)
from market.clearing.instance.columns import arrays_from_json, arrays_to_json
from market.clearing.instance.inputs import Arrays, instance_arrays
from market.clearing.parts.partition import clear_part, clear_partitioned, combine, split


def _instance(
    *, tenants: int, bids: int, seed: int = 1, gang_share: float = 0.2, weighted: bool = True
) -> Instance:
    rng = np.random.default_rng(seed)
    quantity = rng.choice([1, 2, 4, 8], size=bids, p=[0.55, 0.2, 0.15, 0.1])
    tiers = tuple(
        Tier(
            f"t{t}",
            capacity=int(0.6 * quantity.sum() / 3),
            reserve_price=2,
            max_share=0.3 if t == 2 else 1.0,
        )
        for t in range(3)
    )
    bid_list = []
    for b in range(bids):
        accept = sorted(rng.choice(3, size=rng.integers(1, 3), replace=False))
        level = float(rng.lognormal(2.0, 0.5))
        bid_list.append(
            Bid(
                id=f"b{b:05d}",
                tenant=f"n{rng.integers(0, tenants):03d}",
                quantity=int(quantity[b]),
                limits={f"t{t}": max(1, round(level * (1 + 0.3 * t))) for t in accept},
                min_quantity=int(quantity[b]) if rng.random() < gang_share else 0,
            )
        )
    return Instance(
        tiers=tiers,
        tenants=tuple(
            Tenant(
                f"n{i:03d}",
                weight=(1.0 + i % 3) if weighted else 0.0,
                budget=float(rng.integers(20, 400)),
            )
            for i in range(tenants)
        ),
        bids=tuple(bid_list),
    )


def _clear(policy: str):
    return lambda sub: clear_part(sub, mechanism=policy)


def _columns(arrays: Arrays) -> dict:
    """Arrays in a form that compares with ==."""
    return arrays_to_json(arrays, mechanism="welfare", params=None)


def _tenant_of_bids(sub: Arrays) -> dict[str, str]:
    return {
        bid: sub.tenant_names[t]
        for bid, t in zip(sub.bid_ids, sub.bid_tenant.tolist(), strict=True)
    }


def test_partition_keeps_each_tenant_whole_balances_bids_and_splits_every_gpu():
    inst = _instance(tenants=40, bids=600)
    arrays = instance_arrays(inst)
    subs = [p.arrays for p in split(arrays, 4, seed=3)]
    assert len(subs) == 4
    home = {}
    for p, sub in enumerate(subs):
        for tenant in _tenant_of_bids(sub).values():
            assert home.setdefault(tenant, p) == p, "a tenant's bids stay in one part"
    assert sorted(b for s in subs for b in s.bid_ids) == sorted(b.id for b in inst.bids)
    sizes = [s.n_bids for s in subs]
    assert max(sizes) - min(sizes) <= max(Counter(b.tenant for b in inst.bids).values())
    for t in range(arrays.n_tiers):
        assert sum(s.capacity[t] for s in subs) == arrays.capacity[t]
    # Every arc of the whole is in exactly one part, with its price.
    arcs = {
        (s.bid_ids[b], s.tier_names[t], p)
        for s in subs
        for b, t, p in zip(
            s.arc_bid.tolist(), s.arc_tier.tolist(), s.arc_price.tolist(), strict=True
        )
    }
    assert arcs == {
        (arrays.bid_ids[b], arrays.tier_names[t], p)
        for b, t, p in zip(
            arrays.arc_bid.tolist(),
            arrays.arc_tier.tolist(),
            arrays.arc_price.tolist(),
            strict=True,
        )
    }
    # A part is sorted as instance_arrays sorts: it is the arrays of its own instance.
    for sub in subs:
        names = set(sub.tenant_names)
        own = Instance(
            tiers=tuple(
                Tier(t.name, int(c), t.reserve_price, t.max_share)
                for t, c in zip(inst.tiers, sub.capacity.tolist(), strict=True)
            ),
            tenants=tuple(t for t in inst.tenants if t.name in names),
            bids=tuple(b for b in inst.bids if b.tenant in names),
        )
        assert _columns(instance_arrays(own)) == _columns(sub)
    assert [_columns(p.arrays) for p in split(arrays, 4, seed=3)] == [_columns(s) for s in subs]
    assert [_columns(p.arrays) for p in split(arrays, 4, seed=4)] != [_columns(s) for s in subs]


def test_clear_arrays_gives_what_clear_gives():
    inst = _instance(tenants=12, bids=120)
    quotas = {"n001": {"t0": 3}, "n004": {"t1": 2, "t2": 1}}
    for policy in ("welfare", "maxmin", "fisher"):
        for setting in ({}, quotas, "by_weight"):
            with_quotas = Instance(inst.tiers, inst.tenants, inst.bids, reserved_quotas=setting)
            exact = clear(with_quotas, mechanism=policy)
            again = clear_arrays(
                instance_arrays(with_quotas), mechanism=policy, reserved_quotas=setting
            )
            assert again.allocations == exact.allocations, (policy, setting)
            assert again.charges == exact.charges and again.prices == exact.prices


def test_clear_arrays_refuses_a_fraction_of_a_gpu_as_clear_does():
    inst = Instance(
        tiers=(Tier("a", 4),),
        tenants=(Tenant("x"),),
        bids=(Bid("b2", "x", 1.5, {"a": 1}), Bid("b1", "x", 2, {"a": 1}, min_quantity=1.5)),
    )
    with pytest.raises(ClearingError) as by_objects:
        clear(inst)
    with pytest.raises(ClearingError) as by_arrays:
        clear_arrays(instance_arrays(inst))
    assert str(by_arrays.value) == str(by_objects.value)
    assert "'b1'.min_quantity" in str(by_arrays.value)


@pytest.mark.parametrize("policy", ["welfare", "maxmin", "fisher"])
def test_a_partitioned_clear_respects_every_hard_constraint(policy):
    inst = _instance(tenants=24, bids=240)
    parts = split(instance_arrays(inst), 3, seed=0)
    subs = [p.arrays for p in parts]
    results = [clear_part(s, mechanism=policy) for s in subs]
    r = combine(instance_arrays(inst), parts, results)
    tiers = {t.name: t for t in inst.tiers}
    bids = {b.id: b for b in inst.bids}
    budget = {t.name: t.budget for t in inst.tenants}
    part_of = {bid: p for p, s in enumerate(subs) for bid in s.bid_ids}
    per_tier, per_bid, per_group = defaultdict(int), defaultdict(int), defaultdict(int)
    tiers_of = defaultdict(set)
    owed = defaultdict(float)
    for a in r.allocations:
        bid = bids[a.bid]
        assert isinstance(a.gpus, int) and a.gpus > 0
        assert bid.limits[a.tier] >= tiers[a.tier].reserve_price
        per_tier[a.tier] += a.gpus
        per_bid[a.bid] += a.gpus
        per_group[bid.tenant, a.tier] += a.gpus
        tiers_of[a.bid].add(a.tier)
        # Each winner pays at most its own part's price, and never above its limit.
        part_price = r.diagnostics["part_prices"][a.tier][part_of[a.bid]]
        owed[a.bid] += a.gpus * min(part_price, bid.limits[a.tier])
    for name, used in per_tier.items():
        assert used <= tiers[name].capacity, "capacity"
    for (_tenant, tier), used in per_group.items():
        assert used <= tiers[tier].max_share * tiers[tier].capacity + 1e-9, "share cap"
    for bid_id, got in per_bid.items():
        bid = bids[bid_id]
        assert got <= bid.quantity
        if bid.min_quantity:
            assert got == bid.quantity and len(tiers_of[bid_id]) == 1, "gangs whole, one tier"
    for bid_id, charge in r.charges.items():
        assert charge <= owed[bid_id] + 1e-6
    assert r.diagnostics["guarantees_unmet"] == 0, "every part keeps its guarantees"
    if policy == "fisher":
        for tenant, spent in r.spend.items():
            assert spent <= budget[tenant] + 1e-6, "budgets"
    # The combined figures add up from the parts.
    assert r.diagnostics["parts"] == 3
    assert r.diagnostics["welfare"] == pytest.approx(
        sum(x["diagnostics"]["welfare"] for x in results)
    )
    assert sum(r.spend.values()) == pytest.approx(sum(sum(x["spend"]) for x in results))
    # Each part's result, as the combined result shows it.
    for sub in subs:
        own = clear_arrays(sub, mechanism=policy)
        assert set(own.allocations) <= set(r.allocations)
        assert all(r.charges[bid] == charge for bid, charge in own.charges.items())
        assert all(r.spend[tenant] == spent for tenant, spent in own.spend.items())
    assert len(r.allocations) == sum(len(x["allocations"]["bid"]) for x in results)
    assert list(r.allocations) == sorted(
        r.allocations, key=lambda a: (a.bid, [t.name for t in inst.tiers].index(a.tier))
    )


def test_a_results_awards_are_its_allocations_as_columns_exact_or_combined():
    # The platform reads the awards (a million-bid round: no object per award); everything
    # else reads the allocations. Both must say the same, in the instance's own order.
    arrays = instance_arrays(_instance(tenants=12, bids=120))
    parts = split(arrays, 3, seed=0)
    exact = clear_arrays(arrays, mechanism="welfare")
    combined = combine(arrays, parts, [clear_part(p.arrays, mechanism="welfare") for p in parts])
    divisible = clear_arrays(arrays, mechanism="welfare", divisible=True)
    for r in (exact, combined, divisible):
        w = r.awards
        assert (w.bid_ids, w.tier_names) == (arrays.bid_ids, arrays.tier_names)
        columns = list(
            zip(
                [arrays.bid_ids[b] for b in w.bid.tolist()],
                [arrays.tier_names[t] for t in w.tier.tolist()],
                w.gpus.tolist(),
                strict=True,
            )
        )
        assert columns == [tuple(a) for a in r.allocations] and columns
        assert w.gpus.dtype == (float if r is divisible else np.int64)
        again = Result.from_json(json.loads(json.dumps(r.to_json())))
        assert again.allocations == r.allocations and again.awards == r.awards
        assert [type(a.gpus) for a in again.allocations] == [type(a.gpus) for a in r.allocations]


def test_a_failed_part_fails_the_whole_clear():
    inst = _instance(tenants=12, bids=60)
    calls = []

    def flaky(sub: Arrays):
        calls.append(sub)
        if len(calls) == 2:
            raise ClearingError("part 2: the solver ended without a proven result")
        return clear_part(sub, mechanism="welfare")

    with pytest.raises(ClearingError, match="part 2"):
        clear_partitioned(instance_arrays(inst), parts=3, clear_part=flaky)


def test_combine_refuses_a_missing_part():
    inst = _instance(tenants=12, bids=60)
    parts = split(instance_arrays(inst), 3)
    results = [clear_part(p.arrays, mechanism="welfare") for p in parts]
    with pytest.raises(ClearingError, match="2 results for 3 parts"):
        combine(instance_arrays(inst), parts, results[:2])
    whole = instance_arrays(inst)
    for path, value in (
        (("allocations", "tier"), None),  # missing
        (("allocations", "tier"), [-1]),  # numpy would wrap it
        (("allocations", "bid"), [10**6]),
        (("allocations", "gpus"), [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13]),
        (("charges", "bid"), [-1]),
        (("spend",), [0.0]),
    ):
        broken = [
            dict(r, allocations=dict(r["allocations"]), charges=dict(r["charges"])) for r in results
        ]
        if len(path) == 1:
            broken[1][path[0]] = value
        elif value is None:
            del broken[1][path[0]][path[1]]
        else:
            broken[1][path[0]][path[1]] = value
        with pytest.raises(ClearingError, match="not as a part writes it"):
            combine(whole, parts, broken)


def test_the_welfare_lost_by_partitioning_a_mid_size_round_is_small():
    # Without guarantees a partitioned clear is the exact problem with trades across parts
    # taken away: it can only lose, and on a round this size it loses little.
    inst = _instance(tenants=60, bids=3000, gang_share=0.0, weighted=False)
    exact = clear(inst, mechanism="welfare").diagnostics["welfare"]
    diagnostics = clear_partitioned(
        instance_arrays(inst), parts=4, clear_part=_clear("welfare")
    ).diagnostics
    split = diagnostics["welfare"]
    assert split <= exact + 1e-6
    assert split >= 0.97 * exact
    # Where the time went: the split, the parts and the combination, within the whole.
    steps = [diagnostics[k] for k in ("split_seconds", "parts_elapsed_seconds", "combine_seconds")]
    assert min(steps) > 0 and sum(steps) <= diagnostics["total_seconds"]
    assert diagnostics["parts_elapsed_seconds"] >= sum(diagnostics["part_seconds"])


def _through(serializer: str, payload):
    """``payload`` encoded and decoded as a Celery message body is, by kombu."""
    from kombu.serialization import dumps, loads

    content_type, encoding, body = dumps(payload, serializer=serializer)
    return loads(body, content_type, encoding, accept={content_type})


@pytest.mark.parametrize(
    ("serializer", "packed"), [("json", False), ("msgpack", False), ("msgpack", True)]
)
def test_a_part_goes_to_a_worker_and_back_unchanged(serializer, packed):
    # The part and its result travel as MessagePack on the platform (config/settings.py),
    # its numbers packed.
    inst = _instance(tenants=6, bids=30)
    sub = split(instance_arrays(inst), 2)[1].arrays
    quotas = {"n001": {"t0": 2}}
    wire = _through(
        serializer,
        arrays_to_json(
            sub,
            mechanism="maxmin",
            params={"time_limit": 5},
            reserved_quotas=quotas,
            packed=packed,
        ),
    )
    assert isinstance(wire["arcs"]["price"], bytes) == packed
    back, mechanism, params, got_quotas = arrays_from_json(wire)
    assert (_columns(back), mechanism, params, got_quotas) == (
        _columns(sub),
        "maxmin",
        {"time_limit": 5},
        quotas,
    )
    result = clear_part(back, mechanism=mechanism, params=params, reserved_quotas=got_quotas)
    assert _through(serializer, result) == result
    assert _timeless(result) == _timeless(
        clear_part(sub, mechanism="maxmin", reserved_quotas=quotas)
    )


def _timeless(part_result: dict) -> dict:
    diagnostics = part_result["diagnostics"]
    return part_result | {
        "diagnostics": {k: v for k, v in diagnostics.items() if not k.endswith("_seconds")}
    }


def _wire(packed: bool = False) -> dict:
    inst = Instance(
        tiers=(Tier("a", 4, reserve_price=2), Tier("b", 2)),
        tenants=(Tenant("x", budget=10.0), Tenant("y")),
        bids=(Bid("b1", "x", 2, {"a": 3, "b": 1}), Bid("b2", "y", 1, {"a": 5})),
    )
    return arrays_to_json(instance_arrays(inst), mechanism="welfare", params=None, packed=packed)


def _set(path: str, value):
    def edit(data: dict) -> None:
        *parents, last = path.split(".")
        node = data
        for key in parents:
            node = node[key]
        if isinstance(node, list):
            node[int(last)] = value
        else:
            node[last] = value

    return edit


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (_set("format", "v0"), "format"),
        (_set("mechanism", 3), "arrays.mechanism"),
        (_set("reserved_quotas", "by_luck"), "arrays.reserved_quotas"),
        (_set("tiers.capacity.0", 2.5), "tiers.capacity: must be whole"),
        (_set("tiers.max_share.1", 0), "tiers.max_share"),
        (_set("tenants.name.1", "a"), "tenants.name: must be in order"),
        (_set("tenants.budget.0", -1), "tenants.budget"),
        (_set("bids.id.0", "b3"), "bids.id: must be in order"),
        (_set("bids.tenant.0", 2), "bids.tenant: an index out of range"),
        (_set("bids.tenant.0", 2**70), "bids.tenant: an index out of range"),
        (_set("bids.tenant.0", True), "bids.tenant: must be whole-number indices"),
        (_set("bids.quantity.1", 0.5), "bids.quantity: must be >= 1"),
        (_set("bids.quantity.1", float("nan")), "bids.quantity: must be finite"),
        (_set("bids.quantity.1", 1e300), "bids.quantity: must be finite"),
        (_set("bids.min_quantity.0", 3), "min_quantity: must not be more than quantity"),
        (_set("bids.mixed_tiers.0", 1), "mixed_tiers: must be true or false"),
        (_set("arcs.tier.1", 0), "arcs: must be in (bid, tier) order"),
        (_set("arcs.price.0", 1), "arcs.price: an arc below its tier's reserve"),
        (_set("arcs.price.0", "3"), "arcs.price: must be numbers"),
        (_set("arcs.bid", [0, 1]), "arrays.arcs: its lists must be of one length"),
        (_set("bids", [1, 2]), "arrays.bids: must be an object of lists"),
    ],
)
def test_a_part_that_is_not_as_written_is_refused_naming_the_field(edit, message):
    data = _wire()
    arrays_from_json(data)  # as written, it is taken
    edit(data)
    with pytest.raises(ClearingError, match=message.replace("(", r"\(").replace(")", r"\)")):
        arrays_from_json(data)


def _pack(path: str, values: list, dtype: str):
    return _set(path, np.array(values, dtype=dtype).tobytes())


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (_set("bids.quantity", b"\x00" * 12), "bids.quantity: not whole 8-byte numbers"),
        (_pack("bids.quantity", [2, float("nan")], "<f8"), "bids.quantity: must be finite"),
        (_pack("bids.quantity", [2, 0.5], "<f8"), "bids.quantity: must be >= 1"),
        (_pack("bids.tenant", [0, 2], "<i4"), "bids.tenant: an index out of range"),
        (_pack("bids.tenant", [0, -1], "<i4"), "bids.tenant: an index out of range"),
        (_pack("bids.mixed_tiers", [0, 2], "u1"), "mixed_tiers: must be true or false"),
        (_pack("arcs.bid", [0, 1], "<i4"), "arrays.arcs: its lists must be of one length"),
        (_pack("arcs.tier", [0, 0, 0], "<i4"), "arcs: must be in (bid, tier) order"),
        (_pack("tenants.budget", [-1, float("nan")], "<f8"), "tenants.budget"),
        (_pack("tenants.budget", [float("inf"), 1], "<f8"), "tenants.budget"),
        (_set("arcs.price", "abc"), "arcs.price: must be a list"),
    ],
)
def test_a_packed_part_that_is_not_as_written_is_refused_naming_the_field(edit, message):
    data = _wire(packed=True)
    arrays, *_ = arrays_from_json(data)  # as written, it is taken
    assert np.isnan(arrays.budget).tolist() == [False, True]
    assert arrays.arc_bid.dtype == np.int64 and arrays.arc_bid.flags.writeable
    edit(data)
    with pytest.raises(ClearingError, match=message.replace("(", r"\(").replace(")", r"\)")):
        arrays_from_json(data)


def test_a_part_is_cleared_with_the_numerical_libraries_on_one_thread(monkeypatch):
    """Parts run side by side, a process each; BLAS's own threads would contend with the
    other parts' processes (a million fisher bids took 2.4 times as long with them)."""
    from threadpoolctl import threadpool_info

    import market.clearing as clearing

    seen = []
    original = clearing.clear_arrays

    def spy(*args, **kwargs):
        seen.append([pool["num_threads"] for pool in threadpool_info()])
        return original(*args, **kwargs)

    monkeypatch.setattr(clearing, "clear_arrays", spy)
    inst = _instance(tenants=24, bids=240)
    part = split(instance_arrays(inst), 2, seed=0)[0]
    clear_part(part.arrays, mechanism="fisher")
    assert seen and seen[0] and all(n == 1 for n in seen[0])
