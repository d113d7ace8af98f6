"""The periodic driver: everything due is found by scanning the database, so a lost Celery
message or a broker outage delays work but never loses it."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from celery import current_app
from django.conf import settings

from market.errors import MarketError, RoundBusy
from market.models import Round
from market.services._common import now_or
from market.services.backfill import backfill_run
from market.services.guardrails import guardrails_enforce
from market.services.orders.opening import orders_bid
from market.services.round_clearing import round_clear
from market.services.rounds import round_finish, round_open_next
from market.services.settlement import round_settle
from market.services.void import round_fail
from tenants.errors import TenantError

logger = logging.getLogger(__name__)

DUE_STATUSES = (Round.Status.OPEN, Round.Status.CLOSED, Round.Status.CLEARED)


def round_process(*, round_id: int, now: datetime | None = None, wait: bool = True) -> Round:
    """Close, clear and settle one due round, then judge it against its policy's guardrails,
    each step a transaction that re-checks the round's status under its row lock, so running
    this twice (or after a crash at any point) settles the round exactly once. A settlement
    the ledger refuses fails the round, which releases every hold.

    A breach rolls the policy back before the next round clears (and voids this round if the
    version says so; the round returned is then ``voided``). A guardrail check that raises is
    logged and leaves the policy as it was: the round stays settled. ``wait=False``:
    RoundBusy, and nothing done, if another worker holds the round."""
    now = now_or(now)
    rnd = round_clear(round_id=round_id, now=now, wait=wait)
    if rnd.status != Round.Status.CLEARED:
        return rnd
    try:
        rnd = round_settle(round_id=round_id, now=now, wait=wait)
    except RoundBusy:
        raise  # another worker holds the round: not a refusal, nothing to fail
    except (MarketError, TenantError) as exc:
        logger.error("round %s could not settle: %s", round_id, exc)
        return round_fail(round=rnd, reason=f"settlement refused: {exc}")
    try:
        if guardrails_enforce(round=rnd).voided:
            rnd.refresh_from_db()
    except Exception:  # noqa: BLE001 - the round is settled; only the policy check failed
        logger.exception("round %s: guardrail check failed; the policy was left as it is", round_id)
    return rnd


@dataclass
class TickReport:
    processed: dict[int, str] = field(default_factory=dict)  # round id -> status reached
    errors: dict[int, str] = field(default_factory=dict)  # round id -> error (retried next tick)
    busy: list[int] = field(default_factory=list)  # held by another worker (left to it)
    open_round: int | None = None
    order_bids: int = 0  # bids the standing orders placed in the open round this pass
    backfilled: list[int] = field(default_factory=list)  # allocations a backfill made
    finished: list[int] = field(default_factory=list)


def rounds_tick(*, now: datetime | None = None) -> TickReport:
    """One pass of the market clock: process every due round (bidding closed but not yet
    settled), open the next round if none is open, run a backfill sub-round when one is due,
    finish rounds whose window ended more than the preemption grace ago.

    A round that raises is logged and left as it is for the next tick; the other rounds still
    go ahead, so one bad round cannot stop the market. A round another worker holds (a long
    settlement) is left to it at once: a tick that waited on its lock would hold a worker
    process, which the telemetry tasks share, for as long as the settlement runs.
    """
    now = now_or(now)
    report = TickReport()
    due = Round.objects.filter(status__in=DUE_STATUSES, closes_at__lte=now).order_by(
        "closes_at", "pk"
    )
    for round_id in list(due.values_list("pk", flat=True)):
        try:
            report.processed[round_id] = round_process(
                round_id=round_id, now=now, wait=False
            ).status
        except RoundBusy:
            report.busy.append(round_id)
        except Exception as exc:  # noqa: BLE001 - isolate one round; it stays due and is retried
            logger.exception("round %s: processing failed; the next tick retries it", round_id)
            report.errors[round_id] = f"{type(exc).__name__}: {exc}"
    if Round.Status.SETTLED in report.processed.values():
        _digest_request()
        _forecast_warm_request()
    try:
        report.open_round = round_open_next(now=now, wait=False).pk
    except RoundBusy:
        pass  # another worker is closing or opening the round; the next tick looks again
    else:
        # Every live standing order bids in the open round (once: a second pass adds nothing).
        report.order_bids = len(orders_bid(round_id=report.open_round, now=now).bids)
    # Unsold and reclaimed GPUs of the running window, offered again every few minutes.
    try:
        report.backfilled = backfill_run(now=now).allocations
    except Exception:  # noqa: BLE001 - the rounds went ahead; the next tick offers them again
        logger.exception("backfill failed; the next tick tries again")
    # Finish a window only after the preemption grace: until then the enforcement loop is
    # stopping the work still running on it, and labels those allocations preempted.
    finish_before = now - timedelta(seconds=settings.GPUMARKET_PREEMPT_GRACE_SECONDS)
    ended = Round.objects.filter(status=Round.Status.SETTLED, ends_at__lte=finish_before).order_by(
        "pk"
    )
    for round_id in list(ended.values_list("pk", flat=True)):
        round_finish(round_id=round_id, now=now)
        report.finished.append(round_id)
    return report


# The alerts app (above the market) gathers the notices a settlement wrote into one digest
# per recipient: asked for once per tick that settled a round, so a round's results go out
# as one message each, not one per notice (beat runs the same task as a backstop).
ALERTS_DIGEST_TASK = "alerts.digest"


# The market page's demand forecast is made by a worker once per settled history, not by the
# page's first reader (its fits take about a second a tier).
FORECAST_WARM_TASK = "market.demand_forecast_warm"


def _forecast_warm_request() -> None:
    try:
        current_app.send_task(FORECAST_WARM_TASK)
    except Exception as exc:  # noqa: BLE001 - the page makes the forecast itself on a miss
        logger.warning("could not request the demand forecast now (%s); the page makes it", exc)


def _digest_request() -> None:
    try:
        current_app.send_task(ALERTS_DIGEST_TASK)
    except Exception as exc:  # noqa: BLE001 - beat's digest sends the notices a little later
        logger.warning("could not request the alerts digest now (%s); beat's run sends it", exc)
