"""A tick does not wait for a round another worker is processing.

While one worker closes and clears, or settles, a very large round (minutes, in one
transaction, its row locked), beat sends a tick every few seconds. A tick that waited on the
round's lock held a worker process until the other worker was done; with the worker's
processes all waiting, the telemetry tasks that share them (enforcement every 10 s) did not
run for the whole settlement.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

import pytest
from django.db import connection, connections, transaction

from market.models import Round
from market.services.bids import bid_place
from market.services.round_clearing import round_clear
from market.services.tick import rounds_tick
from tests import factories
from tests.market.marketkit import T0, market_make

pytestmark = pytest.mark.django_db(transaction=True)


def _market_with_a_bid():
    market = market_make()
    tenant = factories.tenant(credits=10**9)
    user = factories.member(tenant=tenant)
    bid_place(
        user=user, tenant=tenant, round=market.round, now=T0, quantity=1, limits={"a100": 2000}
    )
    return market


def _while_held(
    round_id: int, call: Callable[[], object], *, hold: float = 20.0
) -> tuple[object, bool]:
    """``call()`` while another connection holds the round's row lock (as a worker clearing or
    settling it does, for minutes, or a bid, for a moment); returns its result and whether
    the lock was still held when it returned (the holder lets go by itself after ``hold``
    seconds)."""
    locked, release = threading.Event(), threading.Event()

    def other_worker() -> None:
        try:
            with transaction.atomic():
                Round.objects.select_for_update().get(pk=round_id)
                locked.set()
                release.wait(timeout=hold)
        finally:
            connections.close_all()

    holder = threading.Thread(target=other_worker)
    holder.start()
    try:
        assert locked.wait(timeout=10)
        result = call()
        return result, holder.is_alive()
    finally:
        release.set()
        holder.join()


def test_a_tick_skips_the_overdue_round_another_worker_holds_and_a_later_tick_settles_it():
    assert connection.vendor == "postgresql"
    market = _market_with_a_bid()
    report, still_held = _while_held(market.round.pk, lambda: rounds_tick(now=market.after_close()))
    assert still_held  # the tick came back while the other worker held on
    assert report.busy == [market.round.pk]
    assert market.round.pk not in report.processed and not report.errors
    assert report.open_round is None  # the next round is opened once this one is closed
    market.round.refresh_from_db()
    assert market.round.status == Round.Status.OPEN  # untouched

    report = rounds_tick(now=market.after_close())
    assert report.processed == {market.round.pk: "settled"} and report.busy == []
    assert Round.objects.get(pk=report.open_round).status == Round.Status.OPEN


def test_while_another_worker_settles_a_round_the_tick_still_opens_the_next():
    market = _market_with_a_bid()
    assert round_clear(round_id=market.round.pk, now=market.after_close()).status == "cleared"
    report, still_held = _while_held(market.round.pk, lambda: rounds_tick(now=market.after_close()))
    assert still_held and report.busy == [market.round.pk] and not report.errors
    assert Round.objects.get(pk=report.open_round).status == Round.Status.OPEN
    market.round.refresh_from_db()
    assert market.round.status == Round.Status.CLEARED


def test_a_round_held_for_a_moment_as_a_bid_holds_it_is_waited_for():
    # A bid locks the open round for milliseconds; a tick waits that out (up to
    # BUSY_AFTER_MS) instead of leaving the round for a later tick.
    market = _market_with_a_bid()
    report, still_held = _while_held(
        market.round.pk, lambda: rounds_tick(now=market.after_close()), hold=0.3
    )
    assert not still_held
    assert report.processed == {market.round.pk: "settled"} and report.busy == []
