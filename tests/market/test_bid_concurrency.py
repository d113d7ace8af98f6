"""Bids placed at once, on real connections: the bids of a round go side by side (its row is
share-locked), and one tenant's bids are still checked against its budgets one at a time."""

from __future__ import annotations

import threading

import pytest
from django.db import connection

from market.errors import MarketError
from market.models import Bid
from market.services import bids as bids_service
from market.services.bids import bid_place
from tenants.budgets import budget_set
from tenants.ledger import balance_get, ledger_verify
from tests.market.marketkit import T0

pytestmark = pytest.mark.django_db(transaction=True)


def _in_thread(work) -> tuple[threading.Thread, list, list]:
    """``work()`` on its own connection; its result or its exception is kept."""
    results: list = []
    failures: list[BaseException] = []

    def run() -> None:
        try:
            results.append(work())
        except BaseException as exc:  # reported by the test
            failures.append(exc)
        finally:
            connection.close()

    thread = threading.Thread(target=run)
    thread.start()
    return thread, results, failures


def _one_gpu(market, member: tuple, *, price: int) -> Bid:
    """A bid of ``member`` (tenant, user) for one a100 GPU at ``price`` milli-credits."""
    tenant, user = member
    return bid_place(
        user=user, tenant=tenant, round=market.round.pk, quantity=1, limits={"a100": price}, now=T0
    )


def test_another_tenants_bid_goes_through_while_a_bid_is_in_flight_in_the_same_round(
    market, team, rival, monkeypatch
):
    # Team's bid stops inside its transaction, at its budget check, holding its locks. Rival's
    # bid in the same round commits meanwhile: the round row is shared, not held by one bid.
    # Under an exclusive round lock it would wait for team's commit. Team has a budget that
    # never refuses, so its bid does stop at a budget check, on either path of bid_place.
    budget_set(tenant=team[0], window="day", mode="soft", cap=10**9, actor=None)
    other = rival[0]
    inside, release = threading.Event(), threading.Event()
    check = bids_service.budget_check

    def paused_check(*, tenant, **kwargs):
        if tenant.pk == team[0].pk:
            inside.set()
            release.wait(timeout=30)
        return check(tenant=tenant, **kwargs)

    monkeypatch.setattr(bids_service, "budget_check", paused_check)
    first, _, first_failed = _in_thread(lambda: _one_gpu(market, team, price=3000))
    try:
        assert inside.wait(timeout=30)
        second, placed, second_failed = _in_thread(lambda: _one_gpu(market, rival, price=2000))
        second.join(timeout=10)
        went_through = not second.is_alive()
    finally:
        release.set()
        first.join(timeout=30)
        second.join(timeout=30)
    assert first_failed == [] and second_failed == []
    assert went_through, "the other tenant's bid waited for the bid in flight"
    assert placed[0].tenant_id == other.pk
    assert Bid.objects.filter(round=market.round).count() == 2
    assert ledger_verify() == []


def test_two_bids_of_one_tenant_at_once_cannot_both_pass_a_budget_with_room_for_one(
    market, team, monkeypatch
):
    # A safe budget of 5 credits, two bids of 3 at once. The first to check its budget waits
    # there for the second to check too (2 s at most): had the second read the budget before
    # the first's hold committed, both would pass. It cannot: it waits on the tenant's
    # accounts, locked before the check, so it reads the first's hold and is refused.
    tenant = team[0]
    budget_set(tenant=tenant, window="day", mode="safe", cap=5_000, actor=None)
    checking = threading.Semaphore(0)
    first_in = threading.Lock()
    check = bids_service.budget_check

    def racing_check(**kwargs):
        checking.release()
        if first_in.acquire(blocking=False):  # the first caller waits for a second one
            if checking.acquire(timeout=2):  # its own release
                checking.acquire(timeout=2)
        return check(**kwargs)

    monkeypatch.setattr(bids_service, "budget_check", racing_check)

    runs = [_in_thread(lambda: _one_gpu(market, team, price=3000)) for _ in range(2)]
    for thread, _, _ in runs:
        thread.join(timeout=30)
    placed = [bid for _, results, _ in runs for bid in results]
    refused = [exc for _, _, failures in runs for exc in failures]
    assert len(placed) == 1, f"both bids passed a budget with room for one: {placed}"
    assert len(refused) == 1 and isinstance(refused[0], MarketError)
    assert "budget would be exceeded" in str(refused[0])
    assert balance_get(tenant=tenant).escrow == 3_000
    assert ledger_verify() == []
