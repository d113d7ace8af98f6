"""Policy versions (never edited, one active, one shadow), tiers, and opening rounds."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from audit.models import AuditEvent
from market.demo import demo_market_seed
from market.errors import MarketError
from market.models import PolicyVersion, Round, Tier
from market.services.policy import (
    policy_activate,
    policy_active,
    policy_shadow_set,
    policy_version_create,
)
from market.services.rounds import next_window, round_close, round_open_next
from market.services.tiers import tier_create, tier_update
from tests import factories
from tests.market.marketkit import T0, market_make

pytestmark = pytest.mark.django_db


def test_the_default_policy_is_created_once_on_first_use():
    first = policy_active()
    assert (first.number, first.mechanism, first.round_minutes, first.status) == (
        1,
        "welfare",
        60,
        "active",
    )
    assert policy_active().pk == first.pk
    assert PolicyVersion.objects.count() == 1
    assert AuditEvent.objects.filter(action="policy.default_create").count() == 1


def test_no_active_version_among_existing_ones_is_an_error_not_a_new_default():
    policy_version_create(actor=None, mechanism="fisher")
    with pytest.raises(MarketError, match="no policy version is active"):
        policy_active()


def test_a_change_makes_a_new_version_with_its_parent_and_leaves_the_old_one_alone():
    admin = factories.admin_user()
    tier_create(actor=admin, slug="a100", capacity=4)
    v1 = policy_version_create(actor=admin, reserve_prices={"a100": 1000}, round_minutes=30)
    v2 = policy_version_create(actor=admin, based_on=v1, reserve_prices={"a100": 1500})
    v1.refresh_from_db()
    assert (v1.number, v1.reserve_prices, v1.round_minutes) == (1, {"a100": 1000}, 30)
    assert (v2.number, v2.parent_id, v2.reserve_prices, v2.round_minutes, v2.status) == (
        2,
        v1.pk,
        {"a100": 1500},
        30,
        "draft",
    )
    assert v2.created_by == admin
    event = AuditEvent.objects.get(action="policy.version_create", object_id=str(v2.pk))
    assert event.before["reserve_prices"] == {"a100": 1000} and event.after["parent"] == 1


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"mechanism": "lottery"}, "mechanism must be one of welfare, fisher, maxmin"),
        ({"reserve_prices": {"v100": 10}}, "unknown tier.* v100; known tiers: a100"),
        ({"reserve_prices": {"a100": 2.5}}, r"reserve_prices\[a100\] must be a whole number"),
        ({"max_share_pct": {"a100": 0}}, "must be at least 1"),
        ({"max_share_pct": {"a100": 101}}, "must be at most 100"),
        ({"round_minutes": 0}, "round_minutes must be at least 1"),
        ({"status": "active"}, "cannot set status on a policy version"),
        ({"params": []}, "params must be a mapping"),
    ],
)
def test_invalid_policy_changes_are_refused(changes, message):
    tier_create(actor=None, slug="a100", capacity=4)
    with pytest.raises(MarketError, match=message):
        policy_version_create(actor=None, **changes)
    assert PolicyVersion.objects.count() == 0


def test_activation_keeps_exactly_one_active_and_retires_the_previous():
    v1 = policy_version_create(actor=None)
    v2 = policy_version_create(actor=None, based_on=v1, mechanism="maxmin")
    policy_activate(version=v1, actor=None)
    policy_activate(version=v2, actor=None)
    statuses = dict(PolicyVersion.objects.values_list("number", "status"))
    assert statuses == {1: "retired", 2: "active"}
    assert policy_active().pk == v2.pk
    with pytest.raises(MarketError, match="v1 is retired; create a new version based on it"):
        policy_activate(version=v1, actor=None)
    # A rollback is a new version based on the old one.
    v3 = policy_version_create(actor=None, based_on=v1, note="rollback to v1")
    policy_activate(version=v3, actor=None)
    assert dict(PolicyVersion.objects.values_list("number", "status")) == {
        1: "retired",
        2: "retired",
        3: "active",
    }
    assert v3.mechanism == "welfare" and v3.parent_id == v1.pk


def test_shadow_is_one_draft_at_a_time_and_can_be_cleared():
    active = policy_version_create(actor=None)
    policy_activate(version=active, actor=None)
    a = policy_version_create(actor=None, mechanism="fisher")
    b = policy_version_create(actor=None, mechanism="maxmin")
    policy_shadow_set(version=a, actor=None)
    policy_shadow_set(version=b, actor=None)
    assert dict(PolicyVersion.objects.values_list("number", "status")) == {
        1: "active",
        2: "draft",
        3: "shadow",
    }
    with pytest.raises(MarketError, match="only a draft can run in shadow; v1 is active"):
        policy_shadow_set(version=active, actor=None)
    policy_shadow_set(version=None, actor=None)
    assert not PolicyVersion.objects.filter(status="shadow").exists()
    assert AuditEvent.objects.filter(action="policy.shadow_set").count() == 3


def test_tiers_are_validated_and_changes_audited():
    admin = factories.admin_user()
    with pytest.raises(MarketError, match="must be lower-case letters"):
        tier_create(actor=admin, slug="H100 NVLink")
    tier = tier_create(actor=admin, slug="h100-nvlink", capacity=8)
    with pytest.raises(MarketError, match="already exists"):
        tier_create(actor=admin, slug="h100-nvlink")
    with pytest.raises(MarketError, match="capacity must be at least 0"):
        tier_update(tier=tier, actor=admin, capacity=-1)
    tier_update(tier=tier, actor=admin, maintenance_gpus=3)
    tier_update(tier=tier, actor=admin, maintenance_gpus=3)  # unchanged: no second event
    tier.refresh_from_db()
    assert tier.offered == 5
    assert AuditEvent.objects.filter(action="tier.update").count() == 1


def test_round_window_follows_the_policy_length_and_lead():
    policy = PolicyVersion(round_minutes=60, lead_minutes=10)
    closes, starts, ends = next_window(policy=policy, now=datetime(2030, 1, 7, 9, 10, tzinfo=UTC))
    assert (starts, ends) == (
        datetime(2030, 1, 7, 10, 0, tzinfo=UTC),
        datetime(2030, 1, 7, 11, 0, tzinfo=UTC),
    )
    assert closes == starts - timedelta(minutes=10)
    # Less than a quarter of a round left to bid: the round after.
    closes, starts, _ = next_window(policy=policy, now=datetime(2030, 1, 7, 9, 45, tzinfo=UTC))
    assert starts == datetime(2030, 1, 7, 11, 0, tzinfo=UTC) and closes == starts - timedelta(
        minutes=10
    )


def test_round_open_next_keeps_exactly_one_open_round_with_contiguous_windows():
    m = market_make()
    assert round_open_next(now=T0 + timedelta(minutes=5)).pk == m.round.pk
    later = m.round.closes_at + timedelta(seconds=3)
    nxt = round_open_next(now=later)
    m.round.refresh_from_db()
    assert m.round.status == "closed"
    assert nxt.status == "open" and nxt.starts_at == m.round.ends_at
    assert Round.objects.filter(status="open").count() == 1


def test_a_shorter_policy_never_overlaps_a_window_already_auctioned():
    m = market_make()  # open round [10:00, 11:00)
    short = policy_version_create(actor=None, based_on=m.policy, round_minutes=2)
    policy_activate(version=short, actor=None)
    nxt = round_open_next(now=m.after_close())
    assert nxt.policy_id == short.pk
    assert nxt.starts_at == m.round.ends_at and nxt.ends_at - nxt.starts_at == timedelta(minutes=2)


def test_closing_before_time_is_refused_and_closing_twice_is_a_no_op():
    m = market_make()
    with pytest.raises(MarketError, match="closes then, not before"):
        round_close(round_id=m.round.pk, now=T0)
    assert round_close(round_id=m.round.pk, now=m.after_close()).status == "closed"
    assert round_close(round_id=m.round.pk, now=m.after_close(60)).status == "closed"
    assert AuditEvent.objects.filter(action="round.close").count() == 1


def test_demo_seed_is_idempotent():
    admin = factories.admin_user()
    first = demo_market_seed(actor=admin)
    again = demo_market_seed(actor=admin)
    assert first.pk == again.pk and first.status == "active" and first.round_minutes == 2
    # Capacity is measured from the demo's simulated nodes once they report (docs/capacity.md).
    assert dict(Tier.objects.values_list("slug", "capacity")) == {
        "h100-nvlink": 0,
        "a100": 0,
        "preemptible": 0,
    }
    assert Tier.objects.get(slug="preemptible").preemptible
    assert PolicyVersion.objects.count() == 1
