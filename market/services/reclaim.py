"""Idle reclaim: a won GPU its team leaves idle is noticed, then reclaimed and refunded.

Telemetry decides what is idle (telemetry/services/idle.py: utilisation below the tier's
``below_pct`` for ``idle_minutes``, never a GPU whose work is checkpointing or stopped by the
platform) and calls these services; the market decides what that costs. The policy is per
tier, in the active policy version's ``params["idle_reclaim"]`` (market/services/policy.py).

The team gets a **refund**, not a recall right: once reclaimed, the GPU is the platform's for
the rest of the window (its work there is paused by the enforcement loop and it joins the
backfill pool) and the team is refunded ``refund_pct`` % of what it paid for the unused time,
as one ledger refund with the idempotency key ``reclaim:<id>``, audited.
"""

from __future__ import annotations

from datetime import datetime

from django.db import IntegrityError, transaction
from django.db.models import F

import audit.services as audit
from market.models import Allocation, Order, PolicyVersion, Reclaim
from market.services._common import now_or
from market.services.policy import IDLE_RECLAIM
from market.spare import IdlePolicy, reclaim_refund
from tenants.ledger import credits, credits_refund
from tenants.models import Notification

Status = Reclaim.Status
_ACTOR = "reclaimer"


def idle_policies(policy: PolicyVersion) -> dict[str, IdlePolicy]:
    """{tier slug: its idle-reclaim policy}; a tier missing here is never reclaimed."""
    return {
        slug: IdlePolicy(**terms) for slug, terms in (policy.params.get(IDLE_RECLAIM) or {}).items()
    }


def _placed(allocation: Allocation, gpu_uuid: str) -> dict | None:
    return next((g for g in allocation.placement if g["uuid"] == gpu_uuid), None)


def reclaimed_gpus(*, now: datetime) -> dict[str, int]:
    """{GPU uuid: allocation id} of the GPUs reclaimed from allocations whose window holds now."""
    return dict(
        Reclaim.objects.filter(
            status=Status.RECLAIMED,
            allocation__starts_at__lte=now,
            allocation__ends_at__gt=now,
        ).values_list("gpu_uuid", "allocation_id")
    )


@transaction.atomic
def reclaim_notice(
    *,
    allocation_id: int,
    gpu_uuid: str,
    idle_since: datetime,
    policy: IdlePolicy,
    now: datetime | None = None,
) -> Reclaim | None:
    """Tell the team that a GPU of this allocation has been idle since ``idle_since`` and will
    be reclaimed after the grace unless work comes back. None (and nothing written) when the
    allocation is not active and running, the GPU is not placed for it, or the window ends
    before the grace would; an open reclaim of the GPU is returned as it is."""
    now = now_or(now)
    allocation = (
        Allocation.objects.select_for_update(of=("self",))
        .select_related("tier")
        .filter(pk=allocation_id)
        .first()
    )
    if allocation is None or allocation.status != Allocation.Status.ACTIVE:
        return None
    gpu = _placed(allocation, gpu_uuid)
    reclaim_after = now + policy.grace
    seconds_left = (allocation.ends_at - now).total_seconds()
    if (
        gpu is None
        or not allocation.starts_at <= now
        or not policy.may_notice(seconds_left=seconds_left)
    ):
        return None
    existing = Reclaim.objects.filter(
        allocation=allocation, gpu_uuid=gpu_uuid, status__in=Reclaim.OPEN
    ).first()
    if existing is not None:
        return existing
    try:
        with transaction.atomic():
            reclaim = Reclaim.objects.create(
                allocation=allocation,
                tenant_id=allocation.tenant_id,
                tier=allocation.tier,
                gpu_uuid=gpu_uuid,
                node=gpu["node"],
                gpu_index=gpu["index"],
                idle_since=idle_since,
                noticed_at=now,
                reclaim_after=reclaim_after,
                reason=f"utilisation below {policy.below_pct}% for {policy.idle_minutes} min",
            )
    except IntegrityError:  # a concurrent scan noticed it first
        return Reclaim.objects.get(
            allocation=allocation, gpu_uuid=gpu_uuid, status__in=Reclaim.OPEN
        )
    where = f"{gpu['node']}/{gpu['index']}"
    Notification.objects.create(
        tenant_id=allocation.tenant_id,
        level=Notification.Level.WARNING,
        kind="gpu_idle",
        message=(
            f"GPU {where} of allocation #{allocation.pk} ({allocation.tier.slug}) has been idle "
            f"(utilisation below {policy.below_pct}%) for {policy.idle_minutes} min. Use it "
            f"within {policy.grace_minutes} min or it is reclaimed for the rest of the window; "
            f"{policy.refund_pct}% of the unused time is refunded."
        )[:500],
        dedupe_key=f"gpu-idle:{reclaim.pk}",
    )
    audit.record(
        actor=_ACTOR,
        action="allocation.idle_notice",
        target=allocation,
        tenant=allocation.tenant,
        after={
            "reclaim": reclaim.pk,
            "gpu": gpu_uuid,
            "idle_since": idle_since.isoformat(),
            "reclaim_after": reclaim_after.isoformat(),
        },
    )
    return reclaim


