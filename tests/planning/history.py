"""A small market with settled history for planning tests: one tier, hourly rounds, two teams."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from django.utils import timezone

from market.services.bids import bid_place
from market.services.policy import policy_activate, policy_version_create
from market.services.rounds import round_open_next
from market.services.tick import round_process
from market.services.tiers import tier_create
from tenants.ledger import MILLI
from tenants.models import Membership, Tenant
from tests import factories

PASSWORD = "pw-member-123"


@dataclass
class History:
    admin: object
    vision: Tenant
    nlp: Tenant
    manager: object
    researcher: object
    end: datetime


def history_build(*, rounds: int = 10, capacity: int = 8) -> History:
    """``rounds`` settled hourly rounds in which vision asks for 6 GPUs at 3 credits and nlp
    for 5 at 2.5, on ``capacity`` A100s with a reserve of 1 credit."""
    admin = factories.admin_user(username="ops")
    tier_create(actor=admin, slug="a100", name="A100", capacity=capacity)
    version = policy_version_create(
        actor=admin, mechanism="welfare", round_minutes=60, reserve_prices={"a100": MILLI}
    )
    policy_activate(version=version, actor=admin)
    vision = factories.tenant(name="Vision Lab", credits=100_000 * MILLI)
    nlp = factories.tenant(name="NLP Group", credits=100_000 * MILLI)
    manager = factories.member(
        tenant=vision, username="vmanager", role=Membership.Role.MANAGER, password=PASSWORD
    )
    researcher = factories.member(tenant=vision, username="vresearcher", password=PASSWORD)
    nlp_user = factories.member(tenant=nlp, username="nuser", password=PASSWORD)
    # Ending about now, so that campaigns declared after it are in the web pages' future.
    now = timezone.now().replace(minute=10, second=0, microsecond=0) - timedelta(hours=rounds + 1)
    for _ in range(rounds):
        rnd = round_open_next(now=now)
        bid_place(user=researcher, tenant=vision, round=rnd, quantity=6,
                  limits={"a100": 3 * MILLI}, now=now)  # fmt: skip
        bid_place(user=nlp_user, tenant=nlp, round=rnd, quantity=5,
                  limits={"a100": 2500}, now=now)  # fmt: skip
        round_process(round_id=rnd.pk, now=rnd.closes_at + timedelta(seconds=1))
        now = rnd.closes_at + timedelta(seconds=2)
    return History(admin, vision, nlp, manager, researcher, now)
