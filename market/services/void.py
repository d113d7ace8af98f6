"""Unwinding a round: failing one that has not settled (every hold released) and voiding one
that has (every charge reversed, every allocation revoked). Both take the same path: the
round and its bids locked, one ledger transfer back per bid under an idempotency key, the
bids marked ``refunded``, the reason kept on the round, admins and tenants notified, one
audit event, all in one transaction.

The enforcement loop (telemetry) treats a revoked allocation like any other that is no
longer active: work still running on it is stopped with the normal grace period. The market
may not import telemetry (it sits above the market), so after a void commits an enforcement
pass is requested by task name; if no broker is reachable the next scheduled pass (every few
seconds) issues the directives instead.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from celery import current_app
from django.conf import settings
from django.contrib.auth.models import AbstractBaseUser
from django.db import transaction

import audit.services as audit
from core.rows import rows_update
from market.errors import MarketError
from market.models import Allocation, Bid, Round
from market.services._common import bids_locked, now_or, round_locked, round_notices_send
from market.services.orders.settling import orders_unsettle
from tenants.errors import TenantError
from tenants.ledger import TransferOrder, credits, transfer_execute_many
from tenants.models import Notification, Tenant, Transfer

logger = logging.getLogger(__name__)

SYSTEM = "system"
FAILABLE = (Round.Status.OPEN, Round.Status.CLOSED, Round.Status.CLEARED)
VOIDABLE = (Round.Status.SETTLED, Round.Status.FINISHED)
ENFORCE_TASK = "telemetry.enforce"
SLURM_UNRESERVE_TASK = "market.slurm_reservations_end"


def _enforcement_request() -> None:
    try:
        current_app.send_task(ENFORCE_TASK)
    except Exception as exc:  # noqa: BLE001 - the beat schedule runs the same pass shortly
        logger.warning(
            "could not request an enforcement pass now (%s); the next scheduled one stops the work",
            exc,
        )


@dataclass(frozen=True)
class _Unwind:
    """How failing and voiding differ; everything else is shared."""

    key: str  # idempotency keys <key>:<round>:<bid>; audit action round.<key>
    verb: str  # notification kind round_<verb>; "the round could not be <verb>"
    status: str  # the round's status afterwards
    bids: str  # the status of the bids that get money back
    transfer: str  # the kind of ledger transfer that moves it back
    admin_level: str
    no_reason: str  # the refusal when no reason is given

    @property
    def kind(self) -> str:
        return f"round_{self.verb}"

    @property
    def action(self) -> str:
        return f"round.{self.key}"


Level = Notification.Level
FAIL = _Unwind(
    "fail",
    "failed",
    Round.Status.FAILED,
    Bid.Status.OPEN,
    Transfer.Kind.RELEASE,
    Level.CRITICAL,
    no_reason="a failed round needs a reason",
)
VOID = _Unwind(
    "void",
    "voided",
    Round.Status.VOIDED,
    Bid.Status.WON,
    Transfer.Kind.REFUND,
    Level.WARNING,
    no_reason="say why the round is voided; the reason is shown to every tenant in it",
)


def _round_claim(
    how: _Unwind, *, round_id: int, reason: str, allowed: tuple[str, ...], refusal: str
) -> tuple[Round, str, bool]:
    """The round locked and the reason stripped, and whether the round already is
    ``how.status`` (then there is nothing to do). MarketError when the reason is blank, or
    ``refusal`` (with ``{pk}``, ``{status}``, ``{label}``) when the round is in no ``allowed``
    status."""
    reason = (reason or "").strip()
    if not reason:
        raise MarketError(how.no_reason)
    rnd = round_locked(round_id)
    if rnd.status == how.status:
        return rnd, reason, True
    if rnd.status not in allowed:
        label = rnd.get_status_display().lower()
        raise MarketError(refusal.format(pk=rnd.pk, status=rnd.status, label=label))
    return rnd, reason, False


def _bids_refund(
    *,
    how: _Unwind,
    rnd: Round,
    bids: list[Bid],
    amounts: dict[int, int],
    actor: AbstractBaseUser | str | None,
    reason: str,
    now: datetime,
) -> dict[int, int]:
    """Move each bid's amount back to its tenant's available balance and mark it refunded;
    returns {tenant id: milli-credits moved}."""
    refunded: dict[int, int] = defaultdict(int)
    orders = []
    for bid in bids:
        amount = amounts.get(bid.pk, 0)
        if amount:
            orders.append(
                TransferOrder(
                    kind=how.transfer,
                    tenant=bid.tenant,
                    amount=amount,
                    actor=actor if isinstance(actor, AbstractBaseUser) else None,
                    reason=reason[:300],
                    reference=f"bid:{bid.pk}",
                    campaign=bid.campaign,
                    idempotency_key=f"{how.key}:{rnd.pk}:{bid.pk}",
                )
            )
            refunded[bid.tenant_id] += amount
        bid.status, bid.escrow, bid.updated_at = Bid.Status.REFUNDED, 0, now
    try:
        transfer_execute_many(orders=orders)  # one batch, in bid order
    except TenantError as exc:
        raise MarketError(f"round {rnd.pk} could not be {how.verb}: {exc}") from exc
    rows_update(bids, ["status", "escrow", "updated_at"])
    return refunded


def _round_close_out(
    *,
    how: _Unwind,
    rnd: Round,
    failure_reason: str,
    actor: AbstractBaseUser | str | None,
    admin_message: str,
    tenant_messages: dict[Tenant, str],
    after: dict[str, Any],
) -> Round:
    """The round's new status and reason saved, the notices sent and the audit event written."""
    before = {"status": rnd.status}
    if how is VOID:
        before["revenue"] = rnd.revenue
    rnd.status = how.status
    rnd.failure_reason = failure_reason[:500]
    rnd.save(update_fields=["status", "failure_reason"])
    round_notices_send(
        rnd=rnd,
        kind=how.kind,
        admin_level=how.admin_level,
        admin_message=admin_message,
        tenant_messages=tenant_messages,
    )
    audit.record(
        actor=actor,
        action=how.action,
        target=rnd,
        before=before,
        after={"status": rnd.status} | after,
    )
    return rnd


