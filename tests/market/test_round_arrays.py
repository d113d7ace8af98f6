"""The solver's arrays are built from a round's rows without an object per bid: they must be
exactly the arrays of the instance those rows describe, built the long way (a Tier, Tenant
and Bid per row, then ``instance_arrays``), so a round clears as it did."""

from __future__ import annotations

import numpy as np
import pytest

from market import clearing
from market.clearing.instance.columns import arrays_to_json
from market.clearing.instance.inputs import instance_arrays
from market.models import PolicyVersion
from market.services.round_clearing import RoundData, _arrays


def _data(rng: np.random.Generator, *, bids: int, tenants: int) -> RoundData:
    tiers = ["h100", "a100", "l4"]
    limits = rng.integers(0, 6000, size=(bids, len(tiers)))
    limits[rng.random(limits.shape) < 0.4] = 0  # a tier the bid does not accept
    quantity = rng.choice([1, 2, 4, 8], size=bids)
    return RoundData(
        bid_ids=np.sort(rng.choice(np.arange(1, 10 * bids), size=bids, replace=False)),
        # Tenant ids 1..tenants: "tenant-10" sorts before "tenant-9" by name.
        tenant_ids=rng.integers(1, tenants + 1, size=bids),
        quantity=quantity,
        min_quantity=np.where(rng.random(bids) < 0.2, quantity, 0),
        escrow=rng.integers(0, 10**7, size=bids),
        limits=limits,
        tier_slugs=tiers,
        capacity=np.array([16, 0, 40]),
        tenant_weights={1: 3, 4: 0, 11: 2},
        seconds=5400,
    )


def _the_long_way(data: RoundData, policy: PolicyVersion, reserves: np.ndarray):
    hours = data.seconds / 3600
    tenants = sorted(set(data.tenant_ids.tolist()))
    escrow = {t: 0.0 for t in tenants}
    for tenant, held in zip(data.tenant_ids.tolist(), data.escrow.tolist(), strict=True):
        escrow[tenant] += held
    return clearing.Instance(
        tiers=tuple(
            clearing.Tier(
                slug,
                capacity=int(data.capacity[i]),
                reserve_price=int(reserves[i]),
                max_share=policy.max_share_for(slug) / 100,
            )
            for i, slug in enumerate(data.tier_slugs)
        ),
        tenants=tuple(
            clearing.Tenant(
                f"tenant-{t}",
                weight=float(data.tenant_weights.get(t, 1)),
                budget=escrow[t] / hours,
            )
            for t in tenants
        ),
        bids=tuple(
            clearing.Bid(
                id=f"{pk:012d}",
                tenant=f"tenant-{tenant}",
                quantity=int(q),
                min_quantity=int(m),
                limits={
                    slug: int(price)
                    for slug, price in zip(data.tier_slugs, row.tolist(), strict=True)
                    if price > 0
                },
            )
            for pk, tenant, q, m, row in zip(
                data.bid_ids.tolist(),
                data.tenant_ids.tolist(),
                data.quantity.tolist(),
                data.min_quantity.tolist(),
                data.limits,
                strict=True,
            )
        ),
    )


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_a_rounds_arrays_are_those_of_its_instance(seed):
    rng = np.random.default_rng(seed)
    data = _data(rng, bids=300, tenants=12)
    policy = PolicyVersion(
        reserve_prices={"h100": 2500, "l4": 400}, max_share_pct={"h100": 50, "a100": 100}
    )
    reserves = np.array([policy.reserve_for(s) for s in data.tier_slugs])

    fast = _arrays(data=data, policy=policy, reserves=reserves)
    slow = instance_arrays(_the_long_way(data, policy, reserves))

    assert arrays_to_json(fast, mechanism="welfare", params=None) == arrays_to_json(
        slow, mechanism="welfare", params=None
    )
    assert fast.tenant_names[:3] == ("tenant-1", "tenant-10", "tenant-11")
    # Limits below a tier's reserve were in the rows and are not arcs.
    assert ((data.limits > 0) & (data.limits < reserves)).any()
    assert (fast.arc_price >= reserves[fast.arc_tier]).all()
    for mechanism in ("welfare", "maxmin", "fisher"):
        assert (
            clearing.clear_arrays(fast, mechanism=mechanism).allocations
            == clearing.clear(
                _the_long_way(data, policy, reserves), mechanism=mechanism
            ).allocations
        )


def test_a_budget_beyond_the_solvers_range_is_refused_by_name():
    rng = np.random.default_rng(3)
    data = _data(rng, bids=5, tenants=2)
    data.escrow[:] = 10**16
    policy = PolicyVersion(reserve_prices={}, max_share_pct={})
    with pytest.raises(clearing.ClearingError, match="above the solver's"):
        _arrays(data=data, policy=policy, reserves=np.zeros(3, dtype=np.int64))


def test_a_round_is_cleared_in_parts_from_its_mechanisms_threshold(settings, monkeypatch):
    from market.services import round_clearing

    settings.GPUMARKET_PARTITION_ABOVE_BIDS = 10**9
    settings.GPUMARKET_PARTITION_FAIR_ABOVE_BIDS = 100
    parted = []

    def in_parts(arrays, *, mechanism, params, reserved_quotas, parts):
        parted.append((mechanism, parts))
        return clearing.clear_arrays(
            arrays, mechanism=mechanism, params=params, reserved_quotas=reserved_quotas
        )

    monkeypatch.setattr(round_clearing, "clear_in_parts", in_parts)
    data = _data(np.random.default_rng(3), bids=300, tenants=12)
    for mechanism in ("welfare", "maxmin", "fisher"):
        policy = PolicyVersion(mechanism=mechanism, reserve_prices={}, max_share_pct={})
        round_clearing.solve(data=data, policy=policy)
    assert parted == [("maxmin", settings.GPUMARKET_PARTITION_PARTS)] + [
        ("fisher", settings.GPUMARKET_PARTITION_PARTS)
    ]


def test_awards_out_of_the_rounds_order_are_refused_not_settled():
    # The platform takes an award's position as the row of the round's bid: a result in
    # another bid order (a part's own, say) would put GPUs on the wrong bids.
    from dataclasses import replace

    from market.services.round_clearing import _outcome

    rng = np.random.default_rng(4)
    data = _data(rng, bids=40, tenants=5)
    policy = PolicyVersion(reserve_prices={}, max_share_pct={})
    reserves = np.zeros(3, dtype=np.int64)
    arrays = _arrays(data=data, policy=policy, reserves=reserves)
    result = clearing.clear_arrays(arrays, mechanism="welfare")
    fine = _outcome(result=result, data=data, arrays=arrays, reserves=reserves, mechanism="w")
    assert fine.gpus.sum() == sum(a.gpus for a in result.allocations) > 0
    shifted = replace(result.awards, bid_ids=arrays.bid_ids[1:] + arrays.bid_ids[:1])
    with pytest.raises(clearing.ClearingError, match="not in the round's bid and tier order"):
        _outcome(
            result=replace(result, awards=shifted),
            data=data,
            arrays=arrays,
            reserves=reserves,
            mechanism="w",
        )
