"""Money under hard spend caps: the market never takes a team past a hard cap (bids that
could are left out of the round, with the reason, and lose with their escrow back), and an
allocation a hard cap paused before any work ran on it is refunded in the same transaction
as the pause, charged again only if it resumes under the cap."""

from __future__ import annotations

from datetime import timedelta

import pytest

from audit.models import AuditEvent
from market.models import Allocation, Bid
from market.services.bids import bid_place
from market.services.round_clearing import round_clear
from market.services.settlement import round_settle
from telemetry.services import enforce, node_register, samples_ingest
from tenants.budgets import budget_set, budget_usage
from tenants.ledger import MILLI, balance_get, ledger_verify
from tenants.models import Budget, Transfer
from tests import factories
from tests.market.marketkit import T0, market_make
from tests.telemetry.batches import batch, process

pytestmark = pytest.mark.django_db


def _spent(tenant, at) -> int:
    budget = Budget.objects.get(tenant=tenant, active=True, mode="hard")
    return budget_usage(budget=budget, at=at).spent


def test_the_market_never_takes_a_team_past_its_hard_cap():
    market = market_make(round_minutes=60)
    team = factories.tenant(credits=1_000 * MILLI)
    user = factories.member(tenant=team)
    # A cap of 10 credits a day; three bids that could cost 4 credits each (1 GPU x 4 x 1 h).
    budget_set(tenant=team, window="day", mode="hard", cap=10 * MILLI, actor=None)
    bids = [
        bid_place(
            user=user, tenant=team, round=market.round, quantity=1, limits={"a100": 4000}, now=T0
        )
        for _ in range(3)
    ]
    after = market.after_close()
    rnd = round_clear(round_id=market.round.pk, now=after)
    rnd = round_settle(round_id=rnd.pk, now=after)
    # Two fit under the cap (4 + 4 <= 10); the third is left out, naming the two before it.
    left_out = rnd.diagnostics["left_out_by_hard_cap"]
    assert list(left_out) == [str(bids[2].pk)]
    assert left_out[str(bids[2].pk)] == (
        "the daily hard cap of 10.000 credits has 10.000 left after 0.000 spent; the team's "
        f"bid {bids[0].pk} (up to 4.000), bid {bids[1].pk} (up to 4.000) came first and "
        "hold 8.000 of it, leaving 2.000; this bid may cost up to 4.000, more than 2.000"
    )
    statuses = dict(Bid.objects.filter(round=rnd).values_list("pk", "status"))
    assert statuses[bids[2].pk] == "lost"
    assert {statuses[bids[0].pk], statuses[bids[1].pk]} <= {"won", "lost"}
    assert _spent(team, after) < 10 * MILLI
    assert balance_get(tenant=team).escrow == 0
    assert ledger_verify() == []


def test_a_bid_that_fits_the_room_exactly_is_admitted_beside_one_that_does_not():
    """The issue's Language Group: a daily hard cap of 0.400, nothing spent, an older bid that
    may cost 0.500 and a newer one that may cost 0.400. The newer one fits (at or below the
    room: a charge never exceeds what a bid may cost), wins, and the team ends at most at
    its cap; the older one is left out, and its reason compares like with like."""
    market = market_make(round_minutes=60, reserves={"a100": 100, "h100": 100})
    team = factories.tenant(name="Language Group", credits=10 * MILLI)
    user = factories.member(tenant=team)
    budget_set(tenant=team, window="day", mode="hard", cap=400, actor=None)
    big = bid_place(user=user, tenant=team, round=market.round, quantity=1,
                    limits={"a100": 500}, now=T0)  # fmt: skip
    fits = bid_place(user=user, tenant=team, round=market.round, quantity=1,
                     limits={"a100": 400}, now=T0)  # fmt: skip
    after = market.after_close()
    rnd = round_settle(round_id=round_clear(round_id=market.round.pk, now=after).pk, now=after)

    assert rnd.diagnostics["left_out_by_hard_cap"] == {
        str(big.pk): "the daily hard cap of 0.400 credits has 0.400 left after 0.000 spent; "
        "this bid may cost up to 0.500, more than 0.400"
    }
    big.refresh_from_db()
    fits.refresh_from_db()
    assert (fits.status, big.status) == ("won", "lost")
    assert big.outcome == "hard_cap"
    assert "more than 0.400" in big.outcome_reason
    charged = sum(Allocation.objects.filter(bid=fits).values_list("charge", flat=True))
    assert 0 < charged <= 400
    assert balance_get(tenant=team).escrow == 0
    assert ledger_verify() == []


