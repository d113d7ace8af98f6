"""Idle reclaim, telemetry's half: which won GPUs sit idle (market/services/reclaim.py holds
the policy and does the notice, the reclaim and the refund).

A placed GPU of an active allocation is idle when every sample of it over the tier's
``idle_minutes`` (raw samples and their minute rollups) stays below ``below_pct``, and the
samples cover that whole span (a node that stopped reporting proves nothing). A GPU is never
noticed or reclaimed while its work is checkpointing or stopped by the platform: an
enforcement directive about it is pending, a suspend or terminate on it is within its grace,
or the latest directive about a process on it stopped that process. A noticed GPU that is
busy again, or no longer eligible, is withdrawn; one still idle when its grace runs out is
reclaimed.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from django.conf import settings
from django.db.models import Max, Min
from django.utils import timezone

from market.models import Allocation, Reclaim
from market.services.policy import policy_active
from market.services.reclaim import (
    idle_policies,
    reclaim_execute,
    reclaim_notice,
    reclaim_withdraw,
)
from market.spare import IdlePolicy
from telemetry.models import EnforcementAction, ProcessObservation, Sample, SampleMinute

logger = logging.getLogger(__name__)

Action = EnforcementAction.Action


@dataclass
class IdleReport:
    noticed: list[int] = field(default_factory=list)  # reclaim ids
    reclaimed: list[int] = field(default_factory=list)
    withdrawn: list[int] = field(default_factory=list)


def _usage(uuids: set[str], *, since: datetime) -> dict[str, tuple[float, datetime, datetime]]:
    """{GPU uuid: (peak utilisation %, first and last evidence)} since ``since``."""
    out: dict[str, tuple[float, datetime, datetime]] = {}
    raw = (
        Sample.objects.filter(gpu__uuid__in=uuids, at__gte=since)
        .values("gpu__uuid")
        .annotate(peak=Max("utilization_pct"), first=Min("at"), last=Max("at"))
    )
    minutes = (
        SampleMinute.objects.filter(gpu__uuid__in=uuids, minute__gte=since)
        .values("gpu__uuid")
        .annotate(peak=Max("utilization_max"), first=Min("minute"), last=Max("minute"))
    )
    for row in [*raw, *minutes]:
        uuid = row["gpu__uuid"]
        if uuid in out:
            peak, first, last = out[uuid]
            out[uuid] = (max(peak, row["peak"]), min(first, row["first"]), max(last, row["last"]))
        else:
            out[uuid] = (row["peak"], row["first"], row["last"])
    return out


def _platform_holds(uuids: set[str], *, now: datetime) -> set[str]:
    """GPUs whose work is checkpointing or stopped by the platform."""
    held: set[str] = set()
    actions = EnforcementAction.objects.filter(gpu__uuid__in=uuids)
    held |= set(
        actions.filter(state__in=EnforcementAction.PENDING_STATES).values_list(
            "gpu__uuid", flat=True
        )
    )
    grace = timedelta(seconds=settings.GPUMARKET_PREEMPT_GRACE_SECONDS)
    held |= set(
        actions.filter(
            action__in=(Action.SUSPEND, Action.TERMINATE), created_at__gt=now - grace
        ).values_list("gpu__uuid", flat=True)
    )
    observed = list(
        ProcessObservation.objects.filter(gpu__uuid__in=uuids).values_list(
            "node_id", "pid", "gpu__uuid"
        )
    )
    if observed:
        last_ids = (
            EnforcementAction.objects.filter(
                node_id__in={n for n, _, _ in observed}, pid__in={p for _, p, _ in observed}
            )
            .values("node_id", "pid")
            .annotate(last=Max("id"))
            .values_list("last", flat=True)
        )
        stopped = {
            (a.node_id, a.pid)
            for a in EnforcementAction.objects.filter(pk__in=list(last_ids))
            if a.action in (Action.PAUSE, Action.SUSPEND)
        }
        held |= {uuid for node, pid, uuid in observed if (node, pid) in stopped}
    return held


def idle_reclaim_scan(*, now: datetime | None = None) -> IdleReport:
    """One pass: notice GPUs idle for their tier's span, withdraw noticed ones that are busy
    again, reclaim noticed ones still idle after the grace. Each step is the market service's
    own transaction, so one refusal does not undo the others."""
    now = now or timezone.now()
    report = IdleReport()
    policies = idle_policies(policy_active())
    if not policies:
        return report
    stale = timedelta(seconds=settings.GPUMARKET_NODE_STALE_SECONDS)
    for slug, policy in sorted(policies.items()):
        _tier_scan(slug=slug, policy=policy, now=now, stale=stale, report=report)
    return report


def _idle(
    usage: dict[str, tuple[float, datetime, datetime]],
    uuid: str,
    *,
    policy: IdlePolicy,
    since: datetime,
    now: datetime,
    stale: timedelta,
) -> bool:
    if uuid not in usage:
        return False
    peak, first, last = usage[uuid]
    # A minute rollup is stamped with its minute's start: evidence from the first minute counts.
    covered = first <= since + timedelta(minutes=1) and last >= now - stale
    return covered and peak < policy.below_pct


def _tier_scan(
    *, slug: str, policy: IdlePolicy, now: datetime, stale: timedelta, report: IdleReport
) -> None:
    since = now - policy.idle
    running = list(
        Allocation.objects.filter(
            tier__slug=slug,
            status=Allocation.Status.ACTIVE,
            starts_at__lte=since,
            ends_at__gt=now,
        )
        .exclude(placement=[])
        .order_by("pk")
    )
    open_reclaims = {
        (r.allocation_id, r.gpu_uuid): r
        for r in Reclaim.objects.filter(tier__slug=slug, status__in=Reclaim.OPEN)
    }
    noticed = [r for r in open_reclaims.values() if r.status == Reclaim.Status.NOTICED]
    uuids = {g["uuid"] for a in running for g in a.placement} | {r.gpu_uuid for r in noticed}
    if not uuids:
        return
    usage = _usage(uuids, since=since)
    held = _platform_holds(uuids, now=now)
    for reclaim in noticed:
        # Idle over the whole span since it was first seen idle, not only the latest minutes.
        busy = not _idle(
            _usage({reclaim.gpu_uuid}, since=reclaim.idle_since),
            reclaim.gpu_uuid,
            policy=policy,
            since=reclaim.idle_since,
            now=now,
            stale=stale,
        )
        if busy or reclaim.gpu_uuid in held:
            why = (
                "work came back" if busy else "its work is checkpointing or stopped by the platform"
            )
            reclaim_withdraw(reclaim_id=reclaim.pk, reason=why, now=now)
            report.withdrawn.append(reclaim.pk)
        elif now >= reclaim.reclaim_after:
            done = reclaim_execute(reclaim_id=reclaim.pk, policy=policy, now=now)
            if done.status == Reclaim.Status.RECLAIMED:
                report.reclaimed.append(done.pk)
    for allocation in running:
        for gpu in allocation.placement:
            uuid = gpu["uuid"]
            if (allocation.pk, uuid) in open_reclaims or uuid in held:
                continue
            if not _idle(usage, uuid, policy=policy, since=since, now=now, stale=stale):
                continue
            created = reclaim_notice(
                allocation_id=allocation.pk, gpu_uuid=uuid, idle_since=since, policy=policy, now=now
            )
            if created is not None:
                report.noticed.append(created.pk)
