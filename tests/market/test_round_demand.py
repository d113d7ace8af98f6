"""The supply/demand chart draws what the clearing saw, and the demand forecast counts a
multi-tier bid by the same rule."""

from __future__ import annotations

import pytest

from market.forecast_selectors import tier_demand_history
from market.selectors import round_demand
from market.services.bids import bid_place
from market.services.round_clearing import round_clear
from market.services.settlement import round_settle
from tenants.budgets import budget_set
from tenants.ledger import MILLI
from tests import factories
from tests.market.marketkit import T0, market_make

pytestmark = pytest.mark.django_db


def _team(name):
    tenant = factories.tenant(name=name, credits=100 * MILLI)
    return tenant, factories.member(tenant=tenant)


def test_demand_is_the_bids_the_round_cleared_within_each_teams_share_cap():
    # a100: 4 GPUs, a team may hold half of them.
    market = market_make(round_minutes=60, max_share_pct={"a100": 50})
    capped, vision, speech = _team("Language Group"), _team("Vision Lab"), _team("Speech")
    budget_set(tenant=capped[0], window="day", mode="hard", cap=1 * MILLI, actor=None)

    def place(team, quantity, limits):
        return bid_place(user=team[1], tenant=team[0], round=market.round, quantity=quantity,
                         limits=limits, now=T0)  # fmt: skip

    left_out = place(capped, 4, {"a100": 5000})  # over its hard cap: not cleared
    place(vision, 4, {"a100": 3000})  # its share cap lets it hold 2
    place(speech, 2, {"a100": 1500, "h100": 2500})  # one GPU on each tier
    after = market.after_close()
    rnd = round_settle(round_id=round_clear(round_id=market.round.pk, now=after).pk, now=after)
    assert str(left_out.pk) in rnd.diagnostics["left_out_by_hard_cap"]

    demand = round_demand(rnd=rnd)
    assert demand == {"a100": [(3000, 2.0), (1500, 1.0)], "h100": [(2500, 1.0)]}
    # Demand at the price crosses supply where the clearing did: 3 GPUs wanted of 4 at the
    # reserve, so the price is the reserve.
    assert rnd.prices["a100"] == 1000

    # The forecast's history counts the same multi-tier bid by the same rule.
    history = tier_demand_history(rounds=1)
    assert history["h100"].demand == [1.0]
    assert history["a100"].demand[0] == 4 + 4 + 1.0
