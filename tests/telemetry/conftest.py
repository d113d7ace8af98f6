from __future__ import annotations

import pytest

from market.services import tier_create
from telemetry.services import node_register


@pytest.fixture
def tier(db):
    return tier_create(actor=None, slug="a100", name="A100 80GB")


@pytest.fixture
def node_token(tier):
    """A registered node named n1 (GPUs discovered into ``tier``) and its token."""
    return node_register(name="n1", tier=tier, actor="test")
