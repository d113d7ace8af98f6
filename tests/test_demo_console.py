"""The demo console's lines: a voided round and a rolled-back policy are told, not silent."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from gpumarket.demo import round_news
from market.models import PolicyVersion, Round
from market.services.policy import policy_activate, policy_active, policy_version_create

pytestmark = pytest.mark.django_db


def test_the_console_tells_a_voided_round_and_the_policy_that_replaced_the_active_one():
    base = policy_active()
    now = timezone.now()
    rnd = Round.objects.create(
        policy=base,
        status=Round.Status.SETTLED,
        opens_at=now - timedelta(hours=2),
        closes_at=now - timedelta(hours=1),
        starts_at=now - timedelta(hours=1),
        ends_at=now,
    )
    told: dict[int, str] = {rnd.pk: rnd.status}
    active: dict[str, int] = {}
    assert round_news(told, active) == []  # the policy in force at the start is not news

    Round.objects.filter(pk=rnd.pk).update(
        status=Round.Status.VOIDED, failure_reason="voided: price guardrail breached"
    )
    back = policy_version_create(actor=None, based_on=base, note="rolled back after round 1")
    policy_activate(version=back, actor=None)
    assert PolicyVersion.objects.get(pk=back.pk).status == PolicyVersion.Status.ACTIVE
    assert round_news(told, active) == [
        f"round {rnd.pk}: voided, its charges refunded and its allocations revoked "
        "(price guardrail breached)",
        f"policy v{back.number} is active now: rolled back after round 1",
    ]
    assert round_news(told, active) == []
