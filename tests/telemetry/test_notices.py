"""What a team reads when the enforcement loop ends its allocations' windows."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from telemetry.services.notices import window_ended_notify
from tenants.models import Notification
from tests import factories
from tests.telemetry.market_data import allocation_make

pytestmark = pytest.mark.django_db


def test_a_round_whose_window_ended_is_one_notice_per_team_not_one_per_allocation(tier):
    team = factories.tenant()
    now = timezone.now().replace(microsecond=0)
    window = {"starts_at": now - timedelta(hours=1), "ends_at": now}
    first, second, third = (allocation_make(tenant=team, tier=tier, **window) for _ in range(3))
    assert first.round_id == second.round_id == third.round_id

    window_ended_notify(ended=[first, second], grace_seconds=30)
    window_ended_notify(ended=[third], grace_seconds=30)  # a later tick of the same round

    (notice,) = Notification.objects.filter(tenant=team)
    assert notice.message == (
        f"Round {first.round_id}'s window ended at {now:%Y-%m-%d %H:%M} UTC. Work still "
        f"running on allocation(s) #{first.pk}, #{second.pk} was stopped (SIGTERM, then "
        f"SIGKILL after 30 s to checkpoint). Work still running on allocation(s) "
        f"#{third.pk} was stopped (SIGTERM, then SIGKILL after 30 s to checkpoint)."
    )
    assert "preempt" not in notice.message.lower()
    # The next round's end is news again.
    later = allocation_make(tenant=team, tier=tier, starts_at=now, ends_at=now + timedelta(hours=1))
    window_ended_notify(ended=[later], grace_seconds=30)
    assert Notification.objects.filter(tenant=team).count() == 2


def test_a_revoked_allocation_shows_no_charge_but_the_refund(tier, client):
    team = factories.tenant()
    now = timezone.now()
    revoked = allocation_make(
        tenant=team,
        tier=tier,
        gpus=3,
        starts_at=now - timedelta(hours=2),
        ends_at=now - timedelta(hours=1),
        status="revoked",
    )
    client.force_login(factories.member(tenant=team))
    listing = client.get("/fleet/allocations/").content.decode()
    assert '<td>0.000 <span class="muted">(3.000 refunded)</span></td>' in listing
    detail = client.get(f"/fleet/allocations/{revoked.pk}/").content.decode()
    assert "charge 0.000 (3.000 refunded: the round was voided)" in detail
    client.force_login(factories.admin_user())
    staff = client.get(f"/market/admin/rounds/{revoked.round_id}/").content.decode()
    assert '<td>0.000 <span class="muted">(3.000 refunded)</span></td>' in staff
