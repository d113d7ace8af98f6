"""maxmin's stage 1 shortcut: tau* = 1 proven without solving stage 1 (maxmin._split_is_best),
by hand and against the stage-1 LP over random instances (hypothesis)."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from market.clearing import Bid, Instance, Tenant, Tier, clear, highs, maxmin


def solver_calls(monkeypatch) -> list:
    calls: list = []
    original = highs.solve

    def spy(**kwargs):
        calls.append(kwargs)
        return original(**kwargs)

    monkeypatch.setattr(highs, "solve", spy)
    return calls


def test_a_tenant_whose_split_covers_its_demand_pins_the_max_min_at_one(monkeypatch):
    # Four GPUs, two tenants: x wants one GPU (worth 5) and its split (two GPUs) covers
    # it, so nobody can do better than its split for everyone: tau* = 1. y, worth 3 a GPU,
    # has a split worth 6 and takes the other three GPUs in the Pareto fill (9, 1.5x).
    inst = Instance(
        tiers=(Tier("a", 4),),
        tenants=(Tenant("x"), Tenant("y")),
        bids=(Bid("bx", "x", 1, {"a": 5}), Bid("by", "y", 10, {"a": 3})),
    )
    calls = solver_calls(monkeypatch)
    r = clear(inst, mechanism="maxmin", divisible=True)
    assert {a.bid: a.gpus for a in r.allocations} == pytest.approx({"bx": 1.0, "by": 3.0})
    assert r.diagnostics["min_share_ratio"] == pytest.approx(1.0)
    assert len(calls) == 1  # the Pareto fill only


def test_without_such_a_tenant_stage_one_is_solved(monkeypatch):
    # Both want more than their split, and they value the tiers differently: trading lifts
    # both above their split (tau* > 1), which only the stage-1 LP finds.
    inst = Instance(
        tiers=(Tier("a", 2), Tier("b", 2)),
        tenants=(Tenant("x"), Tenant("y")),
        bids=(Bid("bx", "x", 4, {"a": 4, "b": 1}), Bid("by", "y", 4, {"a": 1, "b": 4})),
    )
    calls = solver_calls(monkeypatch)
    r = clear(inst, mechanism="maxmin", divisible=True)
    assert len(calls) == 2
    assert r.diagnostics["min_share_ratio"] == pytest.approx(8 / 5)


@st.composite
def instances(draw) -> Instance:
    tiers = tuple(
        Tier(f"t{i}", draw(st.integers(1, 10)), max_share=draw(st.sampled_from([1.0, 0.5])))
        for i in range(draw(st.integers(1, 3)))
    )
    n = draw(st.integers(1, 4))
    tenants = tuple(
        Tenant(f"n{i}", weight=draw(st.sampled_from([0.0, 1.0, 2.0]))) for i in range(n)
    )
    bids = []
    for b in range(draw(st.integers(1, 8))):
        q = draw(st.integers(1, 6))
        accept = draw(st.lists(st.sampled_from(tiers), min_size=1, unique=True))
        gang = q > 1 and draw(st.booleans()) and draw(st.booleans())
        bids.append(
            Bid(
                f"b{b}",
                f"n{draw(st.integers(0, n - 1))}",
                q,
                {t.name: draw(st.integers(0, 12)) for t in accept},
                min_quantity=q if gang else 0,
            )
        )
    return Instance(tiers=tiers, tenants=tenants, bids=tuple(bids))


# monkeypatch.context() undoes each patch within the example, so sharing the fixture is safe.
@settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(instances())
def test_the_shortcut_gives_the_stage_one_optimum(monkeypatch, inst):
    """Divisible clears with and without the shortcut agree: the same worst share ratio and
    the same total value (the Pareto fill's optimum), whenever the shortcut applies."""
    fired: list[bool] = []
    original = maxmin._split_is_best

    def watch(*args, **kwargs):
        fired.append(original(*args, **kwargs))
        return fired[-1]

    with monkeypatch.context() as m:
        m.setattr(maxmin, "_split_is_best", watch)
        fast = clear(inst, mechanism="maxmin", divisible=True).diagnostics
    with monkeypatch.context() as m:
        m.setattr(maxmin, "_split_is_best", lambda *args, **kwargs: False)
        exact = clear(inst, mechanism="maxmin", divisible=True).diagnostics
    if any(fired):
        assert fast["min_share_ratio"] == pytest.approx(1.0, abs=1e-6)
    assert fast["min_share_ratio"] == pytest.approx(exact["min_share_ratio"], abs=1e-6)
    assert fast["welfare"] == pytest.approx(exact["welfare"], rel=1e-6)
