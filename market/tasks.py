"""Celery tasks: thin, named, taking ids. The services hold every decision and every lock.

Late acks are on (config/settings.py): a worker killed mid-task leaves its message unacked,
the broker redelivers it, and the round's status (re-checked under its row lock) makes the
redelivered run finish the work exactly once.
"""

from __future__ import annotations

import logging
import os
import time

from celery import shared_task
from celery.signals import worker_init
from django.conf import settings
from threadpoolctl import threadpool_limits

from market import clearing
from market.clearing.instance.columns import arrays_from_json
from market.clearing.parts.partition import clear_part
from market.errors import MarketError
from market.forecast_selectors import demand_forecasts_warm
from market.selectors import policy_active_get
from market.services.tick import round_process, rounds_tick

logger = logging.getLogger(__name__)


# Closing, clearing and settling a very large round takes minutes (config/settings.py).
ROUND_LIMITS = {
    "soft_time_limit": settings.GPUMARKET_ROUND_TASK_SOFT_TIME_LIMIT,
    "time_limit": settings.GPUMARKET_ROUND_TASK_TIME_LIMIT,
}


# A round that is not partitioned is cleared exactly in the task's own process: there the
# numerical libraries (OpenBLAS under numpy and scipy) are held to one thread, as each part's
# are (partition.clear_part). Their default is a thread per core, and the second one spins on
# cores the other processes need: on a busy 2-core host a 10k-bid fisher clear took
# 0.54-3.49 s with them, 0.10-0.49 s with one (maxmin 0.75-3.06 s, 0.10-0.50 s;
# bench/RESULTS.md). Holding the limit costs about 1 ms a task.
@shared_task(name="market.rounds_tick", **ROUND_LIMITS)
def rounds_tick_task() -> dict:
    """Beat, every few seconds: clear, settle and judge due rounds, open the next, finish
    ended ones."""
    with threadpool_limits(limits=1):
        report = rounds_tick()
    if report.errors:
        logger.warning(
            "rounds tick: %d round(s) failed and will be retried: %s",
            len(report.errors),
            report.errors,
        )
    return {
        "processed": report.processed,
        "errors": report.errors,
        "busy": report.busy,
        "open_round": report.open_round,
        "finished": report.finished,
    }


@shared_task(name="market.demand_forecast_warm", ignore_result=True)
def demand_forecast_warm_task() -> int:
    """Every tier's demand forecast for the market page, made and cached after a settlement."""
    policy = policy_active_get()
    return demand_forecasts_warm(policy.round_minutes if policy else 60)


@shared_task(name="market.round_clear", **ROUND_LIMITS)
def round_clear_task(round_id: int) -> str:
    """Close (if due), clear, settle and judge one round now instead of waiting for the tick."""
    try:
        with threadpool_limits(limits=1):
            return round_process(round_id=round_id).status
    except MarketError as exc:
        # Not due yet, or refused: nothing to retry; the tick handles it when it is due.
        logger.info("round %s not processed: %s", round_id, exc)
        return f"refused: {exc}"


# The queues the market's tasks go to, where rounds and their parts are cleared.
CLEARING_QUEUES = frozenset(
    route["queue"]
    for pattern, route in settings.CELERY_TASK_ROUTES.items()
    if pattern.startswith("market.")
)


@worker_init.connect
def clearing_kernels_load(sender=None, **_kwargs) -> None:
    """A worker that consumes a clearing queue loads the clearing's compiled kernels
    (``clearing.warm``) in its main process, before its pool starts: the pool's processes are
    forked from it with the kernels loaded, so none pays for them in its first part. A fresh
    worker's first million-bid round took 3.2 s for its slowest part where later rounds took
    0.7 s: each process compiled the kernels it first needed (no cache yet) or loaded them.
    Not done in each child (``worker_process_init``): Celery gives a child 4 s to start, and
    compiling without a cache takes about 5. Only the compiled kernels: no solver runs here,
    as a solver's threads would not survive the fork."""
    if not CLEARING_QUEUES & set(sender.app.amqp.queues.consume_from):
        return
    start = time.perf_counter()
    clearing.warm()
    logger.info("clearing kernels loaded in %.1f s", time.perf_counter() - start)


# Fault injection for the partitioned-clearing test: a part whose index is in this
# comma-separated list fails as a solver would. Unset in every real deployment.
FAIL_PART_ENV = "GPUMARKET_TEST_FAIL_PART"


@shared_task(name="market.clear_part", ignore_result=False, serializer="msgpack")
def clear_part_task(part: dict, index: int) -> dict:
    """Clear one part of a partitioned round (pure: no database) and return its result. The
    part comes as columns (market/clearing/instance/columns.py), checked before it is cleared, and its
    result goes back as columns (partition.part_result_to_json); both travel as MessagePack
    (settings: CELERY_RESULT_SERIALIZER)."""
    if str(index) in os.environ.get(FAIL_PART_ENV, "").split(","):
        raise clearing.ClearingError(f"part {index}: failed on purpose ({FAIL_PART_ENV})")
    arrays, mechanism, params, reserved_quotas = arrays_from_json(part)
    return clear_part(arrays, mechanism=mechanism, params=params, reserved_quotas=reserved_quotas)


@shared_task(
    name="market.slurm_reservations_create",
    autoretry_for=(Exception,),
    retry_backoff=5,
    max_retries=5,
)
def slurm_reservations_create_task(allocation_ids: list[int]) -> list[str]:
    """After settlement: the Slurm reservation of each placed allocation (retried on failure:
    the service is idempotent)."""
    from market.services.slurm_reservations import slurm_reservations_create

    return [r.name for r in slurm_reservations_create(allocation_ids=allocation_ids)]


@shared_task(
    name="market.slurm_reservations_end",
    autoretry_for=(Exception,),
    retry_backoff=5,
    max_retries=5,
)
def slurm_reservations_end_task(allocation_ids: list[int]) -> list[str]:
    """After a round is voided: its allocations' Slurm reservations end (idempotent)."""
    from market.services.slurm_reservations import slurm_reservations_end

    return slurm_reservations_end(allocation_ids=allocation_ids)
