"""Small instances checked by hand."""

from __future__ import annotations

import pytest

from market.clearing import MECHANISMS, Bid, ClearingError, Instance, Tenant, Tier, clear


def two_bidders(capacity: int = 3, reserve: float = 0) -> Instance:
    return Instance(
        tiers=(Tier("a100", capacity, reserve_price=reserve),),
        tenants=(Tenant("x", weight=0), Tenant("y", weight=0)),
        bids=(Bid("b1", "x", 2, {"a100": 10}), Bid("b2", "y", 2, {"a100": 7})),
    )


def gpus(result, bid: str, tier: str | None = None) -> float:
    return sum(a.gpus for a in result.allocations if a.bid == bid and tier in (None, a.tier))


def test_capacity_between_quantities_prices_at_the_losing_limit():
    r = clear(two_bidders(capacity=3))
    assert (gpus(r, "b1"), gpus(r, "b2")) == (2, 1)
    assert r.prices == {"a100": 7.0}
    assert r.charges == {"b1": 14.0, "b2": 7.0}
    assert r.spend == {"x": 14.0, "y": 7.0}
    assert r.diagnostics["welfare"] == 27.0
    assert r.diagnostics["utilisation"] == {"a100": 1.0}


def test_spare_capacity_prices_at_the_reserve():
    r = clear(two_bidders(capacity=10, reserve=2))
    assert (gpus(r, "b1"), gpus(r, "b2")) == (2, 2)
    assert r.prices == {"a100": 2.0}
    assert r.charges == {"b1": 4.0, "b2": 4.0}


@pytest.mark.parametrize("policy", sorted(MECHANISMS))
def test_reserve_above_every_limit_sells_nothing(policy):
    r = clear(two_bidders(capacity=3, reserve=11), mechanism=policy)
    assert r.allocations == ()
    assert r.charges == {}
    assert r.prices == {"a100": 11.0}


@pytest.mark.parametrize("policy", sorted(MECHANISMS))
def test_gang_bid_that_cannot_fit_gets_nothing(policy):
    inst = Instance(
        tiers=(Tier("a100", 3),),
        tenants=(Tenant("x", weight=0), Tenant("y", weight=0)),
        bids=(
            Bid("gang", "x", 4, {"a100": 100}, min_quantity=4),
            Bid("small", "y", 2, {"a100": 5}),
        ),
    )
    r = clear(inst, mechanism=policy)
    assert gpus(r, "gang") == 0
    assert gpus(r, "small") == 2


@pytest.mark.parametrize("policy", sorted(MECHANISMS))
def test_a_gang_turned_down_gets_nothing_not_the_solvers_dust(policy):
    # Found by the property tests: one tenant capped at 2.5 of 5 GPUs, divisible. Its best is
    # b3's 2 GPUs and half of b2 (18.5), not the gang's 2 and half of b3 (18). The mixed-integer
    # solver left the gang's switch a few 1e-7 above 0, within its integrality tolerance, and
    # the gang kept 5e-7 GPUs: below its minimum, which a gang never is.
    inst = Instance(
        tiers=(Tier("t0", 5, reserve_price=0, max_share=0.5),),
        tenants=(Tenant("n0", weight=0),),
        bids=(
            Bid("b0", "n0", 3, {"t0": 7}, min_quantity=2),
            Bid("b1", "n0", 1, {"t0": 0}),
            Bid("b2", "n0", 3, {"t0": 5}),
            Bid("b3", "n0", 2, {"t0": 8}),
        ),
    )
    r = clear(inst, mechanism=policy, divisible=True)
    got = gpus(r, "b0")
    assert got == 0 or got >= 2 - 1e-6
    if policy == "welfare":
        assert got == 0 and gpus(r, "b3") == pytest.approx(2) and gpus(r, "b2") == 0.5


def test_gang_bid_that_fits_wins_whole():
    inst = Instance(
        tiers=(Tier("a100", 4),),
        tenants=(Tenant("x", weight=0), Tenant("y", weight=0)),
        bids=(
            Bid("gang", "x", 4, {"a100": 9}, min_quantity=4),
            Bid("a", "y", 3, {"a100": 10}),
        ),
    )
    # 4 x 9 = 36 beats 3 x 10 = 30 with one GPU idle.
    r = clear(inst)
    assert (gpus(r, "gang"), gpus(r, "a")) == (4, 0)
    assert r.diagnostics["status"] == "optimal"


@pytest.mark.parametrize("policy", sorted(MECHANISMS))
def test_entitled_tenant_gets_its_guaranteed_share(policy):
    inst = Instance(
        tiers=(Tier("a100", 10, reserve_price=1),),
        tenants=(Tenant("rich", weight=1), Tenant("small", weight=1)),
        bids=(Bid("r", "rich", 10, {"a100": 100}), Bid("s", "small", 6, {"a100": 3})),
    )
    r = clear(inst, mechanism=policy)
    assert gpus(r, "s") >= 5  # half of 10, the small lab's entitlement
    assert gpus(r, "s") + gpus(r, "r") == 10
    assert r.charges["s"] <= 3 * gpus(r, "s")


