"""Allocations on GPUs that failed: refunded pro rata for the time they could not run, and
moved to free healthy GPUs of the same tier where there are any.

Telemetry calls this when a GPU reports a fatal error or a node goes silent (and on every
health pass, so that an allocation settled onto a GPU while it was failing is caught too).
An allocation's work runs as one job on all its GPUs, so a failure stops all of it: the
refund is the allocation's charge times the share of its window lost, from the failure (or
the window's start) until the work can run again (the move) or the window ends (no move).
The work restarts through its order (``gpumarket run --order N --follow``) on the new GPUs;
the new launch secret makes tokens of the old placement stop verifying, so the enforcement
loop stops what is left of the work on the old GPUs.
"""

from __future__ import annotations

import hashlib
import secrets
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.contrib.auth.models import AbstractBaseUser
from django.db import transaction
from django.db.models import Sum

import audit.services as audit
from market.models import Allocation, Reclaim
from market.placement import FreeGpu, Request, place
from market.placement.inventory import tier_gpus
from market.services._common import now_or
from market.services.placement import LIVE, as_json
from market.spare import failure_refund
from tenants.ledger import credits, credits_refund
from tenants.models import LedgerOperation, Notification

KEY_PREFIX = "allocation-failure"
_MICROSECOND = timedelta(microseconds=1)


@dataclass(frozen=True)
class FailureOutcome:
    allocation: int
    refunded: int  # milli-credits
    moved: bool


def _key(allocation: Allocation, uuids: list[str], failed_at: datetime) -> str:
    """One refund per allocation and failure (the failed GPUs and when they failed)."""
    digest = hashlib.sha256(f"{','.join(uuids)}@{failed_at.isoformat()}".encode()).hexdigest()
    return f"{KEY_PREFIX}:{allocation.pk}:{digest[:32]}"


def _refunded_before(allocation: Allocation) -> int:
    return (
        LedgerOperation.objects.filter(
            key__startswith=f"{KEY_PREFIX}:{allocation.pk}:", transfer__isnull=False
        ).aggregate(total=Sum("transfer__amount"))["total"]
        or 0
    )


def _taken_by_others(allocation: Allocation, *, starts_at: datetime) -> set[str]:
    rows = (
        Allocation.objects.filter(
            tier_id=allocation.tier_id,
            status__in=LIVE,
            starts_at__lt=allocation.ends_at,
            ends_at__gt=starts_at,
        )
        .exclude(pk=allocation.pk)
        .values_list("placement", flat=True)
    )
    return {gpu["uuid"] for placement in rows for gpu in placement}


def _replacement(allocation: Allocation, *, now: datetime) -> tuple[FreeGpu, ...] | None:
    """Free healthy GPUs of the allocation's tier for the rest of its window, its own
    surviving GPUs included (a gang is kept on one node where it fits); None if too few."""
    taken = _taken_by_others(allocation, starts_at=max(now, allocation.starts_at))
    free = [g for g in tier_gpus(allocation.tier.slug) if g.uuid not in taken]
    request = Request(allocation.pk, allocation.gpus, gang=allocation.bid.min_quantity > 1)
    placement = place([request], free)
    return placement.placed.get(allocation.pk)


def _tell(allocation: Allocation, *, reason: str, refunded: int, moved: bool, key: str) -> None:
    if moved:
        gpus = ", ".join(f"{g['node']}/{g['index']}" for g in allocation.placement)
        what = (
            f"moved to {gpus}; restart its work there "
            f"(gpumarket run --order N --follow restarts an order's work)"
        )
    else:
        what = "stopped: no healthy GPU of its tier was free for the rest of its window"
    message = f"Allocation #{allocation.pk} lost its GPUs ({reason}) and was {what}."
    if refunded:
        message += f" {credits(refunded)} credits for the time it could not run came back."
    Notification.objects.get_or_create(
        dedupe_key=key,
        defaults={
            "tenant_id": allocation.tenant_id,
            "level": Notification.Level.WARNING,
            "kind": "work_moved" if moved else "work_failed",
            "message": message[:500],
        },
    )


