"""Work that survives losing a round: a standing order's work runs on untouched across the
windows its order wins, is suspended (checkpoint signal, grace, stop; never killed) when it
loses, resumes when it wins again, and is stopped only when the order ends or moves."""

from __future__ import annotations

import secrets
from datetime import timedelta

import pytest

from market.models import Allocation, Bid, Order, Round
from market.placement.launch import launch_token
from telemetry.api.views import directive_to_wire
from telemetry.models import EnforcementAction
from telemetry.services import enforce, samples_ingest
from tenants.models import Notification
from tests.telemetry.batches import batch, gpu_uuid, process
from tests.telemetry.market_data import allocation_make

pytestmark = pytest.mark.django_db

A = EnforcementAction.Action


def _window(team, tier, order, *, starts_at, minutes=60, index=0):
    """An allocation of ``order`` for [starts_at, +minutes) placed on n1's GPU ``index``."""
    allocation = allocation_make(
        tenant=team,
        tier=tier,
        gpus=1,
        starts_at=starts_at,
        ends_at=starts_at + timedelta(minutes=minutes),
    )
    Bid.objects.filter(pk=allocation.bid_id).update(order=order)
    allocation.placement = [{"node": "n1", "index": index, "uuid": gpu_uuid("n1", index)}]
    allocation.launch_secret = secrets.token_hex(32)
    allocation.save()
    return Allocation.objects.select_related("bid").get(pk=allocation.pk)


def _report(node, processes, now, results=None):
    samples_ingest(node=node, payload=batch(gpus=4, processes=processes, at=now, results=results))


def _work(allocation, now, *, state="running"):
    """The order's process, started by `gpumarket run` for its first allocation."""
    token = launch_token(
        secret=allocation.launch_secret,
        allocation_id=allocation.pk,
        node="n1",
        uuids=[g["uuid"] for g in allocation.placement],
    )
    return process(100, allocation=allocation.pk, launch_token=token, state=state)


def _ack(action):
    return {"id": action.pk, "outcome": "done", "detail": f"{action.action} carried out"}


def test_work_of_an_order_that_won_the_next_window_on_its_gpus_is_never_signalled(
    node, tier, team, order, now
):
    first = _window(team, tier, order, starts_at=now - timedelta(minutes=70))
    _window(team, tier, order, starts_at=first.ends_at)  # renewed, the same GPU kept
    _report(node, {0: [_work(first, now)]}, now)
    report = enforce(now=now)
    assert report.issued == []
    first.refresh_from_db()
    assert first.status == Allocation.Status.ACTIVE  # not labelled preempted


def test_a_plain_allocations_work_is_still_terminated_at_its_windows_end(node, tier, team, now):
    ended = allocation_make(
        tenant=team,
        tier=tier,
        starts_at=now - timedelta(minutes=70),
        ends_at=now - timedelta(minutes=10),
    )
    _report(node, {0: [process(100, allocation=ended.pk)]}, now)
    assert [a.action for a in enforce(now=now).issued] == [A.TERMINATE]


def test_work_runs_on_while_the_orders_bid_for_the_next_window_is_being_cleared(
    node, tier, team, order, now
):
    first = _window(team, tier, order, starts_at=now - timedelta(minutes=60, seconds=5))
    nxt = Round.objects.create(
        policy=first.round.policy,
        status=Round.Status.CLOSED,
        opens_at=first.starts_at,
        closes_at=first.ends_at,
        starts_at=first.ends_at,
        ends_at=first.ends_at + timedelta(minutes=60),
    )
    Bid.objects.create(
        tenant=team, author=order.author, round=nxt, order=order, quantity=1, escrow=1000
    )
    _report(node, {0: [_work(first, now)]}, now)
    assert enforce(now=now).issued == []


def test_work_of_an_order_that_lost_is_suspended_not_killed_then_resumed_on_a_win(
    node, tier, team, order, now
):
    first = _window(team, tier, order, starts_at=now - timedelta(minutes=70))
    _report(node, {0: [_work(first, now)]}, now)
    report = enforce(now=now)
    assert [a.action for a in report.issued] == [A.SUSPEND]
    suspend = report.issued[0]
    assert suspend.grace_seconds == 30
    assert "did not win this window" in suspend.reason and "resumes when" in suspend.reason
    assert directive_to_wire(suspend)["checkpoint_signal"] == "USR1"
    first.refresh_from_db()
    assert first.status == Allocation.Status.PREEMPTED
    notice = Notification.objects.get(kind="allocation_ended", tenant=team)
    assert "suspended" in notice.message and "not killed" in notice.message
    # The agent carried it out: the process is stopped, and stays so while the order waits.
    later = now + timedelta(seconds=40)
    _report(node, {0: [_work(first, later, state="stopped")]}, later, results=[_ack(suspend)])
    assert enforce(now=later).issued == []
    # The order wins a later window on the same GPU: the same process is resumed.
    won = later + timedelta(seconds=5)
    _window(team, tier, order, starts_at=won - timedelta(seconds=1))
    _report(node, {0: [_work(first, won, state="stopped")]}, won)
    assert [a.action for a in enforce(now=won).issued] == [A.RESUME]


def test_work_of_an_order_that_now_runs_on_other_gpus_is_stopped_here(node, tier, team, order, now):
    first = _window(team, tier, order, starts_at=now - timedelta(minutes=70))
    _window(team, tier, order, starts_at=first.ends_at, index=2)
    _report(node, {0: [_work(first, now)]}, now)
    (action,) = enforce(now=now).issued
    assert action.action == A.TERMINATE
    assert f"gpumarket run --order {order.pk}" in action.reason


@pytest.mark.parametrize("status", [Order.Status.DONE, Order.Status.CANCELLED])
def test_work_of_an_ended_order_is_terminated_at_its_windows_end(
    node, tier, team, order, now, status
):
    Order.objects.filter(pk=order.pk).update(status=status)
    first = _window(team, tier, order, starts_at=now - timedelta(minutes=70))
    _report(node, {0: [_work(first, now)]}, now)
    (action,) = enforce(now=now).issued
    assert action.action == A.TERMINATE and f"order {order.pk} is {status}" in action.reason
