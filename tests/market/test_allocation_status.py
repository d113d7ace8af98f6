"""Allocation status services: pause, resume, preempt. Each legal transition, each refusal
(nothing written), reruns that change and record nothing, and how round_finish and round_void
treat the result."""

from __future__ import annotations

from datetime import timedelta

import pytest

from audit.models import AuditEvent
from market.errors import MarketError
from market.models import Allocation, Round
from market.services.allocations import allocations_pause, allocations_preempt, allocations_resume
from market.services.bids import bid_place
from market.services.rounds import round_finish
from market.services.tick import rounds_tick
from market.services.void import round_void
from tests.market.marketkit import T0

pytestmark = pytest.mark.django_db

ACTIVE, PAUSED = Allocation.Status.ACTIVE, Allocation.Status.PAUSED
PREEMPTED, FINISHED = Allocation.Status.PREEMPTED, Allocation.Status.FINISHED
REVOKED = Allocation.Status.REVOKED


@pytest.fixture
def allocations(market, team, rival) -> list[Allocation]:
    """Two active allocations (one per tenant) in the round settled for 10:00-11:00."""
    for tenant, user in (team, rival):
        bid_place(
            user=user, tenant=tenant, round=market.round, quantity=1, limits={"a100": 2000}, now=T0
        )
    rounds_tick(now=market.after_close())
    found = list(Allocation.objects.filter(round=market.round).order_by("pk"))
    assert [a.status for a in found] == [ACTIVE, ACTIVE]
    return found


@pytest.fixture
def during(market):
    return market.round.starts_at + timedelta(minutes=30)


@pytest.fixture
def after(market):
    return market.round.ends_at + timedelta(seconds=1)


def statuses(allocations):
    return [Allocation.objects.get(pk=a.pk).status for a in allocations]


def events(verb):
    return AuditEvent.objects.filter(action=f"allocation.{verb}").order_by("seq")


def ids(allocations):
    return [a.pk for a in allocations]


def test_pause_makes_active_allocations_paused_and_audits_the_reason(allocations, during):
    changed = allocations_pause(
        allocation_ids=ids(allocations), reason="hard cap reached", actor="enforcer", now=during
    )
    assert ids(changed) == ids(allocations)
    assert statuses(allocations) == [PAUSED, PAUSED]
    recorded = list(events("pause"))
    assert [e.object_id for e in recorded] == [str(a.pk) for a in allocations]
    assert [e.tenant_id for e in recorded] == [a.tenant_id for a in allocations]
    assert recorded[0].actor_label == "enforcer"
    assert recorded[0].before == {"status": "active"}
    assert recorded[0].after["status"] == "paused"
    assert recorded[0].after["reason"] == "hard cap reached"


def test_pause_rerun_changes_and_records_nothing(allocations, during):
    allocations_pause(allocation_ids=ids(allocations), reason="cap", actor="enforcer", now=during)
    count = AuditEvent.objects.count()
    assert (
        allocations_pause(allocation_ids=ids(allocations), reason="cap", actor="x", now=during)
        == []
    )
    assert AuditEvent.objects.count() == count
    assert statuses(allocations) == [PAUSED, PAUSED]


def test_resume_makes_paused_allocations_active_once(allocations, during):
    first, second = allocations
    allocations_pause(allocation_ids=[first.pk], reason="cap", actor="enforcer", now=during)
    # One paused, one already active: only the paused one changes and is audited.
    changed = allocations_resume(
        allocation_ids=[first.pk, second.pk], reason="cap raised", actor="enforcer", now=during
    )
    assert ids(changed) == [first.pk]
    assert statuses(allocations) == [ACTIVE, ACTIVE]
    assert [e.object_id for e in events("resume")] == [str(first.pk)]
    count = AuditEvent.objects.count()
    assert (
        allocations_resume(allocation_ids=[first.pk], reason="again", actor="x", now=during) == []
    )
    assert AuditEvent.objects.count() == count


def test_preempt_at_the_windows_end_from_active_and_from_paused(allocations, during, market):
    first, second = allocations
    allocations_pause(allocation_ids=[second.pk], reason="cap", actor="enforcer", now=during)
    changed = allocations_preempt(
        allocation_ids=ids(allocations),
        reason="window ended with work running",
        actor="enforcer",
        now=market.round.ends_at,  # at the end exactly: the window is [starts_at, ends_at)
    )
    assert ids(changed) == ids(allocations)
    assert statuses(allocations) == [PREEMPTED, PREEMPTED]
    assert [e.before for e in events("preempt")] == [{"status": "active"}, {"status": "paused"}]
    count = AuditEvent.objects.count()
    assert allocations_preempt(allocation_ids=ids(allocations), reason="r", actor="x") == []
    assert AuditEvent.objects.count() == count


