from __future__ import annotations

import pytest
from django.core.cache import cache

from tests.api.world import World, world_build, world_telemetry


@pytest.fixture(autouse=True)
def _fresh_throttles():
    # Rate-limit counters live in the cache, which outlives a test's database.
    cache.clear()
    yield
    cache.clear()


@pytest.fixture
def world(db) -> World:
    built = world_build()
    world_telemetry(built)
    return built
