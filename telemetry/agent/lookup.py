"""What the allocation lookups (slurm_mapping.py, kubernetes_mapping.py) share: the source
protocol, the cache of their answers and the parsing of an allocation id found in a comment
or label. The registry (mapping.py) imports the lookups; they import this, never the registry.

The agent asks about the same work every few seconds and these values seldom change, so
answers are cached per job or pod; a lookup that failed (no such job, controller down) is
cached briefly, so a sick controller costs one timeout per job per minute or so rather than
one per iteration.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import Protocol

from telemetry.agent.procmap import ProcessInfo, allocation_id

logger = logging.getLogger(__name__)

# A job's comment or a pod's label is set at submission and rarely edited; five minutes
# bounds how long an edit takes to show. Failures are retried sooner: the job may just
# have been submitted, the controller may be back.
FOUND_TTL_SECONDS = 300.0
FAILED_TTL_SECONDS = 30.0


class AllocationSource(Protocol):
    name: str

    def allocation_for(self, info: ProcessInfo) -> int | None:
        """The allocation of `info`'s job or pod, None when it has none or cannot be read.
        Must not block for long nor raise for an ordinary failure."""
        ...


@dataclass(frozen=True, slots=True)
class Lookup:
    """What one lookup found. `settled` is False when the question could not be answered
    (no such job yet, an error), so the answer is kept only briefly."""

    allocation: int | None
    settled: bool


@dataclass(slots=True)
class _Entry:
    allocation: int | None
    expires_at: float


class LookupCache:
    """Answers per key (job id, pod) until they expire; bounded, expired entries go first."""

    def __init__(
        self,
        *,
        found_ttl_seconds: float = FOUND_TTL_SECONDS,
        failed_ttl_seconds: float = FAILED_TTL_SECONDS,
        limit: int = 4096,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._found_ttl = found_ttl_seconds
        self._failed_ttl = failed_ttl_seconds
        self._limit = limit
        self._clock = clock
        self._entries: dict[Hashable, _Entry] = {}

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, key: Hashable, fetch: Callable[[], Lookup]) -> int | None:
        now = self._clock()
        entry = self._entries.get(key)
        if entry is not None and entry.expires_at > now:
            return entry.allocation
        found = fetch()
        ttl = self._found_ttl if found.settled else self._failed_ttl
        self._entries.pop(key, None)
        self._entries[key] = _Entry(allocation=found.allocation, expires_at=now + ttl)
        if len(self._entries) > self._limit:
            self._evict(now)
        return found.allocation

    def _evict(self, now: float) -> None:
        for key in [k for k, e in self._entries.items() if e.expires_at <= now]:
            del self._entries[key]
        # Still full of live entries: drop the oldest (insertion order is refresh order).
        while len(self._entries) > self._limit:
            del self._entries[next(iter(self._entries))]


def allocation_value_parse(value: str, *, where: str) -> int | None:
    """The allocation id in a comment or label; a warning and None when it is not one."""
    allocation = allocation_id(value)
    if allocation is None:
        logger.warning(
            "%s names allocation %r, which is not an allocation id (a positive whole number); "
            "its work stays untagged",
            where,
            value,
        )
    return allocation