def test_preempt_before_the_window_ends_is_refused(allocations, market):
    with pytest.raises(MarketError, match=r"runs until .*preempted only once its window has ended"):
        allocations_preempt(
            allocation_ids=[allocations[0].pk],
            reason="r",
            actor="x",
            now=market.round.ends_at - timedelta(seconds=1),
        )
    assert statuses(allocations) == [ACTIVE, ACTIVE]
    assert not events("preempt").exists()


@pytest.mark.parametrize("service", [allocations_pause, allocations_resume])
def test_pause_or_resume_after_the_window_ended_is_refused(allocations, after, during, service):
    if service is allocations_resume:
        allocations_pause(allocation_ids=ids(allocations), reason="cap", actor="x", now=during)
    before = statuses(allocations)
    with pytest.raises(MarketError, match=r"ended at .*preempted or finished"):
        service(allocation_ids=ids(allocations), reason="r", actor="x", now=after)
    assert statuses(allocations) == before


@pytest.mark.parametrize("final", [PREEMPTED, FINISHED, REVOKED])
@pytest.mark.parametrize("service", [allocations_pause, allocations_resume])
def test_a_final_status_is_never_paused_or_resumed(allocations, during, final, service):
    Allocation.objects.filter(pk=allocations[1].pk).update(status=final)
    count = AuditEvent.objects.count()
    with pytest.raises(MarketError, match=rf"allocation {allocations[1].pk} is {final}; only"):
        # The first allocation is legal to pause; the call is refused whole.
        service(allocation_ids=ids(allocations), reason="r", actor="x", now=during)
    assert statuses(allocations) == [ACTIVE, final]
    assert AuditEvent.objects.count() == count


@pytest.mark.parametrize("final", [FINISHED, REVOKED])
def test_finished_or_revoked_is_never_preempted(allocations, after, final):
    Allocation.objects.filter(pk=allocations[0].pk).update(status=final)
    with pytest.raises(
        MarketError, match=rf"is {final}; only active or paused allocations can be preempted"
    ):
        allocations_preempt(allocation_ids=ids(allocations), reason="r", actor="x", now=after)
    assert statuses(allocations) == [final, ACTIVE]


def test_unknown_ids_empty_reason_and_bad_ids_are_refused(allocations, during):
    with pytest.raises(MarketError, match="no allocation 999999; check the ids"):
        allocations_pause(
            allocation_ids=[allocations[0].pk, 999_999], reason="r", actor="x", now=during
        )
    with pytest.raises(MarketError, match="say why"):
        allocations_pause(allocation_ids=ids(allocations), reason="  ", actor="x", now=during)
    with pytest.raises(MarketError, match="whole numbers"):
        allocations_pause(allocation_ids=["1"], reason="r", actor="x", now=during)
    assert statuses(allocations) == [ACTIVE, ACTIVE]
    assert allocations_pause(allocation_ids=[], reason="r", actor="x", now=during) == []


def test_round_finish_keeps_preempted_and_finishes_paused(allocations, during, after, market):
    first, second = allocations
    allocations_pause(allocation_ids=[second.pk], reason="cap", actor="enforcer", now=during)
    allocations_preempt(
        allocation_ids=[first.pk], reason="work ran on", actor="enforcer", now=after
    )
    round_finish(round_id=market.round.pk, now=after)
    assert statuses(allocations) == [PREEMPTED, FINISHED]
    market.round.refresh_from_db()
    assert market.round.status == Round.Status.FINISHED
    # After round_finish, finished is final: the enforcement loop cannot relabel it.
    with pytest.raises(MarketError, match="is finished"):
        allocations_preempt(allocation_ids=[second.pk], reason="late", actor="enforcer", now=after)


def test_voiding_the_round_revokes_a_preempted_allocation(allocations, after, market):
    allocations_preempt(allocation_ids=ids(allocations), reason="r", actor="enforcer", now=after)
    round_void(round=market.round, actor=market.admin, reason="meter fault", now=after)
    assert statuses(allocations) == [REVOKED, REVOKED]
