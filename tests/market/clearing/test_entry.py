"""One way into the mechanisms: ``clear`` is ``clear_arrays`` of the instance's arrays."""

from __future__ import annotations

import pytest

import market.clearing as clearing
from market.clearing import ClearingError, Instance, clear, clear_arrays
from market.clearing.instance.inputs import instance_arrays
from tests.market.clearing.test_partition import _instance

TIMINGS = {"build_seconds", "solve_seconds", "rounding_seconds", "total_seconds"}


def without_timings(result) -> dict:
    data = result.to_json()
    data["diagnostics"] = {k: v for k, v in data["diagnostics"].items() if k not in TIMINGS}
    return data


@pytest.mark.parametrize("mechanism", ["welfare", "maxmin", "fisher"])
@pytest.mark.parametrize("divisible", [False, True])
def test_clear_and_clear_arrays_give_the_same_json(mechanism, divisible):
    inst = _instance(tenants=10, bids=80, gang_share=0.1)
    quotas = {"n001": {"t0": 3}, "n004": {"t1": 2, "t2": 1}}
    for setting in ({}, quotas, "by_weight"):
        with_quotas = Instance(inst.tiers, inst.tenants, inst.bids, reserved_quotas=setting)
        whole = clear(with_quotas, mechanism=mechanism, divisible=divisible)
        again = clear_arrays(
            instance_arrays(with_quotas),
            mechanism=mechanism,
            divisible=divisible,
            reserved_quotas=setting,
        )
        assert without_timings(whole) == without_timings(again), setting
        d = whole.diagnostics
        assert d["total_seconds"] == pytest.approx(
            d["build_seconds"] + d["solve_seconds"] + d["rounding_seconds"]
        )


def test_clear_goes_through_clear_arrays(monkeypatch):
    calls = []
    original = clearing.clear_arrays

    def spy(arrays, **kwargs):
        calls.append(kwargs)
        return original(arrays, **kwargs)

    monkeypatch.setattr(clearing, "clear_arrays", spy)
    inst = _instance(tenants=4, bids=20)
    clear(inst, mechanism="maxmin", params={"time_limit": 5})
    assert calls == [
        {
            "mechanism": "maxmin",
            "params": {"time_limit": 5},
            "divisible": False,
            "reserved_quotas": {},
        }
    ]


def test_both_refuse_what_is_not_theirs():
    with pytest.raises(ClearingError, match="instance: must be"):
        clear(instance_arrays(_instance(tenants=2, bids=4)))
    with pytest.raises(ClearingError, match="arrays: must be"):
        clear_arrays(_instance(tenants=2, bids=4))
