"""Rate-limit windows: one counter per key and window, on Redis and on any Django cache."""

from __future__ import annotations

import types

import pytest
import redis
from django.core.cache import cache

from core import ratelimit
from core.ratelimit import rate_count


def _redis_cache(settings, redis_url: str) -> None:
    settings.CACHES = {
        "default": {
            "BACKEND": "django.core.cache.backends.redis.RedisCache",
            "LOCATION": redis_url,
            "KEY_PREFIX": "ratelimit-test",
        }
    }


@pytest.fixture(params=["redis", "locmem"])
def any_cache(request, settings, redis_url):
    if request.param == "redis":
        _redis_cache(settings, redis_url)
    cache.clear()
    yield
    cache.clear()


@pytest.fixture
def redis_cache(settings, redis_url):
    _redis_cache(settings, redis_url)
    cache.clear()
    yield redis.Redis.from_url(redis_url)
    cache.clear()


def clock_at(monkeypatch, seconds: float) -> None:
    monkeypatch.setattr(ratelimit, "time", types.SimpleNamespace(time=lambda: seconds))


def test_each_call_counts_once_in_its_window_and_says_when_the_window_ends(any_cache, monkeypatch):
    clock_at(monkeypatch, 6_000_042.5)  # 42.5 s into a minute
    assert [rate_count(key="k", seconds=60) for _ in range(3)] == [(1, 18), (2, 18), (3, 18)]
    assert rate_count(key="other", seconds=60) == (1, 18)
    clock_at(monkeypatch, 6_000_059.9)
    assert rate_count(key="k", seconds=60) == (4, 1)
    clock_at(monkeypatch, 6_000_060.0)  # a new window starts from nothing
    assert rate_count(key="k", seconds=60) == (1, 60)


def test_on_redis_a_window_is_one_key_that_expires_with_it(redis_cache, monkeypatch):
    clock_at(monkeypatch, 6_000_042.5)
    rate_count(key="k", seconds=60)
    rate_count(key="k", seconds=60)
    keys = redis_cache.keys("ratelimit-test:*")
    assert len(keys) == 1
    assert int(redis_cache.get(keys[0])) == 2
    assert 0 < redis_cache.ttl(keys[0]) <= 61
