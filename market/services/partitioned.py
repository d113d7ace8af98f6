"""Partitioned clearing on Celery: a very large round is split into sub-markets
(market/clearing/parts/partition.py), each cleared by a ``market.clear_part`` task on the
clearing_parts queue, on however many workers consume it, and combined here.

A part that fails, or does not come back in time (a lost worker), raises ClearingError, and
the round fails as on any solver error: every hold released, nothing settled.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from typing import Any

from celery import current_app, group
from celery.exceptions import TimeoutError as CeleryTimeout
from django.conf import settings
from django.core.exceptions import ImproperlyConfigured

from market import clearing
from market.clearing.instance.columns import arrays_to_json
from market.clearing.instance.inputs import Arrays
from market.clearing.parts.partition import clear_part, clear_partitioned

logger = logging.getLogger(__name__)


# Queued by name (the task lives in market/tasks.py, above the services); a part travels
# as MessagePack, which the sender must ask for since it does not import the task.
CLEAR_PART_TASK = "market.clear_part"
FAIR_MECHANISMS = frozenset({"fisher", "maxmin"})  # partitioned from the lower threshold
# The results come over Redis's publish/subscribe; before it listens, the group's result
# reads the parts' results once and, where they are not all in, sleeps this long (Celery's
# default: 0.5 s, which a small partitioned round waited out after its parts were back).
RESULTS_POLL_SECONDS = 0.02


def partition_parts(n_bids: int, *, mechanism: str = "welfare") -> int:
    """How many parts a round of ``n_bids`` open bids is cleared in under ``mechanism``
    (1 = exact): none below GPUMARKET_PARTITION_ABOVE_BIDS (welfare) or
    GPUMARKET_PARTITION_FAIR_ABOVE_BIDS (fisher, maxmin); above, at least
    GPUMARKET_PARTITION_PARTS, and enough to keep each part to
    GPUMARKET_PARTITION_BIDS_PER_PART bids."""
    threshold = (
        settings.GPUMARKET_PARTITION_FAIR_ABOVE_BIDS
        if mechanism in FAIR_MECHANISMS
        else settings.GPUMARKET_PARTITION_ABOVE_BIDS
    )
    if n_bids < threshold:
        return 1
    per_part = settings.GPUMARKET_PARTITION_BIDS_PER_PART
    if per_part < 1:
        raise ImproperlyConfigured(
            f"GPUMARKET_PARTITION_BIDS_PER_PART must be at least 1, got {per_part}"
        )
    return max(1, settings.GPUMARKET_PARTITION_PARTS, -(-n_bids // per_part))


def clear_in_parts(
    arrays: Arrays,
    *,
    mechanism: str,
    params: Mapping[str, Any] | None,
    reserved_quotas: Mapping[str, Mapping[str, float]] | str,
    parts: int,
) -> clearing.Result:

    def clear_here(sub: Arrays) -> dict[str, Any]:
        return clear_part(sub, mechanism=mechanism, params=params, reserved_quotas=reserved_quotas)

    def on_workers(_clear: object, subs: Iterable[Arrays]) -> list[dict[str, Any]]:
        subs = list(subs)
        if not current_app.conf.result_backend:
            # The embedded broker has no result backend: clear the parts here, one by one.
            logger.info("no Celery result backend: clearing %d parts in-process", len(subs))
            return [clear_here(sub) for sub in subs]
        job = group(
            current_app.signature(
                CLEAR_PART_TASK,
                args=(
                    arrays_to_json(
                        sub,
                        mechanism=mechanism,
                        params=params,
                        reserved_quotas=reserved_quotas,
                        packed=True,
                    ),
                    index,
                ),
                serializer="msgpack",
            )
            for index, sub in enumerate(subs)
        ).apply_async()
        timeout = settings.GPUMARKET_PARTITION_TIMEOUT_SECONDS
        try:
            payloads = job.get(
                timeout=timeout, disable_sync_subtasks=False, interval=RESULTS_POLL_SECONDS
            )
        except CeleryTimeout:
            job.revoke()
            raise clearing.ClearingError(
                f"{sum(1 for r in job.results if not r.ready())} of {len(subs)} parts of the "
                f"partitioned clear did not come back within {timeout} s (no worker on the "
                "clearing_parts queue, or one was lost)"
            ) from None
        except Exception as exc:  # noqa: BLE001 - whatever a part raised fails the round
            job.revoke()
            raise clearing.ClearingError(f"a part of the partitioned clear failed: {exc}") from exc
        finally:
            job.forget()
        return payloads

    return clear_partitioned(arrays, parts=parts, clear_part=clear_here, map_parts=on_workers)
