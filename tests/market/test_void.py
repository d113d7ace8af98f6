"""Voiding a settled round: charges refunded through the ledger, allocations revoked, bids
refunded, tenants told, the enforcement loop stops the work, the ledger stays clean."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta

import pytest
from django.conf import settings
from django.utils import timezone

from audit.models import AuditEvent
from market.errors import MarketError
from market.models import Allocation, Bid, Round
from market.services.bids import bid_place
from market.services.tick import rounds_tick
from market.services.void import round_void
from telemetry.models import EnforcementAction
from telemetry.services import node_register, samples_ingest
from telemetry.services.enforcement import enforce
from tenants.ledger import balance_get, ledger_verify
from tenants.models import Notification, Transfer
from tests import factories
from tests.market.marketkit import market_make
from tests.telemetry.batches import batch, process

pytestmark = pytest.mark.django_db

CREDITS = 10_000_000


@pytest.fixture
def teams(db):
    return [
        (t, factories.member(tenant=t))
        for t in (factories.tenant(name=f"Lab {i}", credits=CREDITS) for i in range(3))
    ]


def settle(market, bids):
    """Place ``bids`` [(team, quantity, limits)] in the open round and settle it."""
    rnd = market.round
    placed = [
        bid_place(user=user, tenant=tenant, round=rnd, quantity=q, limits=limits, now=rnd.opens_at)
        for (tenant, user), q, limits in bids
    ]
    rounds_tick(now=rnd.closes_at + timedelta(seconds=1))
    rnd.refresh_from_db()
    assert rnd.status == Round.Status.SETTLED
    return rnd, placed


def test_void_refunds_every_charge_and_revokes_every_allocation(teams):
    market = market_make()
    a, b, c = teams
    # a100 has 4 GPUs: a and b win 2 each at the uniform price; c's bid is below the reserve
    # of h100 and loses.
    rnd, (bid_a, bid_b, bid_c) = settle(
        market,
        [(a, 2, {"a100": 3_000}), (b, 2, {"a100": 4_000}), (c, 1, {"h100": 1_500})],
    )
    charged = {t.pk: rnd.allocations.filter(tenant=t).first().charge for t, _ in (a, b)}
    assert all(charged.values()) and rnd.revenue == sum(charged.values())
    assert balance_get(tenant=a[0]).available == CREDITS - charged[a[0].pk]

    voided = round_void(round=rnd, actor=market.admin, reason="nodes in rack 3 lost power")

    assert voided.status == Round.Status.VOIDED
    assert voided.failure_reason == "voided: nodes in rack 3 lost power"
    for tenant, _ in teams:
        assert balance_get(tenant=tenant).available == CREDITS
        assert balance_get(tenant=tenant).escrow == 0
    assert set(rnd.allocations.values_list("status", flat=True)) == {Allocation.Status.REVOKED}
    statuses = dict(Bid.objects.filter(round=rnd).values_list("pk", "status"))
    assert statuses == {bid_a.pk: "refunded", bid_b.pk: "refunded", bid_c.pk: "lost"}
    refunds = Transfer.objects.filter(kind=Transfer.Kind.REFUND)
    assert sorted(refunds.values_list("reference", "amount")) == sorted(
        [(f"bid:{bid_a.pk}", charged[a[0].pk]), (f"bid:{bid_b.pk}", charged[b[0].pk])]
    )
    assert ledger_verify() == []

    event = AuditEvent.objects.get(action="round.void")
    assert event.actor_label == market.admin.username
    assert event.after["refunded"] == rnd.revenue
    assert event.after["reason"] == "nodes in rack 3 lost power"
    assert len(event.after["allocations_revoked"]) == 2
    notices = Notification.objects.filter(kind="round_voided")
    assert set(notices.values_list("tenant_id", flat=True)) == {None, a[0].pk, b[0].pk}
    assert "rack 3" in notices.get(tenant=a[0]).message


def test_void_twice_refunds_once(teams):
    market = market_make()
    rnd, _ = settle(market, [(teams[0], 2, {"a100": 3_000})])
    round_void(round=rnd, actor=market.admin, reason="test")
    again = round_void(round=rnd, actor=market.admin, reason="test again")
    assert again.status == Round.Status.VOIDED
    assert Transfer.objects.filter(kind=Transfer.Kind.REFUND).count() == 1
    assert AuditEvent.objects.filter(action="round.void").count() == 1
    assert balance_get(tenant=teams[0][0]).available == CREDITS
    assert ledger_verify() == []


def test_only_a_settled_round_can_be_voided(teams):
    market = market_make()
    with pytest.raises(MarketError, match="only a settled or finished round"):
        round_void(round=market.round, actor=market.admin, reason="why not")
    rnd, _ = settle(market, [(teams[0], 1, {"a100": 3_000})])
    with pytest.raises(MarketError, match="say why"):
        round_void(round=rnd, actor=market.admin, reason="  ")
    assert Round.objects.get(pk=rnd.pk).status == Round.Status.SETTLED


def test_a_finished_round_can_be_voided(teams):
    market = market_make()
    rnd, _ = settle(market, [(teams[0], 1, {"a100": 3_000})])
    grace = timedelta(seconds=settings.GPUMARKET_PREEMPT_GRACE_SECONDS)
    rounds_tick(now=rnd.ends_at + grace + timedelta(seconds=1))
    rnd.refresh_from_db()
    assert rnd.status == Round.Status.FINISHED
    round_void(round=rnd, actor=market.admin, reason="billing error")
    assert set(rnd.allocations.values_list("status", flat=True)) == {Allocation.Status.REVOKED}
    assert balance_get(tenant=teams[0][0]).available == CREDITS


def test_void_asks_for_an_enforcement_pass_after_commit(
    teams, django_capture_on_commit_callbacks, monkeypatch
):
    market = market_make()
    rnd, _ = settle(market, [(teams[0], 1, {"a100": 3_000})])
    sent = []
    monkeypatch.setattr("config.celery.app.send_task", lambda name, *a, **k: sent.append(name))
    with django_capture_on_commit_callbacks(execute=True):
        round_void(round=rnd, actor=market.admin, reason="test")
    assert sent == ["telemetry.enforce"]


def test_enforcement_stops_work_on_a_voided_round(teams):
    """End to end with telemetry: a process running on the allocation is terminated by the
    enforcement pass after the void (before it, the same pass lets it run)."""
    # A window in the past, and the enforcement pass run at a moment inside it: the agent's
    # samples (stamped with the real clock, later still) count as fresh.
    start = timezone.now().replace(minute=0, second=0, microsecond=0) - timedelta(days=1)
    market = market_make(now=start - timedelta(minutes=30))
    assert market.round.starts_at == start
    inside = start + timedelta(minutes=30)
    tenant, user = teams[0]
    bid_place(
        user=user,
        tenant=tenant,
        round=market.round,
        quantity=1,
        limits={"a100": 3_000},
        now=market.round.opens_at,
    )
    rounds_tick(now=market.round.closes_at + timedelta(seconds=1))
    allocation = Allocation.objects.get(round=market.round)
    node, _token = node_register(name="n1", tier=market.a100, actor="test")
    samples_ingest(
        node=node, payload=batch(gpus=1, processes={0: [process(4242, allocation=allocation.pk)]})
    )
    assert [a for a in enforce(now=inside).issued if a.pid == 4242] == []

    round_void(round=market.round, actor=market.admin, reason="test")
    issued = [a for a in enforce(now=inside + timedelta(seconds=5)).issued if a.pid == 4242]
    assert [a.action for a in issued] == [EnforcementAction.Action.TERMINATE]
    assert "revoked" in issued[0].reason
    assert ledger_verify() == []


def test_void_a_round_from_a_fixed_past_date_leaves_other_rounds_alone(teams):
    market = market_make(now=datetime(2030, 2, 1, 8, 10, tzinfo=UTC))
    first, _ = settle(market, [(teams[0], 1, {"a100": 3_000})])
    market.round = Round.objects.get(status=Round.Status.OPEN)
    second, _ = settle(market, [(teams[1], 1, {"a100": 3_000})])
    round_void(round=first, actor=market.admin, reason="test")
    second.refresh_from_db()
    assert second.status == Round.Status.SETTLED
    assert set(second.allocations.values_list("status", flat=True)) == {Allocation.Status.ACTIVE}


MONEY_WORDS = re.compile(
    r"(amount|cap|escrow|charge|refund|price|revenue|spend|balance|held|available|remaining|"
    r"limit|reserve)"
)
NOT_MONEY = {"capacity", "capacities", "bids_refunded"}  # GPUs and a count


def test_every_amount_in_the_audit_of_bids_settlement_and_void_reads_in_credits(teams):
    """Each key of an audit payload that holds milli-credits is one the review shows in
    credits (audit.display.MONEY_KEYS); a new money key left out would read 1000x too big."""
    from audit.display import MONEY_KEYS

    market = market_make()
    a, b, _c = teams
    rnd, _ = settle(market, [(a, 2, {"a100": 3_000}), (b, 2, {"a100": 4_000})])
    round_void(round=rnd, actor=market.admin, reason="rack 3")

    def ints(value) -> bool:
        if isinstance(value, dict):
            return bool(value) and all(ints(v) for v in value.values())
        return isinstance(value, int) and not isinstance(value, bool)

    def missed(payload, path=""):
        if not isinstance(payload, dict):
            return []
        out = []
        for key, value in payload.items():
            if key in MONEY_KEYS or key in NOT_MONEY:
                continue
            if MONEY_WORDS.search(key) and ints(value):
                out.append(f"{path}{key}")
            out += missed(value, f"{path}{key}.")
        return out

    left = {
        (e.action, k)
        for e in AuditEvent.objects.all()
        for k in missed(e.before or {}) + missed(e.after or {})
    }
    assert not left, left