@transaction.atomic
def allocations_gpus_failed(
    *,
    uuids: set[str],
    failed_at: datetime,
    reason: str,
    actor: AbstractBaseUser | str | None,
    now: datetime | None = None,
    replace: bool = True,
) -> list[FailureOutcome]:
    """Refund and move the live allocations placed on any of ``uuids`` (GPUs that stopped
    being usable at ``failed_at``). The caller has already taken those GPUs out of the
    placeable inventory. Idempotent: a moved allocation is no longer on the GPUs, a stopped
    one is no longer live, and each refund carries an idempotency key; refunds of one
    allocation never add up to more than it was charged. ``replace`` False stops the
    allocations without looking for other GPUs."""
    now = now_or(now)
    failed = sorted(set(uuids))
    if not failed:
        return []
    candidates, reclaimed = _allocations_on(uuids, failed=failed, failed_at=failed_at, now=now)
    outcomes = []
    for allocation in (
        Allocation.objects.select_for_update(of=("self",))
        .filter(pk__in=candidates, status__in=LIVE)
        .select_related("tier", "bid__campaign", "tenant")
        .order_by("pk")
    ):
        mine = sorted(
            g["uuid"]
            for g in allocation.placement
            if g["uuid"] in uuids and (allocation.pk, g["uuid"]) not in reclaimed
        )
        if mine:
            outcomes.append(
                _allocation_fail(
                    allocation,
                    mine=mine,
                    failed_at=failed_at,
                    reason=reason,
                    actor=actor,
                    now=now,
                    replace=replace,
                )
            )
    return outcomes


def _allocations_on(
    uuids: set[str], *, failed: list[str], failed_at: datetime, now: datetime
) -> tuple[list[int], set[tuple[int, str]]]:
    """The live allocations placed on any of ``uuids`` (ids), and the (allocation, GPU) pairs
    among them that were reclaimed."""
    candidates = [
        pk
        for pk, placement in Allocation.objects.filter(
            status__in=LIVE, ends_at__gt=min(failed_at, now)
        ).values_list("pk", "placement")
        if any(g["uuid"] in uuids for g in placement)
    ]
    # A reclaimed GPU stays in its former owner's placement but is no longer its to run on
    # (it is the backfill's): its failure is not the owner's.
    reclaimed = set(
        Reclaim.objects.filter(
            allocation_id__in=candidates, status=Reclaim.Status.RECLAIMED, gpu_uuid__in=failed
        ).values_list("allocation_id", "gpu_uuid")
    )
    return candidates, reclaimed


def _allocation_fail(
    allocation: Allocation,
    *,
    mine: list[str],
    failed_at: datetime,
    reason: str,
    actor: AbstractBaseUser | str | None,
    now: datetime,
    replace: bool,
) -> FailureOutcome:
    """One allocation that lost GPUs ``mine``: moved to other GPUs if ``replace`` finds
    them, else revoked; refunded for the time it could not run; audited and told."""
    placed = _replacement(allocation, now=now) if replace else None
    before = {"placement": allocation.placement, "status": allocation.status}
    amount = _lost_time_refund(allocation, failed_at=failed_at, now=now, moved=bool(placed))
    key = _key(allocation, mine, failed_at)
    if amount:
        credits_refund(
            tenant=allocation.tenant,
            amount=amount,
            actor=None,
            reason=f"allocation {allocation.pk} could not run: {reason}"[:300],
            reference=f"allocation:{allocation.pk}",
            campaign=allocation.bid.campaign,
            idempotency_key=key,
        )
    if placed:
        allocation.placement = as_json(placed)
        allocation.launch_secret = secrets.token_hex(32)
        allocation.save(update_fields=["placement", "launch_secret"])
    else:
        allocation.status = Allocation.Status.REVOKED
        allocation.save(update_fields=["status"])
    audit.record(
        actor=actor,
        action="allocation.gpu_failure",
        target=allocation,
        tenant=allocation.tenant,
        before=before,
        after={
            "placement": allocation.placement,
            "status": allocation.status,
            "failed_gpus": mine,
            "failed_at": failed_at.isoformat(),
            "reason": reason,
            "refunded": amount,
        },
    )
    _tell(allocation, reason=reason, refunded=amount, moved=bool(placed), key=key)
    return FailureOutcome(allocation=allocation.pk, refunded=amount, moved=bool(placed))


def _lost_time_refund(
    allocation: Allocation, *, failed_at: datetime, now: datetime, moved: bool
) -> int:
    """Milli-credits for the time the work could not run: from the failure until it is
    moved (now) or, unmoved, to the window's end; never more than is left to refund."""
    lost_from = max(failed_at, allocation.starts_at)
    lost_until = max(min(now if moved else allocation.ends_at, allocation.ends_at), lost_from)
    return failure_refund(
        charge=allocation.charge,
        lost=(lost_until - lost_from) // _MICROSECOND,
        window=(allocation.ends_at - allocation.starts_at) // _MICROSECOND,
        room=allocation.charge - allocation.cap_refund - _refunded_before(allocation),
    )
