from __future__ import annotations

import os
import signal

import pytest
from django.utils import timezone

from market.models import Order
from market.services.tiers import tier_create
from telemetry.services import node_register
from tenants.ledger import MILLI
from tests import factories
from tests.conftest import test_database_url as database_url  # aliased: pytest would collect test_*
from tests.telemetry.live import LiveServer


@pytest.fixture
def tier(db):
    return tier_create(actor=None, slug="a100", name="A100 80GB")


@pytest.fixture
def node_token(tier):
    """A registered node named n1 (GPUs discovered into ``tier``) and its token."""
    return node_register(name="n1", tier=tier, actor="test")


@pytest.fixture
def server(transactional_db, redis_url, tmp_path):
    """The app under gunicorn on the test database (end-to-end tests)."""
    live = LiveServer(
        database_url=database_url(), broker_url=redis_url, log_path=tmp_path / "web.log"
    )
    live.start()
    yield live
    live.stop()


@pytest.fixture
def children():
    """Child processes a test starts; killed (their whole group) when it ends."""
    started = []
    yield started
    for child in started:
        if child.poll() is None:
            os.killpg(child.pid, signal.SIGKILL)
            child.wait(timeout=10)


# The node, clock, team and standing order of the orders' enforcement tests
# (test_enforcement_orders.py, test_enforcement_held_jobs.py); a module's own fixtures of these
# names take precedence.
@pytest.fixture
def node(tier):
    node, _ = node_register(name="n1", tier=tier, actor="test")
    return node


@pytest.fixture
def now():
    return timezone.now()


@pytest.fixture
def team():
    return factories.tenant(name="Vision", credits=1_000 * MILLI)


@pytest.fixture
def order(team):
    return Order.objects.create(
        tenant=team,
        author=factories.member(tenant=team),
        name="three-day run",
        gpus=1,
        min_gpus=1,
        ceiling=100 * MILLI,
    )
