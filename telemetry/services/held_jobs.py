"""Slurm jobs of standing orders that were requeued and held when their order lost a round.

Such a job has no processes, so no sample shows it and the per-process rules
(telemetry/services/verdicts.py) never see it again. This read finds, set-based, the held
jobs whose order now has a live allocation (to release) or has ended (to cancel); the
enforcement loop issues the directives. Reads only.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from django.db.models import F, Max, Q

from market.models import Allocation, Order
from telemetry.models import EnforcementAction
from telemetry.services.verdicts import RUN, Verdict

Action = EnforcementAction.Action
State = EnforcementAction.State


@dataclass(frozen=True)
class HeldJob:
    # The suspend that requeued and held the job: the new directive names its node, GPU, pid
    # and Slurm job.
    suspend: EnforcementAction
    action: str  # Action.RESUME or Action.TERMINATE
    verdict: Verdict


def held_jobs(
    *, now: datetime, retry_after: timedelta, observed: set[tuple[int, str]]
) -> list[HeldJob]:
    """The held jobs to release or cancel now.

    A job (node, Slurm job) is held when a suspend of it was carried out and nothing but
    failed directives came after it; one that failed is retried after ``retry_after``. A
    job seen in a fresh sample (``observed``: {(node id, job)}) runs, and is left to the
    per-process rules.
    """
    groups = (
        EnforcementAction.objects.filter(node__healthy=True, node__revoked_at__isnull=True)
        .exclude(slurm_job="")
        .values("node_id", "slurm_job")
        .annotate(
            last=Max("id"),
            held=Max("id", filter=Q(action=Action.SUSPEND, state=State.ACKNOWLEDGED)),
            settled=Max("id", filter=~Q(state=State.FAILED)),
        )
        .filter(held__isnull=False, settled=F("held"))
        .values_list("node_id", "slurm_job", "held", "last")
    )
    held: dict[int, int] = {}  # suspend id -> id of the latest directive about the job
    for node_id, job, suspend_id, last_id in groups:
        if (node_id, job) not in observed:
            held[suspend_id] = last_id
    # Only a failed release or cancel waits to be retried: a failed suspend after the one
    # carried out (another process of the same job) changes nothing.
    failed = {
        a.pk: a.acknowledged_at
        for a in EnforcementAction.objects.filter(
            pk__in=[last for suspend, last in held.items() if last != suspend],
            action__in=(Action.RESUME, Action.TERMINATE),
        )
    }
    due = [
        suspend
        for suspend, last in held.items()
        if last not in failed or failed[last] is None or now - failed[last] >= retry_after
    ]
    suspends = list(
        EnforcementAction.objects.filter(pk__in=due, allocation__bid__order__isnull=False)
        .select_related("node", "gpu", "allocation__tenant", "allocation__bid__order")
        .order_by("pk")
    )
    live: dict[int, list[Allocation]] = {}
    for allocation in (
        Allocation.objects.filter(
            bid__order_id__in={s.allocation.bid.order_id for s in suspends},
            status=Allocation.Status.ACTIVE,
            starts_at__lte=now,
            ends_at__gt=now,
        )
        .select_related("tenant", "bid")
        .order_by("pk")
    ):
        live.setdefault(allocation.bid.order_id, []).append(allocation)
    found = []
    for suspend in suspends:
        found.extend(_held_job(suspend, live.get(suspend.allocation.bid.order_id, [])))
    return found


def _held_job(suspend: EnforcementAction, live: list[Allocation]) -> list[HeldJob]:
    allocation = suspend.allocation
    assert allocation is not None
    order, job = allocation.bid.order, suspend.slurm_job
    if live:
        # Its GPU's tier first: that is where the job ran.
        won = min(live, key=lambda a: (a.tier_id != suspend.gpu.tier_id, a.pk))
        reason = (
            f"order {order.pk} won allocation {won.pk} (until {won.ends_at:%H:%M:%S} UTC); "
            f"Slurm job {job}, requeued and held when the order lost, is released"
        )
        return [HeldJob(suspend, Action.RESUME, Verdict(RUN, reason, won, won.tenant))]
    if order.status in Order.LIVE:
        return []  # still out: it stays held until the order wins
    reason = (
        f"order {order.pk} is {order.status}"
        f"{': ' + order.status_reason if order.status_reason else ''}; Slurm job {job}, held "
        "since the order lost, is cancelled"
    )
    return [
        HeldJob(
            suspend,
            Action.TERMINATE,
            Verdict(Action.TERMINATE, reason, allocation, allocation.tenant),
        )
    ]
