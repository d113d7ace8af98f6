"""Money of work a hard spend cap stopped before it ran.

An allocation the enforcement loop pauses for its tenant's hard cap, and on which no work
was ever seen (no process tagged with it, no enforcement action on it), is refunded in full
in the same transaction as the pause: the team pays nothing for GPUs it never used. If the
cap lifts while the window still runs, the allocation is charged again before it resumes,
but only when that leaves the team strictly under its hard caps; otherwise it stays paused.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime

from django.contrib.auth.models import AbstractBaseUser
from django.db import transaction

import audit.services as audit
from market.models import Allocation
from market.services._common import now_or
from tenants.budgets import hard_cap_room
from tenants.errors import TenantError
from tenants.ledger import credits, credits_charge, credits_hold, credits_refund

Status = Allocation.Status


def _locked(ids: Iterable[int]) -> list[Allocation]:
    return list(
        Allocation.objects.select_for_update(of=("self",))
        .filter(pk__in=sorted(set(ids)))
        .select_related("tenant", "bid__campaign")
        .order_by("pk")
    )


@transaction.atomic
def allocations_cap_refund(
    *,
    allocation_ids: Iterable[int],
    never_ran: set[int],
    actor: AbstractBaseUser | str | None,
    now: datetime | None = None,
) -> list[int]:
    """Refund the charge of each paused allocation in ``never_ran`` (the caller's evidence
    that no work ran on it). Returns the ids refunded; one already refunded is left alone."""
    now = now_or(now)
    refunded = []
    for allocation in _locked(allocation_ids):
        if (
            allocation.pk not in never_ran
            or allocation.status != Status.PAUSED
            or allocation.cap_refund
            or not allocation.charge
        ):
            continue
        credits_refund(
            tenant=allocation.tenant,
            amount=allocation.charge,
            actor=None,
            reason=f"allocation {allocation.pk} paused by a hard spend cap before it ran",
            reference=f"allocation:{allocation.pk}",
            campaign=allocation.bid.campaign,
        )
        allocation.cap_refund = allocation.charge
        allocation.save(update_fields=["cap_refund"])
        audit.record(
            actor=actor,
            action="allocation.cap_refund",
            target=allocation,
            tenant=allocation.tenant,
            after={"refunded": allocation.charge, "at": now.isoformat()},
        )
        refunded.append(allocation.pk)
    return refunded


@transaction.atomic
def allocations_cap_recharge(
    *,
    allocation_ids: Iterable[int],
    actor: AbstractBaseUser | str | None,
    now: datetime | None = None,
) -> list[int]:
    """Of these paused allocations, the ones that may resume: not refunded, or refunded and
    charged again now because the charge fits strictly under every hard cap and the balance
    holds it. A refunded one that does not fit stays paused (and is not in the result)."""
    now = now_or(now)
    may_resume = []
    for allocation in _locked(allocation_ids):
        amount = allocation.cap_refund
        if not amount:
            may_resume.append(allocation.pk)
            continue
        campaign = allocation.bid.campaign
        room = hard_cap_room(
            tenant=allocation.tenant, campaign_id=campaign.pk if campaign else None, at=now
        )
        if room is not None and amount >= room:
            continue
        ledger = {
            "tenant": allocation.tenant,
            "actor": None,
            "reference": f"allocation:{allocation.pk}",
            "campaign": campaign,
        }
        try:
            with transaction.atomic():
                credits_hold(amount=amount, reason="charged again to resume", **ledger)
                credits_charge(
                    amount=amount,
                    reason=f"allocation {allocation.pk} resumes after its hard cap lifted",
                    **ledger,
                )
        except TenantError:
            continue  # not enough credits now: it stays paused
        allocation.cap_refund = 0
        allocation.save(update_fields=["cap_refund"])
        audit.record(
            actor=actor,
            action="allocation.cap_recharge",
            target=allocation,
            tenant=allocation.tenant,
            after={"charged": amount, "credits": credits(amount), "at": now.isoformat()},
        )
        may_resume.append(allocation.pk)
    return may_resume
