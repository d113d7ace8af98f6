"""Market test data made through the services: tiers, an active policy, an open round."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from market.models import PolicyVersion, Round, Tier
from market.services.policy import policy_activate, policy_version_create
from market.services.rounds import round_open_next
from market.services.tiers import tier_create
from tests import factories

# A fixed clock: services take ``now``, so tests never depend on the wall clock.
T0 = datetime(2030, 1, 7, 9, 10, tzinfo=UTC)


@dataclass
class Market:
    admin: object
    a100: Tier
    h100: Tier
    policy: PolicyVersion
    round: Round

    def after_close(self, seconds: int = 1) -> datetime:
        return self.round.closes_at + timedelta(seconds=seconds)


def market_make(
    *, round_minutes: int = 60, reserves: dict | None = None, now: datetime = T0, **policy
) -> Market:
    admin = factories.admin_user()
    a100 = tier_create(actor=admin, slug="a100", name="A100", capacity=4)
    h100 = tier_create(actor=admin, slug="h100", name="H100", capacity=2)
    version = policy_version_create(
        actor=admin,
        mechanism=policy.pop("mechanism", "welfare"),
        round_minutes=round_minutes,
        reserve_prices=reserves if reserves is not None else {"a100": 1000, "h100": 2000},
        **policy,
    )
    policy_activate(version=version, actor=admin)
    return Market(admin=admin, a100=a100, h100=h100, policy=version, round=round_open_next(now=now))
