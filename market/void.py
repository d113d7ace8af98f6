"""Voiding a settled round: every charge reversed, every allocation revoked.

The enforcement loop (telemetry) treats a revoked allocation like any other that is no
longer active: work still running on it is stopped with the normal grace period. The market
may not import telemetry (it sits above the market), so after the void commits an enforcement
pass is requested by task name; if no broker is reachable the next scheduled pass (every few
seconds) issues the directives instead.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from datetime import datetime

from django.contrib.auth.models import AbstractBaseUser
from django.db import transaction

import audit.services as audit
from market.errors import MarketError
from market.models import Allocation, Bid, Round
from market.services._common import now_or, round_notices_send
from tenants.errors import TenantError
from tenants.ledger import credits, credits_refund
from tenants.models import Notification

logger = logging.getLogger(__name__)

VOIDABLE = (Round.Status.SETTLED, Round.Status.FINISHED)
ENFORCE_TASK = "telemetry.enforce"


def _enforcement_request() -> None:
    from config.celery import app

    try:
        app.send_task(ENFORCE_TASK)
    except Exception as exc:  # noqa: BLE001 - the beat schedule runs the same pass shortly
        logger.warning(
            "could not request an enforcement pass now (%s); the next scheduled one stops the work",
            exc,
        )


@transaction.atomic
def round_void(
    *,
    round: Round,  # noqa: A002 - the domain's word
    actor: AbstractBaseUser | str | None,
    reason: str,
    now: datetime | None = None,
) -> Round:
    """Void a settled (or finished) round in one transaction.

    Each winning bid's charges are refunded (revenue -> the tenant's available balance, one
    transfer per bid with the idempotency key ``void:<round>:<bid>``), its allocations are
    revoked and the bid marked ``refunded``; the round becomes ``voided`` with the reason
    kept; tenants and admins are notified; one audit event records the totals. Voiding a
    round that is already voided returns it unchanged.
    """
    reason = (reason or "").strip()
    if not reason:
        raise MarketError("say why the round is voided; the reason is shown to every tenant in it")
    now = now_or(now)
    rnd = Round.objects.select_for_update().get(pk=round.pk)
    if rnd.status == Round.Status.VOIDED:
        return rnd
    if rnd.status not in VOIDABLE:
        raise MarketError(
            f"round {rnd.pk} is {rnd.get_status_display().lower()}; only a settled or finished round "
            "can be voided (a round that has not settled can be failed instead, which releases escrow)"
        )
    bids = list(
        Bid.objects.select_for_update(of=("self",))
        .filter(round=rnd, status=Bid.Status.WON)
        .select_related("tenant", "campaign")
        .order_by("pk")
    )
    allocations = list(Allocation.objects.select_for_update().filter(round=rnd).order_by("pk"))
    charged: dict[int, int] = defaultdict(int)
    for allocation in allocations:
        charged[allocation.bid_id] += allocation.charge

    refunded: dict[int, int] = defaultdict(int)
    tenants = {}
    for bid in bids:
        amount = charged.get(bid.pk, 0)
        tenants[bid.tenant_id] = bid.tenant
        if amount:
            try:
                credits_refund(
                    tenant=bid.tenant,
                    amount=amount,
                    actor=actor if isinstance(actor, AbstractBaseUser) else None,
                    reason=f"round {rnd.pk} voided: {reason}"[:300],
                    reference=f"bid:{bid.pk}",
                    campaign=bid.campaign,
                    idempotency_key=f"void:{rnd.pk}:{bid.pk}",
                )
            except TenantError as exc:
                raise MarketError(f"round {rnd.pk} could not be voided: {exc}") from exc
            refunded[bid.tenant_id] += amount
        bid.status = Bid.Status.REFUNDED
        bid.updated_at = now
    Bid.objects.bulk_update(bids, ["status", "updated_at"])
    revoked = [a.pk for a in allocations if a.status != Allocation.Status.REVOKED]
    Allocation.objects.filter(pk__in=revoked).update(status=Allocation.Status.REVOKED)

    before = rnd.status
    rnd.status = Round.Status.VOIDED
    rnd.failure_reason = f"voided: {reason}"[:500]
    rnd.save(update_fields=["status", "failure_reason"])

    total = sum(refunded.values())
    round_notices_send(
        rnd=rnd,
        kind="round_voided",
        admin_level=Notification.Level.WARNING,
        admin_message=(
            f"Round {rnd.pk} was voided: {credits(total)} credits refunded to "
            f"{len(refunded)} tenant(s), {len(revoked)} allocation(s) revoked. Reason: {reason}"
        ),
        tenant_messages={
            tenant: (
                f"Round {rnd.pk} was voided and its charges of {credits(refunded[tenant.pk])} "
                f"credits were refunded to your balance; work on its GPUs is being stopped. "
                f"Reason: {reason}"
            )
            for tenant in tenants.values()
        },
    )
    audit.record(
        actor=actor,
        action="round.void",
        target=rnd,
        before={"status": before, "revenue": rnd.revenue},
        after={
            "status": rnd.status,
            "reason": reason,
            "refunded": total,
            "refunds": {str(k): v for k, v in sorted(refunded.items())},
            "bids_refunded": len(bids),
            "allocations_revoked": revoked,
        },
    )
    if revoked:
        transaction.on_commit(_enforcement_request)
    return rnd
