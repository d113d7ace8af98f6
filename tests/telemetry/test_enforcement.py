"""The enforcement loop at service level: each rule, and that a rerun on the same state issues
nothing new. The agent is played by calls to samples_ingest."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from audit.models import AuditEvent
from market.models import Allocation, Bid, Round, Tier
from market.services.bids import bid_place
from market.services.policy import policy_active
from telemetry.models import EnforcementAction
from telemetry.selectors import actions_for_tenant
from telemetry.services import enforce, node_register, samples_ingest
from tenants.budgets import budget_set
from tenants.ledger import MILLI, credits_charge, credits_hold
from tenants.models import Notification
from tests import factories
from tests.telemetry.batches import batch, process
from tests.telemetry.market_data import allocation_make

pytestmark = pytest.mark.django_db

A = EnforcementAction.Action
S = EnforcementAction.State


@pytest.fixture
def node(tier):
    node, _ = node_register(name="n1", tier=tier, actor="test")
    return node


@pytest.fixture
def team():
    return factories.tenant(name="Vision", credits=1_000 * MILLI)


@pytest.fixture
def now():
    return timezone.now()


def report(node, processes, *, results=None, gpus=4, at=None):
    """The agent reports: {gpu index: [process, ...]} plus directive outcomes."""
    return samples_ingest(
        node=node, payload=batch(gpus=gpus, processes=processes, results=results, at=at)
    )


def ack(action, outcome="done"):
    return {"id": action.pk, "outcome": outcome, "detail": f"{action.action} carried out"}


def active(team, tier, now, *, gpus=1, **kwargs):
    return allocation_make(
        tenant=team,
        tier=tier,
        gpus=gpus,
        starts_at=now - timedelta(minutes=10),
        ends_at=now + timedelta(minutes=50),
        **kwargs,
    )


def issued(result):
    return [(a.action, a.pid) for a in result.issued]


def test_untagged_process_is_paused_and_audited(node, now):
    report(node, {0: [process(100)]})
    result = enforce(now=now)

    assert issued(result) == [(A.PAUSE, 100)]
    action = result.issued[0]
    assert "no allocation" in action.reason
    assert action.state == S.ISSUED and action.tenant is None
    event = AuditEvent.objects.get(action="enforcement.pause")
    assert event.object_id == str(action.pk)


def test_tag_naming_no_allocation_is_paused(node, now):
    report(node, {0: [process(100, allocation=999_999)]})
    (action,) = enforce(now=now).issued
    assert action.action == A.PAUSE and "allocation 999999 does not exist" in action.reason


def test_process_of_an_active_allocation_runs(node, team, tier, now):
    allocation = active(team, tier, now, gpus=2)
    report(
        node,
        {0: [process(100, allocation=allocation.pk)], 1: [process(101, allocation=allocation.pk)]},
    )
    assert enforce(now=now).issued == []


def test_allocation_not_started_is_paused_then_resumed_when_it_starts(node, team, tier, now):
    allocation = allocation_make(
        tenant=team,
        tier=tier,
        starts_at=now + timedelta(seconds=30),
        ends_at=now + timedelta(hours=1),
    )
    report(node, {0: [process(100, allocation=allocation.pk)]})
    (pause,) = enforce(now=now).issued
    assert pause.action == A.PAUSE and "starts at" in pause.reason
    assert pause.tenant == team and pause.allocation == allocation

    # The agent stops it and says so.
    report(
        node, {0: [process(100, allocation=allocation.pk, state="stopped")]}, results=[ack(pause)]
    )
    assert enforce(now=now + timedelta(seconds=5)).issued == []

    (resume,) = enforce(now=now + timedelta(seconds=31)).issued
    assert resume.action == A.RESUME and resume.pid == 100
    assert resume.reason.startswith("allowed again")


def test_ended_allocation_is_preempted_with_the_grace_period(node, team, tier, now, settings):
    settings.GPUMARKET_PREEMPT_GRACE_SECONDS = 45
    allocation = allocation_make(
        tenant=team,
        tier=tier,
        starts_at=now - timedelta(hours=1),
        ends_at=now - timedelta(seconds=1),
    )
    report(node, {0: [process(100, allocation=allocation.pk)]})
    (action,) = enforce(now=now).issued
    assert action.action == A.TERMINATE
    assert action.grace_seconds == 45
    assert "ended at" in action.reason
    assert enforce(now=now).issued == []  # a terminate in flight is not sent twice


def test_revoked_allocation_is_preempted(node, team, tier, now):
    allocation = active(team, tier, now, status=Allocation.Status.REVOKED)
    report(node, {0: [process(100, allocation=allocation.pk)]})
    (action,) = enforce(now=now).issued
    assert action.action == A.TERMINATE and "revoked" in action.reason


def test_work_beyond_the_allocations_gpu_count_is_paused(node, team, tier, now):
    allocation = active(team, tier, now, gpus=2)
    tag = allocation.pk
    report(
        node,
        {
            0: [process(100, allocation=tag)],
            1: [process(101, allocation=tag), process(102, allocation=tag)],
            2: [process(103, allocation=tag)],
            3: [process(104, allocation=tag)],
        },
    )
    result = enforce(now=now)
    assert sorted(issued(result)) == [(A.PAUSE, 103), (A.PAUSE, 104)]
    assert all("won 2 GPU(s)" in a.reason for a in result.issued)
    assert enforce(now=now).issued == []


def test_gpu_count_keeps_the_gpus_already_running(node, team, tier, now):
    allocation = active(team, tier, now, gpus=1)
    tag = allocation.pk
    # GPU 0's process was stopped by its owner; GPU 1's runs: GPU 1 keeps the allocation.
    report(
        node,
        {0: [process(100, allocation=tag, state="stopped")], 1: [process(101, allocation=tag)]},
    )
    assert enforce(now=now).issued == []


def test_gpu_of_another_tier_is_paused(node, team, now):
    other = Tier.objects.create(slug="h100", name="H100")
    allocation = active(team, other, now)
    report(node, {0: [process(100, allocation=allocation.pk)]})
    (action,) = enforce(now=now).issued
    assert action.action == A.PAUSE and "tier h100" in action.reason


def _spend(team, amount):
    credits_hold(tenant=team, amount=amount, actor=None, reason="test", reference="test")
    credits_charge(tenant=team, amount=amount, actor=None, reason="test", reference="test")


def test_hard_cap_pauses_the_tenants_work_and_raising_it_resumes(node, team, tier, now):
    other_team = factories.tenant(name="Speech")
    mine, theirs = active(team, tier, now, gpus=2), active(other_team, tier, now)
    budget_set(tenant=team, window="day", mode="hard", cap=100 * MILLI, actor=None)
    _spend(team, 100 * MILLI)
    tags = {0: [process(100, allocation=mine.pk)], 1: [process(101, allocation=mine.pk)]}
    tags[2] = [process(200, allocation=theirs.pk)]
    report(node, tags)

    result = enforce(now=now)
    assert sorted(issued(result)) == [(A.PAUSE, 100), (A.PAUSE, 101)]
    assert result.capped_tenants == [team.pk]
    assert all("hard cap of 100.000 credits" in a.reason for a in result.issued)
    assert Notification.objects.filter(tenant=team, kind="budget", level="critical").exists()
    assert enforce(now=now).issued == []

    stopped = {
        0: [process(100, allocation=mine.pk, state="stopped")],
        1: [process(101, allocation=mine.pk, state="stopped")],
        2: [process(200, allocation=theirs.pk)],
    }
    report(node, stopped, results=[ack(a) for a in result.issued])
    assert enforce(now=now).issued == []

    budget_set(tenant=team, window="day", mode="hard", cap=500 * MILLI, actor=None)
    result = enforce(now=now)
    assert sorted(issued(result)) == [(A.RESUME, 100), (A.RESUME, 101)]
    assert enforce(now=now).issued == []
    # Both steps are the tenant's to see, and no one else's.
    assert [a.action for a in actions_for_tenant(tenant=team)] == [A.RESUME] * 2 + [A.PAUSE] * 2
    assert not actions_for_tenant(tenant=other_team).exists()


def test_hard_cap_cancels_open_bids(node, team, tier, now):
    rnd = Round.objects.create(
        policy=policy_active(),
        status=Round.Status.OPEN,
        opens_at=now - timedelta(minutes=5),
        closes_at=now + timedelta(minutes=30),
        starts_at=now + timedelta(hours=1),
        ends_at=now + timedelta(hours=2),
    )
    user = factories.member(tenant=team)
    bid = bid_place(
        user=user, tenant=team, round=rnd, quantity=1, limits={tier.slug: 10 * MILLI}, now=now
    )
    budget_set(tenant=team, window="day", mode="hard", cap=50 * MILLI, actor=None)
    _spend(team, 50 * MILLI)

    result = enforce(now=now)
    assert result.bids_cancelled == 1
    bid.refresh_from_db()
    assert bid.status == Bid.Status.CANCELLED and bid.escrow == 0


def test_soft_budget_alerts_are_raised_by_the_loop(node, team, now):
    budget_set(tenant=team, window="day", mode="soft", cap=100 * MILLI, actor=None)
    _spend(team, 85 * MILLI)
    enforce(now=now)
    enforce(now=now)
    messages = sorted(
        Notification.objects.filter(tenant=team, kind="budget").values_list("message", flat=True)
    )
    assert messages == ["Day budget passed 80% (85% now): spent 85.000 of 100.000"]
    assert not EnforcementAction.objects.exists()


def test_rerun_issues_nothing_new_through_delivery_and_acknowledgement(node, now):
    report(node, {0: [process(100)], 1: [process(101)]})
    first = enforce(now=now)
    assert len(first.issued) == 2
    assert enforce(now=now).issued == []

    # Delivered with the next response; the processes still show running (not yet applied).
    delivered = report(node, {0: [process(100)], 1: [process(101)]})
    assert [d.pk for d in delivered.directives] == [a.pk for a in first.issued]
    assert set(EnforcementAction.objects.values_list("state", flat=True)) == {S.DELIVERED}
    assert enforce(now=now).issued == []

    report(
        node,
        {0: [process(100, state="stopped")], 1: [process(101, state="stopped")]},
        results=[ack(a) for a in first.issued],
    )
    assert set(EnforcementAction.objects.values_list("state", flat=True)) == {S.ACKNOWLEDGED}
    assert AuditEvent.objects.filter(action="enforcement.acknowledged").count() == 2
    assert enforce(now=now).issued == []
    assert EnforcementAction.objects.count() == 2


def test_repeated_outcome_changes_nothing(node, now):
    report(node, {0: [process(100)]})
    (action,) = enforce(now=now).issued
    report(node, {0: [process(100, state="stopped")]}, results=[ack(action)])
    report(node, {0: [process(100, state="stopped")]}, results=[ack(action, "failed")])
    action.refresh_from_db()
    assert action.state == S.ACKNOWLEDGED
    assert AuditEvent.objects.filter(action__startswith="enforcement.").count() == 2


def test_process_resumed_behind_the_loops_back_is_paused_again(node, now):
    report(node, {0: [process(100)]})
    (pause,) = enforce(now=now).issued
    report(node, {0: [process(100, state="stopped")]}, results=[ack(pause)])
    report(node, {0: [process(100, state="running")]})  # someone sent SIGCONT
    (again,) = enforce(now=now).issued
    assert again.action == A.PAUSE and again.pk != pause.pk


def test_process_stopped_by_its_owner_is_not_resumed(node, team, tier, now):
    allocation = active(team, tier, now)
    report(node, {0: [process(100, allocation=allocation.pk, state="stopped")]})
    assert enforce(now=now).issued == []


def test_failed_directive_is_retried_only_after_the_retry_interval(node, now, settings):
    settings.GPUMARKET_ENFORCE_RETRY_SECONDS = 60
    report(node, {0: [process(100)]})
    (pause,) = enforce(now=now).issued
    report(node, {0: [process(100)]}, results=[ack(pause, "failed")])
    pause.refresh_from_db()
    assert pause.state == S.FAILED
    assert enforce(now=pause.acknowledged_at + timedelta(seconds=30)).issued == []
    (retry,) = enforce(now=pause.acknowledged_at + timedelta(seconds=61)).issued
    assert retry.action == A.PAUSE


def test_pending_pause_is_followed_by_a_resume_when_allowed_again(node, team, tier, now):
    """The cap lifts before the agent even saw the pause: both go out, in order."""
    allocation = active(team, tier, now)
    budget = budget_set(tenant=team, window="day", mode="hard", cap=10 * MILLI, actor=None)
    _spend(team, 10 * MILLI)
    report(node, {0: [process(100, allocation=allocation.pk)]})
    (pause,) = enforce(now=now).issued
    budget_set(tenant=team, window="day", mode="hard", cap=budget.cap * 10, actor=None)
    (resume,) = enforce(now=now).issued
    assert resume.action == A.RESUME
    response = report(node, {0: [process(100, allocation=allocation.pk)]})
    assert [(d.action, d.pk) for d in response.directives] == [
        (A.PAUSE, pause.pk),
        (A.RESUME, resume.pk),
    ]


def test_stale_node_is_not_enforced(node, now, settings):
    report(node, {0: [process(100)]})
    later = now + timedelta(seconds=settings.GPUMARKET_NODE_STALE_SECONDS + 5)
    assert enforce(now=later).issued == []


def test_revoked_nodes_work_is_not_enforced(node, now):
    from telemetry.services import node_token_revoke

    report(node, {0: [process(100)]})
    node_token_revoke(node=node, actor="test")
    assert enforce(now=now).issued == []


# Allocation status follows what the loop does: paused under a hard cap, active again when it
# lifts, preempted when an ended window's work is terminated. The directives stay as above.


def statuses(*allocations):
    return [Allocation.objects.get(pk=a.pk).status for a in allocations]


def status_events(verb):
    return AuditEvent.objects.filter(action=f"allocation.{verb}").order_by("seq")


def test_hard_cap_pauses_the_tenants_allocations_and_raising_it_makes_them_active(
    node, team, tier, now
):
    other_team = factories.tenant(name="Speech")
    mine = active(team, tier, now, gpus=2)
    idle = active(team, tier, now)  # no work observed on it: paused all the same
    later = allocation_make(  # not started yet: left alone until it starts
        tenant=team, tier=tier, starts_at=now + timedelta(hours=1), ends_at=now + timedelta(hours=2)
    )
    theirs = active(other_team, tier, now)
    budget_set(tenant=team, window="day", mode="hard", cap=100 * MILLI, actor=None)
    # Well over the cap: refunding the idle allocation (1 credit) keeps the team capped.
    _spend(team, 105 * MILLI)
    report(node, {0: [process(100, allocation=mine.pk)], 1: [process(200, allocation=theirs.pk)]})

    result = enforce(now=now)
    assert issued(result) == [(A.PAUSE, 100)]
    assert result.allocations_paused == [mine.pk, idle.pk]
    # No work was ever seen on `idle`: its charge came back with the pause; `mine` ran.
    assert [Allocation.objects.get(pk=a.pk).cap_refund for a in (mine, idle)] == [0, idle.charge]
    assert statuses(mine, idle, later, theirs) == ["paused", "paused", "active", "active"]
    paused = list(status_events("pause"))
    assert [(e.actor_label, e.tenant_id) for e in paused] == [("enforcer", team.pk)] * 2
    assert "hard cap of 100.000 credits" in paused[0].after["reason"]

    # Rerun: nothing issued, nothing changed, nothing recorded.
    events = AuditEvent.objects.count()
    rerun = enforce(now=now)
    assert rerun.issued == [] and rerun.allocations_paused == []
    assert AuditEvent.objects.count() == events

    # New work on the paused allocation is paused for the cap, as before the status followed.
    report(
        node,
        {
            0: [process(100, allocation=mine.pk, state="stopped")],
            2: [process(101, allocation=mine.pk)],
        },
        results=[ack(a) for a in result.issued],
    )
    (pause,) = enforce(now=now).issued
    assert pause.pid == 101 and "hard cap of 100.000 credits" in pause.reason

    budget_set(tenant=team, window="day", mode="hard", cap=500 * MILLI, actor=None)
    lifted = enforce(now=now)
    assert sorted(issued(lifted)) == [(A.RESUME, 100), (A.RESUME, 101)]
    assert lifted.allocations_resumed == [mine.pk, idle.pk]
    assert statuses(mine, idle, later, theirs) == ["active"] * 4
    assert [e.actor_label for e in status_events("resume")] == ["enforcer"] * 2
    events = AuditEvent.objects.count()
    assert enforce(now=now).allocations_resumed == []
    assert AuditEvent.objects.count() == events


def test_allocations_paused_for_a_cap_are_active_again_when_the_window_rolls_over(
    node, team, tier, now
):
    allocation = allocation_make(
        tenant=team,
        tier=tier,
        starts_at=now - timedelta(minutes=10),
        ends_at=now + timedelta(days=3),
    )
    budget_set(tenant=team, window="day", mode="hard", cap=10 * MILLI, actor=None)
    _spend(team, 10 * MILLI)
    assert enforce(now=now).allocations_paused == [allocation.pk]
    assert statuses(allocation) == ["paused"]

    tomorrow = enforce(now=now + timedelta(days=1))
    assert tomorrow.capped_tenants == [] and tomorrow.allocations_resumed == [allocation.pk]
    assert statuses(allocation) == ["active"]


def test_an_allocation_paused_by_someone_else_is_not_resumed_by_the_loop(node, team, tier, now):
    from market.services.allocations import allocations_pause

    allocation = active(team, tier, now)
    admin = factories.admin_user()
    allocations_pause(
        allocation_ids=[allocation.pk], reason="fault on the rack", actor=admin, now=now
    )
    report(node, {0: [process(100, allocation=allocation.pk)]})

    result = enforce(now=now)
    assert result.allocations_resumed == []
    assert statuses(allocation) == ["paused"]
    (action,) = result.issued
    assert action.action == A.PAUSE and f"allocation {allocation.pk} is paused" in action.reason


def test_work_running_past_the_windows_end_makes_the_allocation_preempted(
    node, team, tier, now, settings
):
    settings.GPUMARKET_PREEMPT_GRACE_SECONDS = 45
    ended = allocation_make(
        tenant=team,
        tier=tier,
        starts_at=now - timedelta(hours=1),
        ends_at=now - timedelta(seconds=1),
    )
    quiet = allocation_make(  # ended too, but no work of it is running: round_finish's to finish
        tenant=team,
        tier=tier,
        starts_at=now - timedelta(hours=1),
        ends_at=now - timedelta(seconds=1),
    )
    report(node, {0: [process(100, allocation=ended.pk)]})

    result = enforce(now=now)
    (action,) = result.issued
    assert action.action == A.TERMINATE and "ended at" in action.reason  # as before
    assert result.allocations_preempted == [ended.pk]
    assert statuses(ended, quiet) == ["preempted", "active"]
    (event,) = status_events("preempt")
    assert event.actor_label == "enforcer" and event.tenant_id == team.pk
    assert "45s grace" in event.after["reason"]

    events = AuditEvent.objects.count()
    rerun = enforce(now=now)
    assert rerun.issued == [] and rerun.allocations_preempted == []
    assert AuditEvent.objects.count() == events

    # The market's clock finishes the round afterwards: preempted stays preempted.
    from market.services.rounds import round_finish

    round_finish(round_id=ended.round_id, now=now)
    assert statuses(ended, quiet) == ["preempted", "finished"]


def test_allocation_paused_for_a_cap_when_its_window_ends_is_preempted(node, team, tier, now):
    allocation = allocation_make(
        tenant=team,
        tier=tier,
        starts_at=now - timedelta(hours=1),
        ends_at=now + timedelta(seconds=30),
    )
    budget_set(tenant=team, window="day", mode="hard", cap=10 * MILLI, actor=None)
    _spend(team, 10 * MILLI)
    report(node, {0: [process(100, allocation=allocation.pk)]})
    (pause,) = enforce(now=now).issued
    assert statuses(allocation) == ["paused"]

    at_end = now + timedelta(seconds=30)
    report(
        node, {0: [process(100, allocation=allocation.pk, state="stopped")]}, results=[ack(pause)]
    )
    result = enforce(now=at_end)
    assert issued(result) == [(A.TERMINATE, 100)]
    assert result.allocations_preempted == [allocation.pk]
    assert statuses(allocation) == ["preempted"]


def test_allocation_the_round_already_finished_stays_finished(node, team, tier, now):
    from market.services.rounds import round_finish

    allocation = allocation_make(
        tenant=team,
        tier=tier,
        starts_at=now - timedelta(hours=1),
        ends_at=now - timedelta(seconds=1),
    )
    round_finish(round_id=allocation.round_id, now=now)
    report(node, {0: [process(100, allocation=allocation.pk)]})

    result = enforce(now=now)
    (action,) = result.issued
    assert action.action == A.TERMINATE and "was finished" in action.reason
    assert result.allocations_preempted == []
    assert statuses(allocation) == ["finished"]


def test_the_team_is_told_when_work_is_stopped_at_the_windows_end_and_reads_ended_not_preempted(
    node, team, tier, now, client
):
    from django.utils.html import escape

    from market.services.rounds import round_finish

    stopped = allocation_make(
        tenant=team,
        tier=tier,
        starts_at=now - timedelta(hours=1),
        ends_at=now - timedelta(seconds=1),
    )
    quiet = allocation_make(
        tenant=team,
        tier=tier,
        starts_at=now - timedelta(hours=1),
        ends_at=now - timedelta(seconds=1),
    )
    report(node, {0: [process(100, allocation=stopped.pk)]})
    enforce(now=now)
    round_finish(round_id=quiet.round_id, now=now)

    (notice,) = Notification.objects.filter(tenant=team, kind="allocation_ended")
    assert f"Work still running on allocation(s) #{stopped.pk} was stopped" in notice.message
    client.force_login(factories.member(tenant=team))
    page = client.get("/").content.decode()
    assert f"allocation(s) #{stopped.pk} was stopped" in page  # on the dashboard
    listing = client.get("/fleet/allocations/").content.decode()
    assert '<td class="status-preempted">Ended (work stopped)</td>' in listing
    assert '<td class="status-finished">Ended</td>' in listing
    assert "Preempted" not in listing
    # Its page says why: the stop directive with its reason.
    (action,) = EnforcementAction.objects.filter(allocation=stopped)
    detail = client.get(f"/fleet/allocations/{stopped.pk}/").content.decode()
    assert "Ended (work stopped)" in detail and escape(action.reason) in detail
    # A window's normal end is named so, not "Terminate (preempt)", here and for staff.
    assert "<td>Stop at window end</td>" in detail and "preempt)" not in detail
    client.force_login(factories.admin_user())
    staff_page = client.get("/fleet/enforcement/").content.decode()
    assert "<td>Stop at window end</td>" in staff_page and "Terminate" not in staff_page