def test_a_later_bid_names_the_bid_that_took_the_room():
    market = market_make(round_minutes=60, reserves={"a100": 100, "h100": 100})
    team = factories.tenant(credits=10 * MILLI)
    user = factories.member(tenant=team)
    budget_set(tenant=team, window="day", mode="hard", cap=400, actor=None)
    first = bid_place(user=user, tenant=team, round=market.round, quantity=1,
                      limits={"a100": 300}, now=T0)  # fmt: skip
    second = bid_place(user=user, tenant=team, round=market.round, quantity=1,
                       limits={"a100": 200}, now=T0)  # fmt: skip
    third = bid_place(user=user, tenant=team, round=market.round, quantity=1,
                      limits={"a100": 100}, now=T0)  # fmt: skip
    rnd = round_clear(round_id=market.round.pk, now=market.after_close())
    # The second does not fit after the first; the third still does (0.300 + 0.100 = 0.400).
    assert rnd.diagnostics["left_out_by_hard_cap"] == {
        str(second.pk): "the daily hard cap of 0.400 credits has 0.400 left after 0.000 spent; "
        f"the team's bid {first.pk} (up to 0.300) came first and holds 0.300 of it, "
        "leaving 0.100; this bid may cost up to 0.200, more than 0.100"
    }
    assert str(third.pk) not in rnd.diagnostics["left_out_by_hard_cap"]


@pytest.fixture
def node(db):
    market_make()
    from market.models import Tier

    node, _ = node_register(name="n1", tier=Tier.objects.get(slug="a100"), actor="test")
    return node


def _allocation(team, tier, *, starts_at, ends_at, charge):
    """A won allocation with its charge really taken from the team (hold, then charge)."""
    from tenants.ledger import credits_charge, credits_hold
    from tests.telemetry.market_data import allocation_make

    allocation = allocation_make(tenant=team, tier=tier, starts_at=starts_at, ends_at=ends_at)
    Allocation.objects.filter(pk=allocation.pk).update(charge=charge)
    allocation.refresh_from_db()
    credits_hold(tenant=team, amount=charge, actor=None, reason="t", reference="t")
    credits_charge(tenant=team, amount=charge, actor=None, reason="t", reference="t")
    return allocation


def test_an_allocation_a_hard_cap_paused_before_it_ran_is_refunded_and_charged_again_on_resume(
    node,
):
    from django.utils import timezone

    from market.models import Tier

    tier = Tier.objects.get(slug="a100")
    now = timezone.now()
    team = factories.tenant(name="Capped", credits=100 * MILLI)
    unrun = _allocation(
        team, tier, starts_at=now - timedelta(minutes=1), ends_at=now + timedelta(hours=1),
        charge=30 * MILLI,
    )  # fmt: skip
    ran = _allocation(
        team, tier, starts_at=now - timedelta(minutes=1), ends_at=now + timedelta(hours=1),
        charge=20 * MILLI,
    )  # fmt: skip
    samples_ingest(
        node=node, payload=batch(gpus=2, processes={0: [process(77, allocation=ran.pk)]})
    )
    # An admin lowers the cap below what is already spent (50 credits): the team is capped.
    budget_set(tenant=team, window="day", mode="hard", cap=40 * MILLI, actor=None)
    before = balance_get(tenant=team).available

    result = enforce(now=now)

    assert sorted(result.allocations_paused) == sorted([unrun.pk, ran.pk])
    unrun.refresh_from_db()
    ran.refresh_from_db()
    assert (unrun.status, unrun.cap_refund) == ("paused", 30 * MILLI)
    assert (ran.status, ran.cap_refund) == ("paused", 0)  # work ran on it: paid for
    assert unrun.get_status_display() == "Paused (cap)"
    refund = Transfer.objects.get(kind="refund", reference=f"allocation:{unrun.pk}")
    assert refund.amount == 30 * MILLI
    assert balance_get(tenant=team).available == before + 30 * MILLI
    assert _spent(team, now) == 20 * MILLI
    pause = AuditEvent.objects.filter(action="allocation.pause", object_id=str(unrun.pk)).get()
    refunded = AuditEvent.objects.get(action="allocation.cap_refund", object_id=str(unrun.pk))
    assert refunded.seq > pause.seq
    assert ledger_verify() == []

    # Next pass: the refund brought the team back under its cap, so the work that ran
    # resumes; the refunded one stays paused (charging it again would reach the cap), and
    # nothing is refunded twice.
    rerun = enforce(now=now)
    assert rerun.capped_tenants == [] and rerun.allocations_resumed == [ran.pk]
    assert Transfer.objects.filter(kind="refund", reference=f"allocation:{unrun.pk}").count() == 1
    unrun.refresh_from_db()
    assert unrun.status == "paused" and _spent(team, now) == 20 * MILLI

    # The cap is raised: the refunded allocation is charged again, then resumes.
    budget_set(tenant=team, window="day", mode="hard", cap=100 * MILLI, actor=None)
    lifted = enforce(now=now)
    assert lifted.allocations_resumed == [unrun.pk]
    unrun.refresh_from_db()
    assert (unrun.status, unrun.cap_refund) == ("active", 0)
    assert _spent(team, now) == 50 * MILLI < 100 * MILLI
    assert ledger_verify() == []


