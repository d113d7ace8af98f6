"""fisher's prices as money: the tier duals become integer milli-credits per GPU-hour only in
``round_clearing.tier_price``. Whether eg.py's interior point or the conic solver produced
the dual, the whole milli-credits charged must agree to what either solver is accurate to."""

from __future__ import annotations

import dataclasses

import pytest

from market.clearing import clear
from market.clearing.mechanisms import fisher
from market.services.round_clearing import tier_price
from tests.market.clearing.test_eg import _instance

# Measured: up to 10 milli-credits apart at prices near 62,000 (1.6e-4), whole GPUs, 6 seeds
# (docs/clearing.md). Neither solver certifies its duals, only its objective.
AGREE = 3e-4


def _in_milli_credits(seed: int):
    """The test instance with its limits and reserves as the platform passes them: integer
    milli-credits per GPU-hour."""
    inst = _instance(seed, bids=600, tenants=40)
    return dataclasses.replace(
        inst,
        tiers=tuple(
            dataclasses.replace(t, reserve_price=t.reserve_price * 1000) for t in inst.tiers
        ),
        bids=tuple(
            dataclasses.replace(b, limits={k: v * 1000 for k, v in b.limits.items()})
            for b in inst.bids
        ),
    )


@pytest.mark.parametrize("divisible", [True, False])
@pytest.mark.parametrize("seed", [0, 1, 4])
def test_fisher_charges_the_same_whole_milli_credits_by_either_solver(monkeypatch, seed, divisible):
    inst = _in_milli_credits(seed)
    reserve = {t.name: int(t.reserve_price) for t in inst.tiers}
    charged = {}
    for label, arcs in (("eg", 0), ("conic", 10**9)):
        monkeypatch.setattr(fisher, "STRUCTURED_ARCS", arcs)
        prices = clear(inst, mechanism="fisher", divisible=divisible).prices
        charged[label] = {t: tier_price(p, reserve=reserve[t]) for t, p in prices.items()}
    for tier, price in charged["eg"].items():
        assert isinstance(price, int) and price >= reserve[tier]
        assert abs(price - charged["conic"][tier]) <= AGREE * charged["conic"][tier]
