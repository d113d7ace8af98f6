"""A reclaimed GPU that fails is the backfill's loss, not its former owner's: the GPU left the
owner's allocation when it was reclaimed (docs/capacity.md, "Idle reclaim"), so its failure
neither refunds nor moves the owner's work, which runs on its other GPUs."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from market.models import Allocation, Reclaim
from market.services.backfill import backfill_run
from market.services.failures import allocations_gpus_failed
from telemetry.services.idle import idle_reclaim_scan
from tenants.ledger import ledger_verify
from tenants.models import LedgerOperation
from tests.telemetry.test_backfill import world  # noqa: F401 - the fixture
from tests.telemetry.test_idle_reclaim import _samples

pytestmark = pytest.mark.django_db


def _refunds(allocation: Allocation) -> list[int]:
    """What failure refunds the allocation received."""
    return list(
        LedgerOperation.objects.filter(
            key__startswith=f"allocation-failure:{allocation.pk}:", transfer__isnull=False
        ).values_list("transfer__amount", flat=True)
    )


def test_a_reclaimed_gpu_failing_refunds_and_moves_only_the_backfill_on_it(world):  # noqa: F811
    _owner, allocation, _other, _order = world
    idle, busy = (g["uuid"] for g in allocation.placement)
    now = timezone.now()
    later = now + timedelta(minutes=5, seconds=30)
    _samples(idle, util=1, start=now - timedelta(minutes=11), end=later)
    _samples(busy, util=90, start=now - timedelta(minutes=11), end=later)
    idle_reclaim_scan(now=now)
    idle_reclaim_scan(now=later)
    assert Reclaim.objects.get(status=Reclaim.Status.RECLAIMED).gpu_uuid == idle
    (backfilled,) = Allocation.objects.filter(pk__in=backfill_run(now=later).allocations)
    owner_placement = list(allocation.placement)

    failed_at = later + timedelta(minutes=2)
    outcomes = allocations_gpus_failed(
        uuids={idle}, failed_at=failed_at, reason="XID 79", actor="test", now=failed_at
    )

    assert [o.allocation for o in outcomes] == [backfilled.pk]
    allocation.refresh_from_db()
    assert allocation.placement == owner_placement and allocation.status == "active"
    assert _refunds(allocation) == []
    backfilled.refresh_from_db()
    # No free GPU of the tier is left: the backfill is stopped and refunded to the window's end.
    assert backfilled.status == Allocation.Status.REVOKED
    (refund,) = _refunds(backfilled)
    assert refund > 0
    assert ledger_verify() == []
