"""Replaying past rounds: the replay clears exactly the bids the round cleared, with the
escrow they held then, so a round replayed under its own version gives its own outcome."""

from __future__ import annotations

import pytest

from market.policy.replay import recorded_round_data, rounds_replay
from market.policy.selectors import recorded_side
from market.services.bids import bid_place
from market.services.round_clearing import round_clear
from market.services.settlement import round_settle
from tenants.budgets import budget_set
from tenants.ledger import MILLI
from tests import factories
from tests.market.marketkit import T0, market_make

pytestmark = pytest.mark.django_db


def _round_with_a_capped_team(mechanism: str):
    market = market_make(round_minutes=60, mechanism=mechanism)
    capped = factories.tenant(name="Language Group", credits=100 * MILLI)
    other = factories.tenant(name="Vision Lab", credits=100 * MILLI)
    budget_set(tenant=capped, window="day", mode="hard", cap=1 * MILLI, actor=None)
    left_out = bid_place(user=factories.member(tenant=capped), tenant=capped,
                         round=market.round, quantity=4, limits={"a100": 5000}, now=T0)  # fmt: skip
    bid_place(user=factories.member(tenant=other), tenant=other, round=market.round,
              quantity=3, limits={"a100": 1500, "h100": 2500}, now=T0)  # fmt: skip
    after = market.after_close()
    rnd = round_settle(round_id=round_clear(round_id=market.round.pk, now=after).pk, now=after)
    assert str(left_out.pk) in rnd.diagnostics["left_out_by_hard_cap"]
    return market, rnd, left_out, other


@pytest.mark.parametrize("mechanism", ["welfare", "fisher"])
def test_a_round_replayed_under_its_own_version_gives_its_own_outcome(mechanism):
    market, rnd, left_out, other = _round_with_a_capped_team(mechanism)

    data = recorded_round_data(rnd)
    assert left_out.pk not in data.bid_ids.tolist()
    # The escrow the cleared bid held when the round cleared (3 GPUs x 2.500 x 1 h).
    assert data.escrow.tolist() == [3 * 2500]

    (row,), totals = rounds_replay(version=market.policy, last=1)
    assert row.other.error == ""
    assert (
        row.other.gpus_by_tenant == row.active.gpus_by_tenant == recorded_side(rnd).gpus_by_tenant
    )
    assert row.other.allocated == row.active.allocated
    assert row.other.prices == row.active.prices
    assert sum(row.other.allocated.values()) <= sum(rnd.capacities.values())
    assert totals.gpus_other == totals.gpus_active


def test_jains_index_counts_a_team_the_round_left_out_at_nothing():
    market, rnd, _left_out, _other = _round_with_a_capped_team("welfare")
    # Two teams bid; one got nothing (all its bids over its hard cap): not 1.000.
    assert rnd.diagnostics["jain"] == pytest.approx(0.5)
    assert rnd.diagnostics["jain_cleared"] == pytest.approx(1.0)
    assert rnd.diagnostics["teams_left_out"] == 1
    (row,), _ = rounds_replay(version=market.policy, last=1)
    assert row.other.fairness == pytest.approx(row.active.fairness) == pytest.approx(0.5)
