"""Reserved quotas on the platform: an explicit policy parameter, empty by default. Without
it the guarantee lives inside the mechanism; "by_weight" brings back the per-tier split."""

from __future__ import annotations

import pytest

from market.models import Allocation
from market.policy.forms import PolicyVersionForm
from market.services.bids import bid_place
from market.services.tick import round_process
from tests.market.marketkit import T0, market_make

pytestmark = pytest.mark.django_db


def _won(rnd, tenant) -> int:
    return sum(a.gpus for a in Allocation.objects.filter(round=rnd, tenant=tenant))


def _contest(team, rival, **policy):
    """team bids high for all 4 A100s; rival wants 3 at a low limit."""
    market = market_make(**policy)
    for (tenant, user), quantity, limit in ((team, 4, 9000), (rival, 3, 1100)):
        bid_place(
            user=user,
            tenant=tenant,
            round=market.round,
            now=T0,
            quantity=quantity,
            limits={"a100": limit},
        )
    return round_process(round_id=market.round.pk, now=market.after_close())


def test_without_quotas_the_guarantee_holds_inside_the_mechanism(team, rival):
    rnd = _contest(team, rival)
    # Equal weights: each tenant is guaranteed half of the tier, and no more is set aside.
    assert (_won(rnd, team[0]), _won(rnd, rival[0])) == (2, 2)
    assert rnd.prices["a100"] == 9000  # the team still wants more at its limit


def test_reserved_quotas_set_aside_gpus_before_the_mechanism_runs(team, rival):
    rnd = _contest(team, rival, params={"reserved_quotas": {rival[0].slug: {"a100": 3}}})
    assert (_won(rnd, team[0]), _won(rnd, rival[0])) == (1, 3)


def test_quotas_by_weight_are_the_per_tier_split(team, rival):
    rnd = _contest(team, rival, params={"reserved_quotas": "by_weight"})
    assert (_won(rnd, team[0]), _won(rnd, rival[0])) == (2, 2)


def test_the_policy_form_refuses_a_malformed_quota_setting():
    market = market_make()
    for bad in ('{"lab": {"a100": -1}}', '"equal"', '{"lab": {"a100": 1.5}}'):
        form = PolicyVersionForm(
            data={"params": '{"reserved_quotas": ' + bad + "}"},
            tiers=[market.a100, market.h100],
            base=None,
        )
        form.is_valid()
        assert "reserved_quotas: use" in str(form.errors.get("params")), bad
