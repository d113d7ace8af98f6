"""Allocation status after settlement: what is happening to the work, as the tenant sees it.

Settlement creates allocations ``active``; ``round_finish`` (rounds.py) makes the ``active`` and
``paused`` ones ``finished`` once the window is over; ``round_void`` revokes them. In between,
the enforcement loop (telemetry) moves them with the three services here:

    active  --allocations_pause-->   paused     (before the window ends)
    paused  --allocations_resume-->  active     (before the window ends)
    active | paused --allocations_preempt--> preempted   (at or after the window's end)

``finished``, ``revoked`` and ``preempted`` are final here: nothing in this module moves an
allocation out of them, so ``round_finish``, which only finishes ``active``/``paused`` ones,
leaves a preempted allocation preempted.

Lock order, the same as ``round_finish`` and ``round_void``: the allocations' round rows (pk
order), then the allocation rows (pk order).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime

from django.contrib.auth.models import AbstractBaseUser
from django.db import transaction

import audit.services as audit
from market.errors import MarketError
from market.models import Allocation, Round
from market.services._common import now_or

Status = Allocation.Status


@dataclass(frozen=True)
class _Move:
    verb: str  # the audit action is allocation.<verb>
    target: str
    sources: tuple[str, ...]
    ended: bool  # True: only at or after the window's end; False: only before it


_PAUSE = _Move("pause", Status.PAUSED, (Status.ACTIVE,), ended=False)
_RESUME = _Move("resume", Status.ACTIVE, (Status.PAUSED,), ended=False)
_PREEMPT = _Move("preempt", Status.PREEMPTED, (Status.ACTIVE, Status.PAUSED), ended=True)


def allocations_pause(
    *,
    allocation_ids: Iterable[int],
    reason: str,
    actor: AbstractBaseUser | str | None,
    now: datetime | None = None,
) -> list[Allocation]:
    """``active`` -> ``paused`` while the window runs (e.g. the tenant hit a hard spend cap).

    Returns the allocations changed; ones already paused are left alone and not audited.
    Refused (nothing written) if any allocation is preempted, finished, revoked or past its
    window's end.
    """
    return _status_set(
        move=_PAUSE, allocation_ids=allocation_ids, reason=reason, actor=actor, now=now
    )


def allocations_resume(
    *,
    allocation_ids: Iterable[int],
    reason: str,
    actor: AbstractBaseUser | str | None,
    now: datetime | None = None,
) -> list[Allocation]:
    """``paused`` -> ``active`` while the window runs. Returns the allocations changed; ones
    already active are left alone. Refused if any is preempted, finished, revoked or ended."""
    return _status_set(
        move=_RESUME, allocation_ids=allocation_ids, reason=reason, actor=actor, now=now
    )


def allocations_preempt(
    *,
    allocation_ids: Iterable[int],
    reason: str,
    actor: AbstractBaseUser | str | None,
    now: datetime | None = None,
) -> list[Allocation]:
    """``active``/``paused`` -> ``preempted`` once the window has ended and its work had to be
    stopped. Returns the allocations changed; ones already preempted are left alone. Refused
    if any is finished or revoked, or its window has not ended yet."""
    return _status_set(
        move=_PREEMPT, allocation_ids=allocation_ids, reason=reason, actor=actor, now=now
    )


def _ids(allocation_ids: Iterable[int]) -> list[int]:
    ids = list(allocation_ids)
    for value in ids:
        if isinstance(value, bool) or not isinstance(value, int):
            raise MarketError(f"allocation ids must be whole numbers, got {value!r}")
    return sorted(set(ids))


@transaction.atomic
def _status_set(
    *,
    move: _Move,
    allocation_ids: Iterable[int],
    reason: str,
    actor: AbstractBaseUser | str | None,
    now: datetime | None,
) -> list[Allocation]:
    now = now_or(now)
    reason = (reason or "").strip()
    if not reason:
        raise MarketError(f"say why the allocations are to {move.verb}; the reason is audited")
    ids = _ids(allocation_ids)
    if not ids:
        return []
    round_ids = set(Allocation.objects.filter(pk__in=ids).values_list("round_id", flat=True))
    list(Round.objects.select_for_update().filter(pk__in=round_ids).order_by("pk").values("pk"))
    allocations = list(
        Allocation.objects.select_for_update(of=("self",))
        .filter(pk__in=ids)
        .select_related("tenant")
        .order_by("pk")
    )
    missing = sorted(set(ids) - {a.pk for a in allocations})
    if missing:
        raise MarketError(f"no allocation {', '.join(map(str, missing))}; check the ids")
    changing = [a for a in allocations if a.status != move.target]
    for allocation in changing:
        _check(move, allocation, now=now)
    if not changing:
        return []
    Allocation.objects.filter(pk__in=[a.pk for a in changing]).update(status=move.target)
    for allocation in changing:
        before = allocation.status
        allocation.status = move.target
        audit.record(
            actor=actor,
            action=f"allocation.{move.verb}",
            target=allocation,
            tenant=allocation.tenant,
            before={"status": before},
            after={"status": move.target, "reason": reason[:300], "at": now.isoformat()},
        )
    return changing


def _check(move: _Move, allocation: Allocation, *, now: datetime) -> None:
    if allocation.status not in move.sources:
        allowed = " or ".join(move.sources)
        raise MarketError(
            f"allocation {allocation.pk} is {allocation.status}; only {allowed} allocations "
            f"can be {move.target}"
        )
    ended = allocation.ends_at <= now
    if move.ended and not ended:
        raise MarketError(
            f"allocation {allocation.pk} runs until {allocation.ends_at:%Y-%m-%d %H:%M:%S} UTC; "
            "it can be preempted only once its window has ended"
        )
    if not move.ended and ended:
        raise MarketError(
            f"allocation {allocation.pk} ended at {allocation.ends_at:%Y-%m-%d %H:%M:%S} UTC; "
            f"an ended allocation is preempted or finished, not {move.target}"
        )
