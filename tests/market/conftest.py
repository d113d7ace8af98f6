"""Market fixtures (the data itself is made by tests/market/marketkit.py)."""

from __future__ import annotations

import pytest

from tests import factories
from tests.market.marketkit import Market, market_make


@pytest.fixture
def market(db) -> Market:
    """Tiers a100 (4 GPUs, reserve 1.000/GPU-h) and h100 (2 GPUs, reserve 2.000), welfare
    policy with 60-minute rounds, and the round open at T0 (window 10:00-11:00)."""
    return market_make()


@pytest.fixture
def team(db):
    """A tenant with 100 credits and one researcher: (tenant, user)."""
    tenant = factories.tenant(name="Vision Lab", credits=100_000)
    return tenant, factories.member(tenant=tenant)


@pytest.fixture
def rival(db):
    tenant = factories.tenant(name="Speech Lab", credits=100_000)
    return tenant, factories.member(tenant=tenant)