@transaction.atomic
def reclaim_withdraw(*, reclaim_id: int, reason: str, now: datetime | None = None) -> Reclaim:
    """A noticed GPU that is busy again (or no longer eligible) stays with its team."""
    now = now_or(now)
    reclaim = Reclaim.objects.select_for_update().select_related("tenant").get(pk=reclaim_id)
    if reclaim.status != Status.NOTICED:
        return reclaim
    reclaim.status = Status.WITHDRAWN
    reclaim.reason = reason[:300]
    reclaim.save(update_fields=["status", "reason"])
    audit.record(
        actor=_ACTOR,
        action="allocation.idle_withdraw",
        target=reclaim.allocation,
        tenant=reclaim.tenant,
        after={"reclaim": reclaim.pk, "gpu": reclaim.gpu_uuid, "reason": reclaim.reason},
    )
    Notification.objects.filter(dedupe_key=f"gpu-idle:{reclaim.pk}", read_at__isnull=True).update(
        read_at=now
    )
    return reclaim


@transaction.atomic
def reclaim_execute(*, reclaim_id: int, policy: IdlePolicy, now: datetime | None = None) -> Reclaim:
    """Reclaim a noticed GPU whose grace has run out (the caller saw it still idle): the GPU
    leaves the allocation for the rest of the window and the team is refunded ``refund_pct``
    % of its price for the unused time, never more than the allocation's charge less what
    came back already; the allocation's ``charge`` is lowered by the refund, so it always
    reads what the team pays net. Idempotent: a reclaim already executed is returned as it is, and the
    refund's idempotency key makes a retried transfer a no-op."""
    now = now_or(now)
    reclaim = Reclaim.objects.select_for_update().get(pk=reclaim_id)
    if reclaim.status != Status.NOTICED or now < reclaim.reclaim_after:
        return reclaim
    allocation = (
        Allocation.objects.select_for_update(of=("self",))
        .select_related("tenant", "tier", "bid__campaign")
        .get(pk=reclaim.allocation_id)
    )
    if allocation.status != Allocation.Status.ACTIVE or not (
        allocation.starts_at <= now < allocation.ends_at
    ):
        reclaim.status = Status.WITHDRAWN
        reclaim.reason = f"allocation is {allocation.status} or its window is over"
        reclaim.save(update_fields=["status", "reason"])
        return reclaim
    unused = int((allocation.ends_at - now).total_seconds())
    # ``charge`` is what the allocation pays net of earlier reclaims (see below).
    amount = reclaim_refund(
        price=allocation.price,
        unused_seconds=unused,
        refund_pct=policy.refund_pct,
        room=max(allocation.charge - allocation.cap_refund, 0),
    )
    where = f"{reclaim.node}/{reclaim.gpu_index}"
    if amount:
        credits_refund(
            tenant=allocation.tenant,
            amount=amount,
            actor=None,
            reason=f"GPU {where} of allocation {allocation.pk} reclaimed idle: "
            f"{policy.refund_pct}% of {unused}s unused",
            reference=f"allocation:{allocation.pk}",
            campaign=allocation.bid.campaign,
            idempotency_key=f"reclaim:{reclaim.pk}",
        )
    reclaim.status = Status.RECLAIMED
    reclaim.reclaimed_at = now
    reclaim.refund = amount
    reclaim.save(update_fields=["status", "reclaimed_at", "refund"])
    # The allocation's charge is what it pays net: a void (or a cap refund) later gives back
    # only what was not refunded here already.
    allocation.charge -= amount
    allocation.save(update_fields=["charge"])
    if allocation.bid.order_id is not None and amount:
        # The order's spend counts what it paid; the refund came back to the team.
        Order.objects.filter(pk=allocation.bid.order_id).update(spent=F("spent") - amount)
    Notification.objects.create(
        tenant=allocation.tenant,
        level=Notification.Level.INFO,
        kind="gpu_reclaimed",
        message=(
            f"GPU {where} of allocation #{allocation.pk} was reclaimed after staying idle; "
            f"{credits(amount)} credits for its unused time were refunded. Work started on it "
            f"now is paused until the window ends."
        )[:500],
        dedupe_key=f"gpu-reclaimed:{reclaim.pk}",
    )
    audit.record(
        actor=_ACTOR,
        action="allocation.reclaim",
        target=allocation,
        tenant=allocation.tenant,
        after={
            "reclaim": reclaim.pk,
            "gpu": reclaim.gpu_uuid,
            "refund": amount,
            "unused_seconds": unused,
            "refund_pct": policy.refund_pct,
            "at": now.isoformat(),
        },
    )
    return reclaim
