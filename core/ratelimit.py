"""Rate limits: requests counted in windows of the clock, failing open when the cache is down.

``rate_count`` counts one request against a key in the current window (a minute, say, from
its first second): on Redis one ``INCR`` and ``EXPIRE`` in one round trip, on another Django
cache an ``add`` and an ``incr``. The API throttles and agent ingest both count this way.

The counters of the API throttles and of agent ingest live in the shared cache (Redis). A
rate limit protects the service; it is not what the service does. So when the cache cannot
be reached, the request goes on without being counted: bids and ingest keep working on
PostgreSQL alone. Each such request is logged and counted; ``/metrics`` shows the count as
``gpumarket_rate_limit_fail_open_total``. The count is this process's since it started.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections import Counter

from django.core.cache import caches
from django.core.cache.backends.redis import RedisCache
from redis import RedisError

logger = logging.getLogger(__name__)

# What a cache backend raises when its server is down or unreachable.
CACHE_ERRORS: tuple[type[BaseException], ...] = (RedisError, OSError)
# The scopes counted, so that /metrics shows each at 0 before the first failure.
SCOPES = ("bids", "pace", "ingest")

_counts: Counter[str] = Counter()
_lock = threading.Lock()


def rate_limit_fail_open(*, scope: str, error: BaseException) -> None:
    """Record that a request of ``scope`` went through uncounted because of ``error``."""
    logger.warning(
        "rate limit %s not counted, request allowed: cache unreachable (%s)", scope, error
    )
    with _lock:
        _counts[scope] += 1


def rate_limit_fail_open_counts() -> dict[str, int]:
    with _lock:
        return {
            scope: _counts.get(scope, 0) for scope in (*SCOPES, *sorted(set(_counts) - set(SCOPES)))
        }


def rate_count(*, key: str, seconds: int) -> tuple[int, int]:
    """Count one request against ``key`` in the current window of ``seconds`` (windows start
    at multiples of ``seconds`` since the epoch): the count so far in this window, this one
    included, and the seconds left until the window ends (at least 1). Raises one of
    ``CACHE_ERRORS`` when the cache cannot be reached."""
    now = time.time()
    start = int(now // seconds) * seconds
    name = f"{key}:{start}"
    left = max(1, math.ceil(start + seconds - now))
    backend = caches["default"]
    if isinstance(backend, RedisCache):
        # Django's cache API cannot increment and set an expiry in one call; its Redis
        # client can, in one pipeline (the key as Django itself would name it).
        full = backend.make_and_validate_key(name)
        pipe = backend._cache.get_client(full, write=True).pipeline(transaction=False)
        count, _ = pipe.incr(full).expire(full, seconds + 1).execute()
        return int(count), left
    if backend.add(name, 1, timeout=seconds + 1):
        return 1, left
    try:
        return backend.incr(name), left
    except ValueError:  # expired between add and incr: the first of the window after all
        backend.add(name, 1, timeout=seconds + 1)
        return 1, left
