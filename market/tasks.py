"""Celery tasks: thin, named, taking ids. The services hold every decision and every lock.

Late acks are on (config/settings.py): a worker killed mid-task leaves its message unacked,
the broker redelivers it, and the round's status (re-checked under its row lock) makes the
redelivered run finish the work exactly once.
"""

from __future__ import annotations

import logging

from celery import shared_task

from market.errors import MarketError
from market.services import round_process, rounds_tick

logger = logging.getLogger(__name__)


@shared_task(name="market.rounds_tick")
def rounds_tick_task() -> dict:
    """Beat, every few seconds: clear, settle and judge due rounds, open the next, finish
    ended ones."""
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
        "open_round": report.open_round,
        "finished": report.finished,
    }


@shared_task(name="market.round_clear")
def round_clear_task(round_id: int) -> str:
    """Close (if due), clear, settle and judge one round now instead of waiting for the tick."""
    try:
        return round_process(round_id=round_id).status
    except MarketError as exc:
        # Not due yet, or refused: nothing to retry; the tick handles it when it is due.
        logger.info("round %s not processed: %s", round_id, exc)
        return f"refused: {exc}"