def test_guarantee_is_demand_when_demand_is_less():
    inst = Instance(
        tiers=(Tier("a100", 10),),
        tenants=(Tenant("rich", weight=1), Tenant("small", weight=1)),
        bids=(Bid("r", "rich", 10, {"a100": 100}), Bid("s", "small", 2, {"a100": 3})),
    )
    r = clear(inst)
    assert (gpus(r, "r"), gpus(r, "s")) == (8, 2)


def test_welfare_guarantee_binds_and_the_price_is_what_the_rich_still_bid():
    inst = Instance(
        tiers=(Tier("a100", 10, reserve_price=1),),
        tenants=(Tenant("rich", weight=1), Tenant("small", weight=1)),
        bids=(Bid("r", "rich", 10, {"a100": 100}), Bid("s", "small", 6, {"a100": 3})),
    )
    r = clear(inst)
    assert (gpus(r, "r"), gpus(r, "s")) == (5, 5)
    # The small lab's guarantee (half the tier, worth 15 to it) binds; the rich lab still
    # wants more at 100, so that is the price, and the small lab pays its own limit.
    assert r.prices == {"a100": 100.0}
    assert r.charges == {"r": 500.0, "s": 15.0}


@pytest.mark.parametrize("policy", sorted(MECHANISMS))
def test_share_cap_is_respected(policy):
    inst = Instance(
        tiers=(Tier("h100", 10, max_share=0.3),),
        tenants=(Tenant("x", weight=0), Tenant("y", weight=0)),
        bids=(
            Bid("x1", "x", 5, {"h100": 50}),
            Bid("x2", "x", 5, {"h100": 40}),
            Bid("y1", "y", 8, {"h100": 10}),
        ),
    )
    r = clear(inst, mechanism=policy)
    assert gpus(r, "x1") + gpus(r, "x2") <= 3
    assert gpus(r, "y1") <= 3
    if policy == "welfare":
        assert gpus(r, "x1") == 3  # the cap binds on the higher limit first
        # x is left wanting at 40-50 only because of its cap: the price is y's bid-off level.
        assert r.prices == {"h100": 0.0}


def test_multi_tier_bidders_sort_themselves_by_price():
    inst = Instance(
        tiers=(Tier("h100", 2, reserve_price=5), Tier("a100", 2, reserve_price=2)),
        tenants=(Tenant("x", weight=0), Tenant("y", weight=0), Tenant("z", weight=0)),
        bids=(
            Bid("fast", "x", 2, {"h100": 30, "a100": 12}),
            Bid("either", "y", 2, {"h100": 20, "a100": 15}),
            Bid("cheap", "z", 2, {"a100": 6}),
        ),
    )
    r = clear(inst)
    assert gpus(r, "fast", "h100") == 2
    assert gpus(r, "either", "a100") == 2
    assert gpus(r, "cheap") == 0
    # a100: cheap (6) is left out, so at least 6; h100: "either" must not prefer h100:
    # 20 - p_h <= 15 - p_a  ->  p_h >= 11.
    assert r.prices == {"h100": 11.0, "a100": 6.0}
    assert r.charges == {"fast": 22.0, "either": 12.0}


def test_divisible_mode_gives_fractions():
    inst = Instance(
        tiers=(Tier("a100", 3),),
        tenants=(Tenant("x"), Tenant("y"), Tenant("z")),
        bids=(
            Bid("a", "x", 2, {"a100": 1}),
            Bid("b", "y", 2, {"a100": 1}),
            Bid("c", "z", 2, {"a100": 1}),
        ),
    )
    r = clear(inst, mechanism="maxmin", divisible=True)
    assert [a.gpus for a in r.allocations] == pytest.approx([1.0, 1.0, 1.0])
    whole = clear(inst, mechanism="maxmin")
    assert all(float(a.gpus).is_integer() for a in whole.allocations)
    assert sum(a.gpus for a in whole.allocations) == 3


def test_to_json_has_exactly_the_documented_keys():
    out = clear(two_bidders()).to_json()
    assert list(out) == ["allocations", "prices", "charges", "diagnostics"]
    assert out["allocations"][0] == {"bid": "b1", "tier": "a100", "gpus": 2}
    for key in (
        "mechanism",
        "status",
        "welfare",
        "utilisation",
        "jain",
        "min_share_ratio",
        "guarantees_unmet",
        "envy_violations",
        "rounding_loss",
        "build_seconds",
        "solve_seconds",
        "rounding_seconds",
        "total_seconds",
    ):
        assert key in out["diagnostics"]


def test_unknown_policy_and_parameter_are_refused():
    with pytest.raises(ClearingError, match="policy.name"):
        clear(two_bidders(), mechanism="lottery")
    with pytest.raises(ClearingError, match="policy.params.speed"):
        clear(two_bidders(), params={"speed": 1})
    with pytest.raises(ClearingError, match="time_limit"):
        clear(two_bidders(), params={"time_limit": -1})
