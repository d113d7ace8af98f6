"""Rate limits fail open when their cache is down.

The counters of the API throttles and of agent ingest live in the shared cache (Redis). A
rate limit protects the service; it is not what the service does. So when the cache cannot
be reached, the request goes on without being counted: bids and ingest keep working on
PostgreSQL alone. Each such request is logged and counted; ``/metrics`` shows the count as
``gpumarket_rate_limit_fail_open_total``. The count is this process's since it started.
"""

from __future__ import annotations

import logging
import threading
from collections import Counter

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