def test_a_refunded_allocation_that_would_cap_the_team_again_stays_paused(node):
    from django.utils import timezone

    from market.models import Tier

    tier = Tier.objects.get(slug="a100")
    now = timezone.now()
    team = factories.tenant(name="Tight", credits=100 * MILLI)
    unrun = _allocation(
        team, tier, starts_at=now - timedelta(minutes=1), ends_at=now + timedelta(hours=1),
        charge=30 * MILLI,
    )  # fmt: skip
    budget_set(tenant=team, window="day", mode="hard", cap=20 * MILLI, actor=None)
    enforce(now=now)
    unrun.refresh_from_db()
    assert unrun.cap_refund == 30 * MILLI and _spent(team, now) == 0
    # Not capped any more (nothing spent), but charging it again would reach the cap.
    again = enforce(now=now)
    assert again.capped_tenants == [] and again.allocations_resumed == []
    unrun.refresh_from_db()
    assert unrun.status == "paused" and unrun.cap_refund == 30 * MILLI
    assert _spent(team, now) == 0
    assert ledger_verify() == []


def test_the_team_is_told_when_work_pauses_and_the_stale_notice_clears_when_it_resumes(
    node, client
):
    from django.utils import timezone

    from market.models import Tier
    from tenants.models import Notification

    tier = Tier.objects.get(slug="a100")
    now = timezone.now()
    team = factories.tenant(name="Told", credits=100 * MILLI)
    unrun = _allocation(
        team, tier, starts_at=now - timedelta(minutes=1), ends_at=now + timedelta(hours=1),
        charge=30 * MILLI,
    )  # fmt: skip
    budget_set(tenant=team, window="day", mode="hard", cap=20 * MILLI, actor=None)
    enforce(now=now)
    paused = Notification.objects.get(tenant=team, kind="work_paused")
    assert f"#{unrun.pk}" in paused.message and "charge came back" in paused.message
    # The staff overview lists the team while it is capped ... then it no longer is: the
    # refund brought it under the cap.
    client.force_login(factories.admin_user())
    manager = factories.member(tenant=team, role="manager")

    budget_set(tenant=team, window="day", mode="hard", cap=100 * MILLI, actor=None)
    enforce(now=now)
    paused.refresh_from_db()
    assert paused.read_at is not None  # cleared: it no longer holds
    resumed = Notification.objects.get(tenant=team, kind="work_resumed")
    assert f"#{unrun.pk}" in resumed.message
    client.force_login(manager)
    dashboard = client.get("/").content.decode()
    assert "Work resumed" in dashboard and "Work paused" not in dashboard


def test_the_staff_overview_lists_the_teams_at_a_hard_cap(client):
    from tenants.ledger import credits_charge, credits_hold

    team = factories.tenant(name="Over", credits=100 * MILLI)
    calm = factories.tenant(name="Calm", credits=100 * MILLI)
    budget_set(tenant=team, window="day", mode="hard", cap=10 * MILLI, actor=None)
    budget_set(tenant=calm, window="day", mode="hard", cap=50 * MILLI, actor=None)
    credits_hold(tenant=team, amount=10 * MILLI, actor=None, reason="t", reference="t")
    credits_charge(tenant=team, amount=10 * MILLI, actor=None, reason="t", reference="t")
    client.force_login(factories.admin_user())
    page = client.get("/").content.decode()
    section = page.split('id="capped-teams"')[1].split("</ul>")[0]
    assert "Over" in section and "10.000 credits reached" in section and "Calm" not in section


def test_the_staff_overview_names_a_team_the_hard_cap_held_back_before_it_spent_anything(client):
    market = market_make(round_minutes=60, reserves={"a100": 100, "h100": 100})
    team = factories.tenant(name="Language Group", credits=10 * MILLI)
    user = factories.member(tenant=team)
    budget_set(tenant=team, window="day", mode="hard", cap=400, actor=None)
    for limit in (500, 450):
        bid_place(user=user, tenant=team, round=market.round, quantity=1,
                  limits={"a100": limit}, now=T0)  # fmt: skip
    after = market.after_close()
    rnd = round_settle(round_id=round_clear(round_id=market.round.pk, now=after).pk, now=after)

    client.force_login(market.admin)
    page = client.get("/").content.decode()
    assert "No team is at a hard cap" not in page
    assert (
        f"<strong>Language Group</strong>: a hard cap left 2 of its 2 bids out of round {rnd.pk}"
    ) in page
    assert "they held 0.950 credits in escrow); day hard cap 0.400, spent 0.000." in page