@transaction.atomic
def round_fail(
    *,
    round: Round,  # noqa: A002 - the domain's word
    reason: str,
    actor: AbstractBaseUser | str | None = SYSTEM,
    now: datetime | None = None,
) -> Round:
    """Mark a round that has not settled as failed: every open bid's escrow goes back to
    available (bid status ``refunded``) and the reason is kept on the round, audited and
    sent to admins and to each tenant that had a bid in it. Idempotent."""
    rnd, reason, done = _round_claim(
        FAIL,
        round_id=round.pk,
        reason=reason,
        allowed=FAILABLE,
        refusal="round {pk} is {status}; only a round that has not settled can fail",
    )
    if done:
        return rnd
    bids = bids_locked(rnd, status=FAIL.bids)
    refunded = _bids_refund(
        how=FAIL,
        rnd=rnd,
        bids=bids,
        amounts={bid.pk: bid.escrow for bid in bids},
        actor=None,
        reason=f"round {rnd.pk} failed",
        now=now_or(now),
    )
    return _round_close_out(
        how=FAIL,
        rnd=rnd,
        failure_reason=reason,
        actor=actor,
        admin_message=f"Round {rnd.pk} failed and every bid in it was refunded: {reason}",
        tenant_messages={
            bid.tenant: (
                f"Round {rnd.pk} failed; {credits(refunded[bid.tenant_id])} credits of escrow "
                f"were released back to your balance. Reason: {reason}"
            )
            for bid in bids
        },
        after={
            "reason": reason[:500],
            "bids_refunded": len(bids),
            "released": sum(refunded.values()),
        },
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
    rnd, reason, done = _round_claim(
        VOID,
        round_id=round.pk,
        reason=reason,
        allowed=VOIDABLE,
        refusal="round {pk} is {label}; only a settled or finished round can be voided (a round "
        "that has not settled can be failed instead, which releases escrow)",
    )
    if done:
        return rnd
    bids = bids_locked(rnd, status=VOID.bids)
    allocations = list(Allocation.objects.select_for_update().filter(round=rnd).order_by("pk"))
    charged: dict[int, int] = defaultdict(int)
    for allocation in allocations:
        charged[allocation.bid_id] += allocation.charge
    refunded = _bids_refund(
        how=VOID,
        rnd=rnd,
        bids=bids,
        amounts=charged,
        actor=actor,
        reason=f"round {rnd.pk} voided: {reason}",
        now=now_or(now),
    )
    orders_unsettle(rnd=rnd, allocations=allocations, now=now_or(now))
    revoked = [a.pk for a in allocations if a.status != Allocation.Status.REVOKED]
    Allocation.objects.filter(pk__in=revoked).update(status=Allocation.Status.REVOKED)
    reserved = [a.pk for a in allocations if a.pk in set(revoked) and a.placement]
    if reserved and settings.GPUMARKET_SLURM_RESERVATIONS:
        transaction.on_commit(lambda: _slurm_unreserve(reserved))
    total = sum(refunded.values())
    _round_close_out(
        how=VOID,
        rnd=rnd,
        failure_reason=f"voided: {reason}",
        actor=actor,
        admin_message=(
            f"Round {rnd.pk} was voided: {credits(total)} credits refunded to "
            f"{len(refunded)} tenant(s), {len(revoked)} allocation(s) revoked. Reason: {reason}"
        ),
        tenant_messages={
            bid.tenant: (
                f"Round {rnd.pk} was voided and its charges of {credits(refunded[bid.tenant_id])} "
                f"credits were refunded to your balance; work on its GPUs is being stopped. "
                f"Reason: {reason}"
            )
            for bid in bids
        },
        after={
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


def _slurm_unreserve(allocation_ids: list[int]) -> None:
    current_app.send_task(SLURM_UNRESERVE_TASK, args=[allocation_ids])
