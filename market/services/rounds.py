"""Round lifecycle outside clearing: open the next round, close bidding, finish the window."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from django.db import IntegrityError, transaction
from django.db.models import Max

import audit.services as audit
from market.errors import MarketError
from market.models import Allocation, Bid, PolicyVersion, Round
from market.services._common import locked_briefly, now_or
from market.services.policy import policy_active, policy_shadow

SYSTEM = "system"
_EPOCH = datetime(2000, 1, 1, tzinfo=UTC)


def _grid_after(moment: datetime, length: timedelta) -> datetime:
    """The first window boundary strictly after ``moment``; boundaries are multiples of the
    round length counted from a fixed epoch, so 60-minute rounds start on the hour."""
    steps = (moment - _EPOCH) // length + 1
    return _EPOCH + steps * length


def next_window(*, policy: PolicyVersion, now: datetime) -> tuple[datetime, datetime, datetime]:
    """(closes_at, starts_at, ends_at) of the next round to open under ``policy``.

    The window starts on the first boundary whose bidding (closing ``lead_minutes`` before the
    start) is still ahead, never before the end of a window already auctioned (windows must not
    overlap, or the same GPUs would be sold twice), and leaves at least a quarter of a round
    for bidding, so a platform started a second before a boundary does not open a round that
    closes at once.
    """
    length = timedelta(minutes=policy.round_minutes)
    lead = timedelta(minutes=policy.lead_minutes)
    starts_at = _grid_after(now + lead, length)
    if starts_at - lead - now < length / 4:
        starts_at += length
    latest_end = Round.objects.aggregate(end=Max("ends_at"))["end"]
    if latest_end is not None and latest_end > starts_at:
        starts_at = latest_end
    return starts_at - lead, starts_at, starts_at + length


def _close_locked(rnd: Round, *, now: datetime) -> None:
    rnd.status = Round.Status.CLOSED
    rnd.save(update_fields=["status"])
    audit.record(
        actor=SYSTEM,
        action="round.close",
        target=rnd,
        before={"status": Round.Status.OPEN},
        after={
            "status": rnd.status,
            "bids": rnd.bids.filter(status=Bid.Status.OPEN).count(),
            "at": now.isoformat(),
        },
    )


@transaction.atomic
def round_open_next(*, now: datetime | None = None, wait: bool = True) -> Round:
    """Keep exactly one round open for bidding and return it.

    If the open round's bidding is still running it is returned; if it is overdue it is closed
    (the tick clears it) and the next one opened under the active policy, with the shadow
    version (if any) recorded for comparison. Safe to call from several processes at once.
    ``wait=False``: RoundBusy if another worker holds the open round (closing and clearing
    it) or is opening one for more than a moment (``locked_briefly``).
    """
    now = now_or(now)
    policy = policy_active()

    def locked():
        # Openers serialise on the active policy's row; the partial unique index on open
        # rounds backs that up at the database.
        PolicyVersion.objects.select_for_update().get(pk=policy.pk)
        return Round.objects.select_for_update().filter(status=Round.Status.OPEN).first()

    current = locked_briefly(locked, wait=wait, what="the open round")
    if current is not None:
        if current.closes_at > now:
            return current
        _close_locked(current, now=now)
    closes_at, starts_at, ends_at = next_window(policy=policy, now=now)
    try:
        with transaction.atomic():
            rnd = Round.objects.create(
                policy=policy,
                shadow_policy=policy_shadow(),
                status=Round.Status.OPEN,
                opens_at=now,
                closes_at=closes_at,
                starts_at=starts_at,
                ends_at=ends_at,
            )
    except IntegrityError as exc:
        raise MarketError("another process opened a round at the same moment; retry") from exc
    audit.record(
        actor=SYSTEM,
        action="round.open",
        target=rnd,
        after={
            "policy": policy.number,
            "shadow": rnd.shadow_policy.number if rnd.shadow_policy_id else None,
            "closes_at": closes_at.isoformat(),
            "starts_at": starts_at.isoformat(),
            "ends_at": ends_at.isoformat(),
        },
    )
    return rnd


@transaction.atomic
def round_close(*, round_id: int, now: datetime | None = None) -> Round:
    """End bidding for a round whose ``closes_at`` has passed. Idempotent."""
    now = now_or(now)
    rnd = Round.objects.select_for_update().get(pk=round_id)
    if rnd.status != Round.Status.OPEN:
        return rnd
    if rnd.closes_at > now:
        raise MarketError(
            f"bidding for round {rnd.pk} runs until {rnd.closes_at:%Y-%m-%d %H:%M:%S} UTC; "
            "it closes then, not before"
        )
    _close_locked(rnd, now=now)
    return rnd


@transaction.atomic
def round_finish(*, round_id: int, now: datetime | None = None) -> Round:
    """After a settled round's window ends, its running allocations are finished. Idempotent."""
    now = now_or(now)
    rnd = Round.objects.select_for_update().get(pk=round_id)
    if rnd.status != Round.Status.SETTLED or rnd.ends_at > now:
        return rnd
    finished = Allocation.objects.filter(
        round=rnd, status__in=[Allocation.Status.ACTIVE, Allocation.Status.PAUSED]
    ).update(status=Allocation.Status.FINISHED)
    rnd.status = Round.Status.FINISHED
    rnd.save(update_fields=["status"])
    audit.record(
        actor=SYSTEM,
        action="round.finish",
        target=rnd,
        before={"status": Round.Status.SETTLED},
        after={"status": rnd.status, "allocations_finished": finished},
    )
    return rnd
